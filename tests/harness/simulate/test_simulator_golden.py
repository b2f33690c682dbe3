"""The simulator's output files, value for value, against digests made by the code
before it was made faster (decode runs): speed must change nothing a user sees.

Each case simulates a small schedule through :func:`harness.simulate.driver.run_simulations`
(what ``schedscope simulate`` calls) and compares the SHA-256 (its first 48 hex
digits) of what every file it writes says (a parquet file's schema and rows, read back;
its bytes depend on the Polars version that wrote it: Polars 2 writes other bytes for
the same frame) (``requests.parquet``, ``decisions.parquet``,
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

import polars as pl
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
#: Then made digests of content, not bytes (:func:`content_digest`), from the files main
#: at c2b3f42 wrote (those files had matched the byte digests; Polars 1.44 and 2.2 read
#: them to the same digests, and write the same content). decisions.parquet of the two
#: recompute cases with caching regenerated when evicted contents' serials became
#: fillable again: num_evicted_prefix_tokens counts through chains that follow an
#: evicted content (7 decisions count 1-2 blocks more; every other column and file equal).
#: swap-auto's sjf decisions.parquet when a ghost replaced by a chain of the same head
#: stopped being counted twice (the ghosts had shrunk early: 3 recompute decisions now
#: count 1,264-1,664 evicted tokens where they counted none; every other value equal).
GOLDEN: dict[str, dict[str, str]] = {
    "closed-loop": {
        "decisions.parquet": "30f2d2a8836943442b461573878fad506a1286e240bff81d",
        "requests.parquet": "1377b33740ee010349c5911783639119fc91d3d99f1766f8",
        "steps.parquet": "3274e680f44c492fc84c4db91c14b2dd2955e9e8dd3dae2f",
        "summary.json": "1a7499d635e266dd12cb294b3ca41ba7f663dd47fa5ff9c5",
    },
    "mixed-all": {
        "fcfs/decisions.parquet": "0b5aef265f642e44ef89fc22a490d5e3791253bbbb340528",
        "fcfs/requests.parquet": "be0fff35b36e92a43bfb57f54b02eb1762be98d19a5e3b63",
        "fcfs/steps.parquet": "835b6d111c88e726b2520c6f4e0eab8f4abe1c54f6428b28",
        "fcfs/summary.json": "68cb2fe35dda7078647445cdccf9fc1214fd079917c3df86",
        "priority/decisions.parquet": "68d274c3d23f87c19bd56784c9596ca2a11806cd671bf2a1",
        "priority/requests.parquet": "c451206fbe0adcb8482a8bc4ce56eb7784237142a37e3472",
        "priority/steps.parquet": "d23c85bcec952fc827c74c54f00442c92c6c89e3bdaf3cbd",
        "priority/summary.json": "85524421febb4b21937d21b8f40485c7d260983487b72e0b",
        "sjf/decisions.parquet": "9c99b35fb62630ab25de02435abb72c93cc423c54376b03b",
        "sjf/requests.parquet": "65c739907306df731b140b9c3536e22482b0a42dd22c6506",
        "sjf/steps.parquet": "9dcc7b7d049fa1f25f3d1bb3472e57976c3436ca62899e4b",
        "sjf/summary.json": "620261b644942f80dad193e0e03ec664aeb5fa011719293e",
        "summary.json": "0362f4847127545d580be94a44ba548460a979eb7d6a202d",
    },
    "mixed-burst": {
        "requests.parquet": "85988edeb19ccc374e0d12978c75b472666d8f9bd23d94ab",
        "steps.parquet": "d0e52d9c7c04c9d258b7f1788b41df4dcccc30a868719c59",
        "summary.json": "d11b39ec573b9570f6691c99d27183cf6913c623e530cbde",
    },
    "starvation-maxwait": {
        "priority/decisions.parquet": "2978aa115e906def273b3183085fae94d90eb6b53012151f",
        "priority/requests.parquet": "d1af8631d303fb72a4d33971a2790e79b0096c0e06b773a1",
        "priority/steps.parquet": "54bfa135ecbc8b7d0399ccb5271459d5f2f105d57d6dfb0d",
        "priority/summary.json": "03a6e1513649acb85ff50106a71ff62a413fa4d4f39ef890",
        "sjf/decisions.parquet": "aa27edc665310cfc968def2b6d52546b50d791e21ee10791",
        "sjf/requests.parquet": "0f279feab8c15b0511ed0d31b186f811894f578a0873205e",
        "sjf/steps.parquet": "e02391b52deb12aa9772c6bd658b24f22e4649afe0ad33a5",
        "sjf/summary.json": "de762376af8c7cd56993112557005bc9aa0ea275553e64e2",
        "summary.json": "1ca40d3846ef527ba93b3351eae3ff72e1c8bfdee6cadace",
    },
    "starvation-sjf-aging": {
        "decisions.parquet": "f4e5558bdec2cd29543a6a1febd9d6bb499e7ada88d154f1",
        "requests.parquet": "41a736c03fc3c4d586f097c191bc608cd4301c8f143a3102",
        "steps.parquet": "1b24516cd7d08025590a6dc313097579287a639a75edf456",
        "summary.json": "59489d6abfeda1209af0f85809095242ba9b0a852da4a1e3",
    },
    "static": {
        "decisions.parquet": "cf8bcca010514094bf01c41d5f5c6d7fe90cad8c92220269",
        "requests.parquet": "b8689cf1769bbad064f0987be2b0a496656847078625f178",
        "steps.parquet": "20de16b73dd8598d7de34969a6b156a1966e4d1baab71138",
        "summary.json": "e7127633acadd8b369d1601ced6d6d716da3de98e9ed9c88",
    },
    "swap-auto": {
        "fcfs/decisions.parquet": "92231cd69c225ec18498e763ba40dffc2ab954c267eec5e2",
        "fcfs/requests.parquet": "9be45bbd4e196fd2b682b6f8cb643f5d2a284d4bcea240bf",
        "fcfs/steps.parquet": "afc0df122e2c37329c5970e7378885a22e9fafc94b0506b4",
        "fcfs/summary.json": "e0f2ceb4bbd5346144941e18c475150040897e48418e246e",
        "priority/decisions.parquet": "e5aa9f2233c0fad7e424060583a57473d4239ddc9d6f03c6",
        "priority/requests.parquet": "03bb056acd26a450c9452ff2d8ff6dab146ad459e6287905",
        "priority/steps.parquet": "8425fb83187c888f448647e70a1cba2a0964c40274aaa3a9",
        "priority/summary.json": "e209917833b121c2191d32989fdbaaaabb588e29ea9ccc8a",
        "sjf/decisions.parquet": "78c690156cc9716f3c83926d32e21796c429870b0ac59ed6",
        "sjf/requests.parquet": "976944fa4d233011593cf5926efe24e1debae4a9facfd40f",
        "sjf/steps.parquet": "ced974683dd7aa67396082e2eefecea5785d2702966f148c",
        "sjf/summary.json": "0149dec573a0ffca1f0c0ae0c2ea21db9c8a86c2b1574e87",
        "summary.json": "f0b88841052939f85baa3607c953bf167336546a02616afd",
    },
    "swap-recompute": {
        "decisions.parquet": "2b144cd83a9e6e0721918cb27a4501eab5d764c01e66078a",
        "requests.parquet": "cc2b030abeea62b5cec9efdd72b45be8f401805d7eb422c6",
        "steps.parquet": "b1f01b9cf45d90681b3f13a9e0581d6516437a841039e4df",
        "summary.json": "524238f8f1dd545b6ee9702efcaf42ce2f2a6432d075920c",
    },
    "swap-recompute-lpm": {
        "decisions.parquet": "d6d82ddf575a34968237da85fddb542e11de6ef26fec046e",
        "requests.parquet": "0f0754d7693e6ec8dcfdccf479a104ea5c0fd28683886b88",
        "steps.parquet": "953066d1e322427fb84d3b7050afa8bb33f8d80f051c19a9",
        "summary.json": "10213159d041d811c35b0334094e2f6d72986f2256c360d5",
    },
    "swap-recompute-uncached": {
        "decisions.parquet": "40f057ba793f21c5bd30f7b4ffb9096d526b3a1aeb65009b",
        "requests.parquet": "65ccfc7f3a8907624da038b0a323b22a4a5f4f342c21845a",
        "steps.parquet": "67719486e815b59f218b2f037911c98ab0d4744041396aec",
        "summary.json": "136b01b65cdecbc46daeff4514ec58d7089aec3e95991de2",
    },
    "swap-swap": {
        "decisions.parquet": "579c2c5a29b539e314baee89c8310f8d089cb00aa70ca967",
        "requests.parquet": "46b6c5cba7d1577e48ca5945efcd97c3e37b12b8b003a63a",
        "steps.parquet": "cd4c616f9e650cbdb3ba31bd3c3cb12e3c12df45b50b95c6",
        "summary.json": "7f3dea59fa9e25d113ae1ab00c22119828592a989b0ab0be",
    },
    "whole-prefill": {
        "decisions.parquet": "4d8f3e64bdab722dcbd5ba9e85d73bb6b5109c8010c3dd1b",
        "requests.parquet": "5d76751e32a8c935f3254975a9a99e7b5017598b0ff51993",
        "steps.parquet": "da54f9b1b93e5c2b7e197f7a713f4b3f3a2834e7607f7ae7",
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
        str(path.relative_to(out)): content_digest(path)
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def content_digest(path: Path) -> str:
    """The SHA-256 of what a file says: a parquet file's column names, types and every
    row's values (Python's repr of each), not its bytes, which change with the Polars
    version that wrote them (the page layout and the writer's name); other files' bytes."""
    if path.suffix != ".parquet":
        return hashlib.sha256(path.read_bytes()).hexdigest()[:DIGITS]
    frame = pl.read_parquet(path)
    digest = hashlib.sha256(repr([(n, str(t)) for n, t in frame.schema.items()]).encode())
    for row in frame.iter_rows():
        digest.update(repr(row).encode())
    return digest.hexdigest()[:DIGITS]


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_files_are_byte_identical_to_the_golden_digests(name, tmp_path):
    assert simulate_case(name, tmp_path / name) == GOLDEN[name]


if __name__ == "__main__":  # regenerate GOLDEN (see the module docstring)
    import pprint
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        pprint.pprint({n: simulate_case(n, Path(tmp) / n) for n in CASES}, width=100)
