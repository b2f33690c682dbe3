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
        "decisions.parquet": "e1f9433053b5f7f2fb9a09f02e9eb4efaecfcb84ea395b73",
        "requests.parquet": "934aac5d7661a402887933c180c136efa7f65e0ce9dc10c0",
        "steps.parquet": "f1bdd2fe78d053b0461f66aa91ddfb37a4bac136d6658fcb",
        "summary.json": "66565d93c12bcbc37d30361098f140ea5e0cf2d650ca2a69",
    },
    "mixed-all": {
        "fcfs/decisions.parquet": "813707a5e3e9951f38769d2dec5bb53cb8ce07887a700a83",
        "fcfs/requests.parquet": "8493c1547ac60b385c1264da579bcced1ca91bf5862f7ac0",
        "fcfs/steps.parquet": "52116ae3225685908423fa191d6e69a6db5142d9a31da135",
        "fcfs/summary.json": "11c510bd6624a14c006c9e9f52ecedc8da94c320a6f5c192",
        "priority/decisions.parquet": "c9c0ba5654157ba94a5d8bc72210e151593357e8a1a5fdb8",
        "priority/requests.parquet": "e6c5f09f1751393cb1f2d5ff8b2d838718c88010d87d632a",
        "priority/steps.parquet": "1a1347733f970f5789baded59e24d41cb663de77f5adb395",
        "priority/summary.json": "6a4058da9578f0789093c1f8605a476bf004e9c5fef3f5bb",
        "sjf/decisions.parquet": "4cdff69998e0abf3f70b5274680b616393589cb4cb9ac860",
        "sjf/requests.parquet": "588c55165590b65bbb4c2768cc4003bf9fb9446ccccbd069",
        "sjf/steps.parquet": "173229303a96413099b69dc4b3ef118138673e65c205997f",
        "sjf/summary.json": "063a587f5da2f9904fce99239b4c2c1cb2581d0e833e258d",
        "summary.json": "0560b448898683a400a8de19803d71681d717dabcd297485",
    },
    "mixed-burst": {
        "requests.parquet": "c4a79d48c94afd98562a253e8714f8208360651b7532489a",
        "steps.parquet": "526e7ae68eaf0ead05c34ce19e1c2dff072f495b4264282f",
        "summary.json": "c2df8124c6d3e2abee6c810c878d7c59610d870adf3c0b68",
    },
    "starvation-maxwait": {
        "priority/decisions.parquet": "5c02f61d60ee24c998f4cb08478b434f19c8b5b4d9e2ef8a",
        "priority/requests.parquet": "5d25e7a805c32c9d94475c483d164bc65e86f723249734cc",
        "priority/steps.parquet": "837b115b30c5b07c00aa78eedd13c3bb7ddf785b4a894703",
        "priority/summary.json": "3be25f7357c18071c65ff0b83fb31ebd001c1df54b54d577",
        "sjf/decisions.parquet": "66e910708aaf5efadcdf43b07200dfd17105f910b26c1843",
        "sjf/requests.parquet": "ce8b2319c8dbf372ad8db22c048d58799bba385423d566b9",
        "sjf/steps.parquet": "24741f9234fa714830118c390d74699249146bb14c3b7d15",
        "sjf/summary.json": "b08080680f0ac0076f15dc0e943a47e4257fe085eeeb1c5a",
        "summary.json": "b5002a81b5e57ec45c3b2879274850bbd261dd6130b8a0a4",
    },
    "starvation-sjf-aging": {
        "decisions.parquet": "b624e9d4e6b3e0c589c828124e0732574444cbeaeeea63b3",
        "requests.parquet": "4d357737bcf67bbc947c668a301a18221fbd59f78d70ba6b",
        "steps.parquet": "2d0ad9ce1722b9a4ad200cb494f3f7096b5085e3e7103884",
        "summary.json": "0f0d5168b25e7187e925dc7af778d421187f7378f78553c5",
    },
    "static": {
        "decisions.parquet": "fc4185a03b180abae38c93f1556606d55c33d1d25f86353a",
        "requests.parquet": "ad86b29c94982365a1e9bf153fbeb92bed6068de741054c7",
        "steps.parquet": "533d9a4cdb055df7bf1a9163d631d2c05a72a66806661fb7",
        "summary.json": "ede5ba15aa2baeb049e500911be778ccb3aebd5d40355278",
    },
    "swap-auto": {
        "fcfs/decisions.parquet": "116212de68d941123869dac3d8da26c7b6d23d6001099a1e",
        "fcfs/requests.parquet": "25632aa63b30dc5e590d621d0d2756fd4a8a69b73e0ff4d7",
        "fcfs/steps.parquet": "b71a386416b16b9f63d9047677cca4a52493b59e4c26bcd0",
        "fcfs/summary.json": "336a24e7117469327d3cf76ae068d4a3662af01c42a3eee7",
        "priority/decisions.parquet": "a1bb3cc9e4161f14050d3c3cc054bb9bdcc51053f6914750",
        "priority/requests.parquet": "abb441151c6902cd8205557665e696a192c0f1fe0fcb5624",
        "priority/steps.parquet": "334a712dfb7852873f452defd530793ed19d372bdefac059",
        "priority/summary.json": "ef417b00088a042e31478e50c388220154513ed6a2669d0c",
        "sjf/decisions.parquet": "38417cfee5ae15d0140db1720efaad693401ccd244423eb1",
        "sjf/requests.parquet": "af5843477b472441597f44b8766d4d63bd5020423286082f",
        "sjf/steps.parquet": "3fb11891db1a58fe67c35e27b414dfe2f36c7c1549df5066",
        "sjf/summary.json": "ce8fd781b7eb6750242d715c828b20db10acef0f4bd9c7f2",
        "summary.json": "e4b8c1da5332e09468231c153e4cb962395fc9e9d3003f2a",
    },
    "swap-recompute": {
        "decisions.parquet": "56ec8a7ee030676afd369fa3e67176256e8a7335c1125fb6",
        "requests.parquet": "4d39fe7c9e0a6c72747321aaa5b144acb1420dafab0e8c6d",
        "steps.parquet": "2bcc4cebe86595f041fb69673d24c67a751b2c8943f30f5c",
        "summary.json": "a68c945e99f47024eca3768a4eb5074ac9f41d48bade30c5",
    },
    "swap-swap": {
        "decisions.parquet": "47af4961fe2c7148ad667e7bfaf9fa9400ecea5a9fda6973",
        "requests.parquet": "bc843055812a0779c995e7eca5d58d79280096f7dbe578c3",
        "steps.parquet": "d4423163b284a0945ade78770aaf6d34344d13b1e29ba2d4",
        "summary.json": "d834303f6815e691bc8371a253d15b68857b13c94553d420",
    },
    "whole-prefill": {
        "decisions.parquet": "d601b9c455db3061a833afb391d972af23d4aa4105374bc5",
        "requests.parquet": "48bca2e259766bd7df276b506c6374ca63b49fac940c3bb4",
        "steps.parquet": "9fb53b3ea699b0990136ebfce48e702fd8873972833ee6dd",
        "summary.json": "68204357e86672a3efbb342b6ec54d30b2548293734ee30a",
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
