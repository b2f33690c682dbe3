"""The simulator's output files, byte for byte, against digests made by the code
before it was made faster (issue 22): speed must change nothing a user sees.

Each case simulates a small schedule through :func:`harness.simulate.run_simulations`
(what ``schedscope simulate`` calls) and compares the SHA-256 of every file it writes
(``requests.parquet``, ``decisions.parquet``, ``steps.parquet``, ``summary.json``, per
policy and combined) with the digests below. The cases cover the default profile under
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
from harness.knobs import build_engine_config
from harness.profiles import resolve_profile
from harness.simulate import run_simulations

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

#: Made by the simulator before issue 22's speed-up (main at 8788008).
GOLDEN: dict[str, dict[str, str]] = {
    "closed-loop": {
        "decisions.parquet": "503a8c50301228dc9b1e434006cef518ea7cfc39f4840a35a0c28b85ff4ef144",
        "requests.parquet": "385a0f4a6be5265b4a2e529134c97c970395ae7aa7e27541836c054e8f509721",
        "steps.parquet": "961c57abdc77be63fc237c1ed608a74993a5ab14826324bfa2064ee5593075f5",
        "summary.json": "7560833b70e50a3e33a9dc103b4ee402b93336479dc96a3c6526d9c351ab9bfc",
    },
    "mixed-all": {
        "fcfs/decisions.parquet": "1292da5dee39be4a410f936a21b16cc696cef6285c19c05854a0061447f3dcf4",
        "fcfs/requests.parquet": "8e2a619574a3e281f4e51e4a9cbac8e601cd2fc82cfefff8e9392d88bb091383",
        "fcfs/steps.parquet": "db062f23ef75e4740c910ddc074e54f45575003ab9aa93f1f622d23fa38db1ce",
        "fcfs/summary.json": "5cc5d9b7d877f3741cbc2581f3344037e4aba9ee83d05f57ecd3ee838ba80b91",
        "priority/decisions.parquet": "1304f835fe0488a5e80528cb8517b3718b463aa8678c1e96b6dcd8b16597a600",
        "priority/requests.parquet": "a38a8fb2abc7a50273e0042835bbc9b2148f1fe6c8851fc6bc9a77fa4775c1ac",
        "priority/steps.parquet": "b5ba06804624f77c2a97016f97e007bfe1e9624e75fe83f9739843277d8c79cc",
        "priority/summary.json": "4fc5e39dda58465e1a7e64a6829128dfa538f395dbbc8d8bd1c1521cf0819660",
        "sjf/decisions.parquet": "39021c84e021f56dcd8360752b1e18a2369cccfee8592a1e2362007d83170898",
        "sjf/requests.parquet": "f44a457d1c3035b6002c11f44cf0acdaf8ff3ea4e9206e40a3972e0235e42335",
        "sjf/steps.parquet": "8a7da684ee48561791bed2929b6ec9b7f1269e14cc5cef3f55ef113d7852649d",
        "sjf/summary.json": "8a8f59eb2ce276abceb554862bd761776ecb90e6ff4b643f4e91a14d026d0e27",
        "summary.json": "9df5feeebfa9f2a4d53fef56c4ebe8c3eccc65285d64bc4819aea7e7aefb7fe5",
    },
    "mixed-burst": {
        "requests.parquet": "457c1887213a88551c858be7428082c23d611eab9341a10d046277b0975d2445",
        "steps.parquet": "5ccd6bb4820d5a4d37511d520b61cc18fc14bbef28b793bbf37f9b9026df19d9",
        "summary.json": "7d4906bfab8b474fa05f0bc829e776a30e6c8d9c879d88bf1aaa339cbe19a47b",
    },
    "starvation-maxwait": {
        "priority/decisions.parquet": "913cc0a95f1329ee741aa11e2ab090460a67d8b2ea10f36c59239b34652751c3",
        "priority/requests.parquet": "6b0f8eb5b4ac2886280e2fe68c4a3e318ff15561663262409d51e715f5fe5923",
        "priority/steps.parquet": "7deb0ffdaf955db5ecd1a392152c955f9d9fae7c4a7d3ad78f220a84e7e64ad4",
        "priority/summary.json": "f0be994ef6dc55fa29bc1695a2ecf0421d83d5ec0799d7cf0483e1add6a4425c",
        "sjf/decisions.parquet": "75dd13e5859f757bd759ee48253d90fd70e98b30c6d839c2169b8f7e3ee94357",
        "sjf/requests.parquet": "197e195abf409233b78fce1445cc1fbb7283c4b5596545d3feb8f356cc10e244",
        "sjf/steps.parquet": "8dec801faa3f8e6219841c9fa8b14be1e3d392f2858672231be8b0e23d438013",
        "sjf/summary.json": "40650865d852e129022c8aa793cab030351b7dbe96c2c849d8dfefb1aa0a13f8",
        "summary.json": "46d411951672ac8bd6e44df44147f3f9b0f914ffff937e70ec096b7b23c2954b",
    },
    "starvation-sjf-aging": {
        "decisions.parquet": "fa25b326f95d33d45c5380f685d9601a58bbb05d3d67184c7bfe4f6b260259cb",
        "requests.parquet": "c83223a9d0a8ea148a558c8f2cf48e36bbf50d92d8f3dac11fc92a63387138f3",
        "steps.parquet": "3b5650f180b778f05bcf0b428cbfdf1f48a5fc1f6f88deb112f884f9dc8a5a57",
        "summary.json": "1da107b2795a64304d0c0d4dda067462b946fce776be1e0163e7c83c57228ed8",
    },
    "static": {
        "decisions.parquet": "baf9cef233170937e665eaf42c712c779ca555bffebee1835b98e30e2b7b4816",
        "requests.parquet": "9d4c11681867ece3cca23d2827453eefbe073a7cb0d32955d5a4de7952753dcf",
        "steps.parquet": "e76f086325d15afb15217fe5ec23eb58eabb34c46cc793e662d953712ad033cc",
        "summary.json": "aae8540ccb9d64cc56e6fababcedca818245dd36ac6017ed4e19e5021e3517ca",
    },
    "swap-auto": {
        "fcfs/decisions.parquet": "602ee423299c88934a49b8fede4a756a916f5a8cdc2a2ca5f627636ec4354706",
        "fcfs/requests.parquet": "2105066c0e50b411f7ff5636dc0d48137adad0973eee5dd2d4e58810e8a1f3c3",
        "fcfs/steps.parquet": "d2126ffea06029fe2b4d56b2f2daadacfbf3e45798cef8aa4da886f30ef6a04f",
        "fcfs/summary.json": "89b95e4ffefc7ac859da9a75a6ffa465b33adef93b25253bb411000a7eea813d",
        "priority/decisions.parquet": "9888d68106ec6ffd6ea82a726fafbbbde85845e9f5ba6a7b5e16b9e10c7770e9",
        "priority/requests.parquet": "35c498891e800369cd8b47269bddb595211e7fc0aca3995c787e4b52887ba3d8",
        "priority/steps.parquet": "7a3f947c213dee5395dbbd3500b69cb1b8698710b89e6702e6e16b4df5d7c9bc",
        "priority/summary.json": "a1ae6beccbf63ed042cd1e801e4627dfbafd5344c1a33712e3ce4b074aed98a6",
        "sjf/decisions.parquet": "1cf9669291a2f7a94cbb700bc5ba8e2cd6a7b24935ab49c90b982ab305f96c0d",
        "sjf/requests.parquet": "fc14ed758a6ef80645f0f8b0cdb1811beaa0f5d355ec1f77f0d01a54af097e58",
        "sjf/steps.parquet": "d29cadbf739e98576a1691db31a62ad5241a327f95105f239d1eddd3bc6b9bcd",
        "sjf/summary.json": "a9cb0eb6ecd62d77a75e43e458061578678f0f5892c48a49be00a8fe25d3f76e",
        "summary.json": "3ed6f9fcb352ec315f7753d3d34d296585a87bc45df89246993c89455333615d",
    },
    "swap-recompute": {
        "decisions.parquet": "bd7cb2791db575d7248e2e8350913d1ee8181431dbc78fb2831d3c5fe07022dc",
        "requests.parquet": "04c749da146083c36eef28ec0d25a2486f3bfc2e73908495cd1a09bbf55d9b24",
        "steps.parquet": "bebeefc47a151126dd67b59cd334bdda79a8e4204279688808494d07df94be4d",
        "summary.json": "ee373f9a1cf5e605582430584cb2e13acae9318fbaf5ef6117efda4d81ca196c",
    },
    "swap-swap": {
        "decisions.parquet": "24688b28b538f2b141322d404ed492a79be15183d3957ebf229ba02ee345f929",
        "requests.parquet": "82e2691c114dd08418bd4cd22821ff1a1a5310b7a4ebe8b745871599d8ad426d",
        "steps.parquet": "289583599686558309529ba8fc6e58e51e933de0b44fec0e37e841e74e0de73c",
        "summary.json": "7ac83dc3934da23885836c2f3b78859aceaa59fa8409faf0ce7d4ca1bdf0b62a",
    },
    "whole-prefill": {
        "decisions.parquet": "c8975f0b1d50f6b13062fa86a4edf6086e72401bd9b3ef88405dd3221eed6668",
        "requests.parquet": "5cc0903d3a8d95cbe9c9702afd204f43cf34f98c8d9567e38e2a99a71a525de4",
        "steps.parquet": "2f0651ef14e516c7768ed13ee9667cdf73db04f6a876f62ace5a30e6a18c452e",
        "summary.json": "cf2b8e83b899e22fcf1ffe776734696f19436ac771641ddb25d87a8c580c04bd",
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
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
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
