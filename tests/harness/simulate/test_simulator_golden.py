"""The simulator's output files, byte for byte, against digests made by the code
before it was made faster (decode runs): speed must change nothing a user sees.

Each case simulates a small schedule through :func:`harness.simulate.driver.run_simulations`
(what ``schedscope simulate`` calls) and compares the SHA-256 (its first 48 hex
digits) of every file it writes (``requests.parquet``, ``decisions.parquet``,
``steps.parquet``, ``summary.json``, per policy and combined) with the digests below.
The cases cover the default profile under fcfs, sjf and priority, lpm under recompute
preemption (its re-hits ranked), starvation with aging and a max-wait bound, swap and
recompute preemption on a small KV pool (and the recompute case with prefix caching off:
the outputs are byte-identical run to run with it on or off), static batching, whole
prefills, a closed loop, and a run without decisions.

A deliberate change of simulated results (a scheduler or cost-model change) changes
these digests; regenerate them with
``PYTHONPATH=$PWD python tests/harness/simulate/test_simulator_golden.py`` and say why
in the commit. A speed-up must never need that.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.core.cost_model import CostModel
from harness.profiles import resolve_profile
from harness.serve.knobs import build_engine_config
from harness.simulate.driver import run_simulations

#: name -> (profile, policies, engine knobs, num_requests or None, duration scale)
CASES: dict[str, tuple[str, tuple[str, ...], dict, int | None, float]] = {
    "mixed-all": ("mixed", ("fcfs", "sjf", "priority"), {}, 1500, 1.0),
    "mixed-burst": ("mixed", ("fcfs",), {}, None, 0.25),
    "starvation-sjf-aging": ("starvation", ("sjf",), {"aging_rate": 100.0}, 900, 1.0),
    "starvation-maxwait": (
        "starvation",
        ("sjf", "priority"),
        {"max_wait_s": 2.0},
        900,
        1.0,
    ),
    "swap-auto": (
        "swap_pressure",
        ("fcfs", "sjf", "priority"),
        {"num_gpu_blocks_override": 384, "swap_space": 0.004},
        120,
        1.0,
    ),
    "swap-swap": (
        "swap_pressure",
        ("fcfs",),
        {"num_gpu_blocks_override": 384, "swap_space": 0.004, "preemption_mode": "swap"},
        100,
        1.0,
    ),
    "swap-recompute-uncached": (
        "swap_pressure",
        ("priority",),
        {
            "num_gpu_blocks_override": 300,
            "preemption_mode": "recompute",
            "enable_prefix_caching": False,
        },
        100,
        1.0,
    ),
    "swap-recompute": (
        "swap_pressure",
        ("priority",),
        {"num_gpu_blocks_override": 300, "preemption_mode": "recompute"},
        100,
        1.0,
    ),
    "swap-recompute-lpm": (
        "swap_pressure",
        ("lpm",),
        {"num_gpu_blocks_override": 300, "preemption_mode": "recompute"},
        100,
        1.0,
    ),
    "static": ("mixed", ("fcfs",), {"batching": "static", "max_num_seqs": 32}, 400, 1.0),
    "whole-prefill": (
        "mixed",
        ("sjf",),
        {"enable_chunked_prefill": False, "max_num_seqs": 64},
        600,
        1.0,
    ),
    "closed-loop": ("default_py_example", ("priority",), {"max_waiting": 6}, None, 0.5),
}

#: Hex digits of each SHA-256 kept (192 bits: a collision is out of the question).
DIGITS = 48

#: Made by the simulator before its decode-run speed-up (main at 8788008); summary.json
#: regenerated when the knobs recorded in it gained --enforce-eager; decisions.parquet
#: when it gained the lpm_cached_tokens column (each file written without the column was
#: byte-identical to its digest before), and swap-recompute-lpm made with the lpm policy;
#: requests.parquet when it gained the phase, session_id and turn columns (every value of
#: the columns before unchanged); summary.json again when the knobs recorded in it gained
#: max_num_queued_reqs and max_num_queued_tokens (every other file byte-identical).
GOLDEN: dict[str, dict[str, str]] = {
    "swap-recompute-uncached": {
        "decisions.parquet": "4e2ef4066357011cb2c5d97575dc34c87f02a073d2d28a3b",
        "requests.parquet": "58228a401c9ccb38b2889d372f2b7d613c517883bdb54bd4",
        "steps.parquet": "bcd24a9831edf3033b1c20dee08aeab0a26cc268fa3f121c",
        "summary.json": "136b01b65cdecbc46daeff4514ec58d7089aec3e95991de2",
    },
    "closed-loop": {
        "decisions.parquet": "f401cde4ba6dcaa8e240ea88219092b5feb14d04c3d38b48",
        "requests.parquet": "40d05e3bf623ac25b058a3060fccb1e3fd907b0c592d59e2",
        "steps.parquet": "f1bdd2fe78d053b0461f66aa91ddfb37a4bac136d6658fcb",
        "summary.json": "1a7499d635e266dd12cb294b3ca41ba7f663dd47fa5ff9c5",
    },
    "mixed-all": {
        "fcfs/decisions.parquet": "e5b8b801f2d68dbaa6d992773a2478ca213e8000945065af",
        "fcfs/requests.parquet": "7385b9bf7becedd5e2bfa4fbb671cba895d6d3322d8aa551",
        "fcfs/steps.parquet": "52116ae3225685908423fa191d6e69a6db5142d9a31da135",
        "fcfs/summary.json": "68cb2fe35dda7078647445cdccf9fc1214fd079917c3df86",
        "priority/decisions.parquet": "ad49da67b401ccabc46cbe22ea3bee5f3e749e28d6d02806",
        "priority/requests.parquet": "0ea805ee1a8dec62090043ea29414e5f49a91610f919d88a",
        "priority/steps.parquet": "1a1347733f970f5789baded59e24d41cb663de77f5adb395",
        "priority/summary.json": "85524421febb4b21937d21b8f40485c7d260983487b72e0b",
        "sjf/decisions.parquet": "194ccc3e4d416c41e759923569d7d8a882ccf8cec490d9f4",
        "sjf/requests.parquet": "96a7587675fd49cbe97f9f3ed05f978b3123703e144b7655",
        "sjf/steps.parquet": "173229303a96413099b69dc4b3ef118138673e65c205997f",
        "sjf/summary.json": "620261b644942f80dad193e0e03ec664aeb5fa011719293e",
        "summary.json": "0362f4847127545d580be94a44ba548460a979eb7d6a202d",
    },
    "mixed-burst": {
        "requests.parquet": "ba67c62a8ef9cd95edd1a894078850a0e334a578c39f8998",
        "steps.parquet": "526e7ae68eaf0ead05c34ce19e1c2dff072f495b4264282f",
        "summary.json": "d11b39ec573b9570f6691c99d27183cf6913c623e530cbde",
    },
    "starvation-maxwait": {
        "priority/decisions.parquet": "ecfe27fe919bbabbaaa28ba9a3d2e94350b886831a127fa5",
        "priority/requests.parquet": "5fbb433fe5aebdb896506b5a6804b736c31ba126ec712197",
        "priority/steps.parquet": "837b115b30c5b07c00aa78eedd13c3bb7ddf785b4a894703",
        "priority/summary.json": "03a6e1513649acb85ff50106a71ff62a413fa4d4f39ef890",
        "sjf/decisions.parquet": "76d2776b27b890215570b8e618db2a94c0b04d5c8a5e255a",
        "sjf/requests.parquet": "35a0eb601793ddc22d68db5ab86be7415b9617002b81819f",
        "sjf/steps.parquet": "24741f9234fa714830118c390d74699249146bb14c3b7d15",
        "sjf/summary.json": "de762376af8c7cd56993112557005bc9aa0ea275553e64e2",
        "summary.json": "1ca40d3846ef527ba93b3351eae3ff72e1c8bfdee6cadace",
    },
    "starvation-sjf-aging": {
        "decisions.parquet": "262ec0cfe17ee5d311980feba902a82f1d4ce106a9841b77",
        "requests.parquet": "756e1a2bd22937dffcdc4ec97ba3cf251c60bff7bd1945fb",
        "steps.parquet": "2d0ad9ce1722b9a4ad200cb494f3f7096b5085e3e7103884",
        "summary.json": "59489d6abfeda1209af0f85809095242ba9b0a852da4a1e3",
    },
    "static": {
        "decisions.parquet": "7b5bb9ca0f40c60213fa55d0e7175492efb6cfcccdb0f8b3",
        "requests.parquet": "337a78d91557c99aaa12a3931e3f13060ab74bf9daa0f9f0",
        "steps.parquet": "533d9a4cdb055df7bf1a9163d631d2c05a72a66806661fb7",
        "summary.json": "e7127633acadd8b369d1601ced6d6d716da3de98e9ed9c88",
    },
    "swap-auto": {
        "fcfs/decisions.parquet": "b5bb669979c1023708a223baed0deb91817462d9ccca66b4",
        "fcfs/requests.parquet": "3570b9ee27274de35a6e289800729541c623e1c752df00dd",
        "fcfs/steps.parquet": "b71a386416b16b9f63d9047677cca4a52493b59e4c26bcd0",
        "fcfs/summary.json": "e0f2ceb4bbd5346144941e18c475150040897e48418e246e",
        "priority/decisions.parquet": "09b7af1e1eb8171ce744ff5350033cccdb4095e07d811a6e",
        "priority/requests.parquet": "eee224836570b729040dcb89665f963ca551a498bd79b4ca",
        "priority/steps.parquet": "334a712dfb7852873f452defd530793ed19d372bdefac059",
        "priority/summary.json": "e209917833b121c2191d32989fdbaaaabb588e29ea9ccc8a",
        "sjf/decisions.parquet": "308cfb7b5929bb55e195d77959bf11db88ec785c8a349fdb",
        "sjf/requests.parquet": "28e538b0a0a2e6db68fd5abacf5bfa3122d92540b18c8efe",
        "sjf/steps.parquet": "3fb11891db1a58fe67c35e27b414dfe2f36c7c1549df5066",
        "sjf/summary.json": "0149dec573a0ffca1f0c0ae0c2ea21db9c8a86c2b1574e87",
        "summary.json": "f0b88841052939f85baa3607c953bf167336546a02616afd",
    },
    "swap-recompute": {
        "decisions.parquet": "2b31a022c0644ba154041f248ca6706c4ca43a6a07945688",
        "requests.parquet": "7fffd4ef14cf503a0e4d291e68798674aea2470f18023624",
        "steps.parquet": "2bcc4cebe86595f041fb69673d24c67a751b2c8943f30f5c",
        "summary.json": "524238f8f1dd545b6ee9702efcaf42ce2f2a6432d075920c",
    },
    "swap-recompute-lpm": {
        "decisions.parquet": "43ac8a1b1b2a4b01273b34dfd35d648562eb51cd5d15ea2c",
        "requests.parquet": "5e3e3ceab7ce4576e1431d0f3135eb3222dd6c9d63defc7f",
        "steps.parquet": "ab3ef489e876be954a2b614d57518f6ed46c49b445f10d37",
        "summary.json": "10213159d041d811c35b0334094e2f6d72986f2256c360d5",
    },
    "swap-swap": {
        "decisions.parquet": "f3d918c4c6ba35052c5e665eeb5d78b22e5e546e0b07eda8",
        "requests.parquet": "625caa04d0b5b1a6a5a7dbbb82170f888030f6d75762c593",
        "steps.parquet": "d4423163b284a0945ade78770aaf6d34344d13b1e29ba2d4",
        "summary.json": "7f3dea59fa9e25d113ae1ab00c22119828592a989b0ab0be",
    },
    "whole-prefill": {
        "decisions.parquet": "fd36575fb5a8cbd7c8000f8935455e5f7cfc6dccb99d45a0",
        "requests.parquet": "1dbeae3f3faebd0ace1520d85fe7ec381ddbeb8bdfea2beb",
        "steps.parquet": "9fb53b3ea699b0990136ebfce48e702fd8873972833ee6dd",
        "summary.json": "4288b980bc027119cf9c6cb2d4166028c753ca758dab8633",
    },
}


def simulate_case(name: str, out: Path) -> dict[str, str]:
    """Run case ``name`` into ``out``; the SHA-256 of every file written, by path."""
    profile_name, policies, knobs, num_requests, duration_scale = CASES[name]
    profile = resolve_profile(profile_name)
    if duration_scale != 1.0:
        profile = profile.with_duration_scale(duration_scale)
    configs = {p: build_engine_config({**knobs, "scheduling_policy": p}) for p in policies}
    run_simulations(
        profile,
        configs,
        CostModel(),
        out,
        seed=7,
        num_requests=num_requests,
        write_decisions=name != "mixed-burst",
    )
    return {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()[:DIGITS]
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_files_are_byte_identical_to_the_golden_digests(name, tmp_path):
    assert simulate_case(name, tmp_path / name) == GOLDEN[name]


if __name__ == "__main__":  # regenerate GOLDEN (see the module docstring)
    import pprint
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pprint.pprint({n: simulate_case(n, Path(tmp) / n) for n in CASES}, width=100)
