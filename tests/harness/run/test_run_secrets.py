"""No secret lands in what a run writes: the target's API key and a URL's password are
masked in the run's and the cells' run.json, summary.json, the recorded Locust command,
the report and every other file under ``--out`` (a hostile review found the key in
plaintext in three of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.loadgen.options import env_var
from harness.records.redact import MASK, redact_argv, redact_url, strip_credentials, worker_host
from harness.run.loadgen import LocustRun
from tests.harness.run.test_run_target_vocabulary import run_target
from tests.support.vllm_stub import VllmStub

pytestmark = [pytest.mark.usefixtures("own_store")]

KEY = "sk-SECRET-3b9f0c"


def test_secret_flags_and_url_passwords_are_masked():
    assert redact_argv(["run", "--api-key", KEY, "--target", "http://u:pw@h:1/v1"]) == [
        "run", "--api-key", MASK, "--target", f"http://u:{MASK}@h:1/v1",
    ]  # fmt: skip
    assert redact_argv([f"--api-key={KEY}", "--target=http://u:pw@h"]) == [
        f"--api-key={MASK}", f"--target=http://u:{MASK}@h",
    ]  # fmt: skip
    assert redact_url("http://admin:hunter2@grafana:3000") == f"http://admin:{MASK}@grafana:3000"
    assert redact_url("https://token@h/x") == f"https://{MASK}@h/x"
    assert redact_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    # a bad port is kept as written, never a traceback (a run with such a --target crashed)
    assert redact_url("http://u:p@h:99999/v1") == f"http://u:{MASK}@h:99999/v1"


def test_a_url_travels_to_workers_without_its_credentials():
    assert strip_credentials("http://u:pw@h:8000/v1") == "http://h:8000/v1"
    assert strip_credentials("http://h:8000") == "http://h:8000"
    # a worker with its own --host for the same target keeps its credentials
    assert worker_host("http://h:8000", "http://u:pw@h:8000") == "http://u:pw@h:8000"
    assert worker_host("http://h:8000", "http://other:9") == "http://h:8000"
    assert worker_host("http://h:8000", None) == "http://h:8000"


def test_the_key_goes_to_locust_in_its_environment_not_on_its_command_line():
    run = LocustRun(
        Path("p.py"), "http://h:1", Path("r"), Path("l"), 1.0, 1.0, None,
        secrets={env_var("--api-key"): KEY},
    )  # fmt: skip
    assert KEY not in " ".join(run.command)
    assert run.secrets == {"LOCUST_API_KEY": KEY}


def test_the_api_key_is_in_no_file_a_target_run_writes(tmp_path):
    out = tmp_path / "run"
    with VllmStub(vocab_size=50000) as stub:
        proc = run_target(stub.url, out, "--api-key", KEY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert KEY not in proc.stdout + proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in files) and any(p.name == "report.md" for p in files)
    leaks = [str(p.relative_to(out)) for p in files if KEY.encode() in p.read_bytes()]
    assert leaks == []
