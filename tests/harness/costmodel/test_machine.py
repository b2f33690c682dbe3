"""The machine fingerprint: its key follows every part and nothing else, its machine key
ignores exactly the version parts, it reads this machine the same way twice, without
torch, and a checkpoint's or preset's shapes make its model hash."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from engine.worker.model_config import ModelConfig
from harness.costmodel.machine import (
    VERSION_PARTS,
    Fingerprint,
    cpu_from_cpuinfo,
    fingerprint,
    model_config_hash,
)
from tests.support.paths import REPO

PARTS = {
    "cpu_model": "AMD EPYC 9B14",
    "arch": "x86_64",
    "isa": ("avx", "avx2", "avx512f", "fma"),
    "cores": 2,
    "torch_threads": 1,
    "serve_cores": 1,
    "torch": "2.13.0+cpu",
    "torch_build": "cf30153c4c131c8164ee7798e5022d810682e2cb",
    "cpu_capability": "auto",
    "cuda": "",
    "model": "tiny",
    "model_config": "a798a59e524a",
    "executor": "torch",
    "device": "cpu",
    "schedscope": "0.1.0",
}
NAMES = sorted(PARTS)


def base() -> Fingerprint:
    return fingerprint(**PARTS)


def changed(name: str) -> Fingerprint:
    value = PARTS[name]
    if isinstance(value, int):
        other: object = value + 1
    elif isinstance(value, tuple):
        other = (*value, "amx_tile")
    else:
        other = value + "x"
    return dataclasses.replace(base(), **{name: other})


def test_the_injected_parts_are_the_whole_fingerprint():
    assert {f.name for f in dataclasses.fields(Fingerprint)} == set(PARTS)
    assert base().parts() == {**PARTS, "isa": list(PARTS["isa"])}


@given(st.sampled_from(NAMES))
def test_the_key_changes_when_any_one_part_changes(name):
    assert changed(name).key != base().key


@given(st.permutations(list(PARTS["isa"])))
def test_the_key_is_the_same_for_the_same_parts(isa):
    """Rebuilt from the same parts (the ISA flags in any order): the same key."""
    again = fingerprint(**{**PARTS, "isa": tuple(isa)})
    assert again == base() and again.key == base().key
    assert len(again.key) == 12


@given(st.sampled_from(NAMES))
def test_the_machine_key_ignores_the_version_parts_only(name):
    if name in VERSION_PARTS:
        assert changed(name).machine_key == base().machine_key
        assert changed(name).stale_against(base()) == [
            f"{name} {getattr(changed(name), name)} -> {PARTS[name]}"
        ]
    else:
        assert changed(name).machine_key != base().machine_key
        assert changed(name).stale_against(base()) == []


def test_a_fingerprint_round_trips_through_its_dict_and_json():
    data = json.loads(json.dumps(base().to_dict()))
    assert data["key"] == base().key and data["machine_key"] == base().machine_key
    assert Fingerprint.from_dict(data) == base()
    # the key is recomputed from the parts, never trusted from the file
    assert Fingerprint.from_dict({**data, "key": "forged"}).key == base().key


def test_describe_is_one_line_naming_the_machine():
    line = base().describe()
    assert "\n" not in line
    for fact in ("AMD EPYC 9B14", "avx512f", "2 cores", "1 torch thread", "2.13.0+cpu", "tiny"):
        assert fact in line
    assert base().key in line


def test_this_machine_reads_the_same_twice():
    assert fingerprint("tiny") == fingerprint("tiny")
    assert fingerprint("tiny").to_dict() == fingerprint("tiny").to_dict()


def test_the_fingerprint_does_not_import_torch():
    code = (
        "import sys; from harness.costmodel.machine import fingerprint; f = fingerprint('tiny'); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(f.torch)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() not in ("", "none")  # torch's version, read from its files


def test_model_config_hash_follows_the_shapes(tmp_path):
    assert model_config_hash("tiny") != model_config_hash("small")
    assert model_config_hash("tiny") == model_config_hash("tiny")
    assert model_config_hash("no-such-model") == "unknown"
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"hidden_size": 128, "num_heads": 4}))
    first = model_config_hash(str(checkpoint))
    (checkpoint / "config.json").write_text(json.dumps({"hidden_size": 64, "num_heads": 4}))
    assert model_config_hash(str(checkpoint)) != first
    assert first != model_config_hash("tiny")
    assert dataclasses.asdict(ModelConfig()) == dataclasses.asdict(ModelConfig.preset("tiny"))


def test_a_checkpoint_is_named_by_its_resolved_path(tmp_path, monkeypatch):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert fingerprint("ckpt").model == str(checkpoint.resolve())
    assert fingerprint("ckpt").key == fingerprint(str(checkpoint)).key


def test_cpuinfo_gives_the_model_and_the_listed_isa_flags():
    x86 = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n"
        "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw amx_tile\n\n"
        "processor\t: 1\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu\n"
    )
    assert cpu_from_cpuinfo(x86) == (
        "AMD EPYC 9B14",
        ("amx_tile", "avx", "avx2", "avx512bw", "avx512f", "fma"),
    )
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU part\t: 0xd40\n"
    model, isa = cpu_from_cpuinfo(arm)
    assert isa == ("asimd", "sve") and model and not model.isdigit()
    assert cpu_from_cpuinfo("")[1] == ()


def test_the_served_engine_default_threads_are_the_default():
    from harness.costmodel.machine import serving_torch_threads

    assert fingerprint("tiny").torch_threads == serving_torch_threads()
    assert fingerprint("tiny", torch_threads=3).torch_threads == 3
