"""The simulator's output files, byte for byte, against digests made by the code
before it was made faster (decode runs): speed must change nothing a user sees.

Each case simulates a small schedule through :func:`harness.simulate.driver.run_simulations`
(what ``schedscope simulate`` calls) and compares the SHA-256 (its first 48 hex
digits) of every file it writes (``requests.parquet``, ``decisions.parquet``,
``steps.parquet``, ``summary.json``, per policy and combined) with the digests below.
The cases cover the default profile under
every policy, starvation with aging and a max-wait bound, swap and recompute
preemption on a small KV pool, static batching, whole prefills, a closed loop, and a
run without decisions.

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
    "swap-recompute": (
        "swap_pressure",
        ("priority",),
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
#: regenerated when the knobs recorded in it gained --enforce-eager.
GOLDEN: dict[str, dict[str, str]] = {
    "closed-loop": {
        "decisions.parquet": "503a8c50301228dc9b1e434006cef518ea7cfc39f4840a35",
        "requests.parquet": "385a0f4a6be5265b4a2e529134c97c970395ae7aa7e27541",
        "steps.parquet": "961c57abdc77be63fc237c1ed608a74993a5ab14826324bf",
        "summary.json": "98ae6be2d903b2afedaf5064b559dd0a3b8c41e1dcec65c6",
    },
    "mixed-all": {
        "fcfs/decisions.parquet": "1292da5dee39be4a410f936a21b16cc696cef6285c19c058",
        "fcfs/requests.parquet": "8e2a619574a3e281f4e51e4a9cbac8e601cd2fc82cfefff8",
        "fcfs/steps.parquet": "db062f23ef75e4740c910ddc074e54f45575003ab9aa93f1",
        "fcfs/summary.json": "0c600e4622a7bf7ddf77a791f019603e4bde9e134c15c97b",
        "priority/decisions.parquet": "1304f835fe0488a5e80528cb8517b3718b463aa8678c1e96",
        "priority/requests.parquet": "a38a8fb2abc7a50273e0042835bbc9b2148f1fe6c8851fc6",
        "priority/steps.parquet": "b5ba06804624f77c2a97016f97e007bfe1e9624e75fe83f9",
        "priority/summary.json": "83bc8b2f1d97413f9c3a7c2bce77f8a1e90c15dada9fe8e4",
        "sjf/decisions.parquet": "39021c84e021f56dcd8360752b1e18a2369cccfee8592a1e",
        "sjf/requests.parquet": "f44a457d1c3035b6002c11f44cf0acdaf8ff3ea4e9206e40",
        "sjf/steps.parquet": "8a7da684ee48561791bed2929b6ec9b7f1269e14cc5cef3f",
        "sjf/summary.json": "752fd5a8b584cb3d2d8f5be9c03b4775613a460fc5c22914",
        "summary.json": "4c06a9166c8807d46fa2d6eb772e2bfebd05833b8b118450",
    },
    "mixed-burst": {
        "requests.parquet": "457c1887213a88551c858be7428082c23d611eab9341a10d",
        "steps.parquet": "5ccd6bb4820d5a4d37511d520b61cc18fc14bbef28b793bb",
        "summary.json": "14dfd3f0ba0ce3d19c99a262fb67730bd7f649165a5ec85d",
    },
    "starvation-maxwait": {
        "priority/decisions.parquet": "913cc0a95f1329ee741aa11e2ab090460a67d8b2ea10f36c",
        "priority/requests.parquet": "6b0f8eb5b4ac2886280e2fe68c4a3e318ff1556166326240",
        "priority/steps.parquet": "7deb0ffdaf955db5ecd1a392152c955f9d9fae7c4a7d3ad7",
        "priority/summary.json": "1f256bcb829dc93160e6c5aca300b783fdadc2ae7a1858d1",
        "sjf/decisions.parquet": "75dd13e5859f757bd759ee48253d90fd70e98b30c6d839c2",
        "sjf/requests.parquet": "197e195abf409233b78fce1445cc1fbb7283c4b5596545d3",
        "sjf/steps.parquet": "8dec801faa3f8e6219841c9fa8b14be1e3d392f285867223",
        "sjf/summary.json": "917811ff3a37aae09f27cd43880d28de02d816c78c813d6d",
        "summary.json": "7ec6f4c349e187336ddd74d8263591c1d547f02dd2c2f2f5",
    },
    "starvation-sjf-aging": {
        "decisions.parquet": "fa25b326f95d33d45c5380f685d9601a58bbb05d3d67184c",
        "requests.parquet": "c83223a9d0a8ea148a558c8f2cf48e36bbf50d92d8f3dac1",
        "steps.parquet": "3b5650f180b778f05bcf0b428cbfdf1f48a5fc1f6f88deb1",
        "summary.json": "93462a46106b8f4d2876eb3e7993cc856acf2cc3f9a374fb",
    },
    "static": {
        "decisions.parquet": "baf9cef233170937e665eaf42c712c779ca555bffebee183",
        "requests.parquet": "9d4c11681867ece3cca23d2827453eefbe073a7cb0d32955",
        "steps.parquet": "e76f086325d15afb15217fe5ec23eb58eabb34c46cc793e6",
        "summary.json": "153812ae2979a3183e509da3f90450451f102c78a96993b5",
    },
    "swap-auto": {
        "fcfs/decisions.parquet": "602ee423299c88934a49b8fede4a756a916f5a8cdc2a2ca5",
        "fcfs/requests.parquet": "2105066c0e50b411f7ff5636dc0d48137adad0973eee5dd2",
        "fcfs/steps.parquet": "d2126ffea06029fe2b4d56b2f2daadacfbf3e45798cef8aa",
        "fcfs/summary.json": "166628a8ac314bcba54308b00c411b6c4520c6096b072aa5",
        "priority/decisions.parquet": "9888d68106ec6ffd6ea82a726fafbbbde85845e9f5ba6a7b",
        "priority/requests.parquet": "35c498891e800369cd8b47269bddb595211e7fc0aca3995c",
        "priority/steps.parquet": "7a3f947c213dee5395dbbd3500b69cb1b8698710b89e6702",
        "priority/summary.json": "fe568a12f3c932915e2add506c0e35c4375bc3ec318b4b12",
        "sjf/decisions.parquet": "1cf9669291a2f7a94cbb700bc5ba8e2cd6a7b24935ab49c9",
        "sjf/requests.parquet": "fc14ed758a6ef80645f0f8b0cdb1811beaa0f5d355ec1f77",
        "sjf/steps.parquet": "d29cadbf739e98576a1691db31a62ad5241a327f95105f23",
        "sjf/summary.json": "f040984ae9236a43b27dbd249980ca5fee3c4686aa960dc4",
        "summary.json": "9446e12c4bc7ef318b20e1b2e4fd662e695fae547188e7ea",
    },
    "swap-recompute": {
        "decisions.parquet": "bd7cb2791db575d7248e2e8350913d1ee8181431dbc78fb2",
        "requests.parquet": "04c749da146083c36eef28ec0d25a2486f3bfc2e73908495",
        "steps.parquet": "bebeefc47a151126dd67b59cd334bdda79a8e42042796888",
        "summary.json": "dd122fa3f1cffa4fc1ffc7051a18174bd4223844a545a676",
    },
    "swap-swap": {
        "decisions.parquet": "24688b28b538f2b141322d404ed492a79be15183d3957ebf",
        "requests.parquet": "82e2691c114dd08418bd4cd22821ff1a1a5310b7a4ebe8b7",
        "steps.parquet": "289583599686558309529ba8fc6e58e51e933de0b44fec0e",
        "summary.json": "eda20a6bc618c355c313b20bc3f651d8e4b4637ebd914996",
    },
    "whole-prefill": {
        "decisions.parquet": "c8975f0b1d50f6b13062fa86a4edf6086e72401bd9b3ef88",
        "requests.parquet": "5cc0903d3a8d95cbe9c9702afd204f43cf34f98c8d9567e3",
        "steps.parquet": "2f0651ef14e516c7768ed13ee9667cdf73db04f6a876f62a",
        "summary.json": "646c841cac23228d98a5a203686776ce4868b19ac8bf12c9",
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
