"""A record file that cannot be written at shutdown (a full disk) is lost alone: the
other record files are written, the spans are still flushed, the lost file is named in
the log with its error, and ``schedscope serve`` exits non-zero. Real subprocesses;
the full disk is real too: the record path becomes a link to ``/dev/full`` (every
write fails with ENOSPC) after the start-up check has passed it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import polars as pl
import pytest

from engine.records.writers import InstalledWriter, RecordWriterSpec, write_records
from harness.records.incremental import part_paths, parts_dir
from harness.records.spans import read_spans
from harness.serve.local_server import CliServer, HttpClient

BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True}

needs_dev_full = pytest.mark.skipif(
    not os.access("/dev/full", os.W_OK), reason="needs /dev/full (Linux)"
)


@pytest.mark.slow
@needs_dev_full
@pytest.mark.parametrize("core", ["process", "thread"])
def test_a_full_disk_loses_only_its_record_file_and_the_exit_code_says_so(tmp_path, core):
    steps, requests, trace = (
        tmp_path / "steps.parquet",
        tmp_path / "requests.parquet",
        tmp_path / "trace.jsonl",
    )
    args = ["--executor", "sim", "--engine-core", core, "--record-steps", str(steps)]
    args += ["--record-requests", str(requests), "--trace-file", str(trace)]
    with CliServer(args) as server:
        client = HttpClient(server.url)
        for i in range(3):
            status, _, raw = client.post_json("/v1/completions", BODY, {"X-Request-Id": f"r{i}"})
            assert status == 200, raw
        # the disk under steps.parquet fills up before shutdown
        steps.symlink_to("/dev/full")
        server.terminate()
        code = server.wait(60)
        output = server.output()
    assert code != 0, output
    # the lost file is named, with the error
    lines = [line for line in output.splitlines() if "could not write step records" in line]
    assert lines and str(steps) in lines[0] and "No space left on device" in lines[0], output
    # the healthy one is whole
    frame = pl.read_parquet(requests)
    assert sorted(frame["request_id"].to_list()) == ["r0", "r1", "r2"]
    # and the spans were flushed
    spans = read_spans(trace)
    assert {"r0", "r1", "r2"} <= set(spans["request_id"].drop_nulls().to_list())
    assert "spans: " in output and "record files not written" in output


def _engine_core(server):
    import psutil

    children = psutil.Process(server.process.pid).children()
    cores = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    assert len(cores) == 1
    return cores[0]


def _flushed(files: dict) -> bool:
    """The 20 requests' rows and their admissions in the parts on disk, and some steps."""
    if not all(part_paths(path) for path in files.values()):
        return False
    requests = pl.read_parquet(parts_dir(files["requests"]))
    decisions = pl.read_parquet(parts_dir(files["decisions"]))
    admitted = decisions.filter(pl.col("kind") == "admit")["request_id"].n_unique()
    return requests.height == 20 and admitted == 20


@pytest.mark.slow
def test_an_engine_process_killed_keeps_its_records_up_to_the_last_flush(tmp_path):
    """The records are written as the engine runs: after a kill -9 of the engine
    process, every request that had ended a flush interval before is in the record
    files (merged by the server from the parts the engine wrote), and the exit code
    still says that the engine died."""
    files = {name: tmp_path / f"{name}.parquet" for name in ("steps", "requests", "decisions")}
    args = ["--executor", "sim", "--record-steps", str(files["steps"])]
    args += ["--record-requests", str(files["requests"])]
    args += ["--record-decisions", str(files["decisions"])]
    with CliServer(args) as server:
        client = HttpClient(server.url)
        for i in range(20):
            status, _, raw = client.post_json("/v1/completions", BODY, {"X-Request-Id": f"r{i}"})
            assert status == 200, raw
        # on disk while the engine still runs (and is idle): within a flush interval —
        # every record file's, each writer flushing on its own (on a busy machine the
        # steps' part came after the requests')
        deadline = time.monotonic() + 30
        while not _flushed(files):
            assert time.monotonic() < deadline, "the records never reached the disk"
            time.sleep(0.1)
        _engine_core(server).kill()
        code = server.wait(60)  # a dead engine ends the server
        output = server.output()
    assert code != 0, output
    requests = pl.read_parquet(files["requests"])
    assert sorted(requests["request_id"].to_list()) == sorted(f"r{i}" for i in range(20))
    assert set(requests["status"]) == {"ok"}
    steps = pl.read_parquet(files["steps"])
    assert steps.height > 0 and steps["step"].is_sorted()
    admitted = pl.read_parquet(files["decisions"]).filter(pl.col("kind") == "admit")
    assert admitted["request_id"].n_unique() == 20
    for path in files.values():
        assert not parts_dir(path).exists()
    assert f"request records ({files['requests']}) holds the 20 rows" in output, output
    assert "not written" not in output, output


@pytest.mark.slow
def test_an_engine_process_killed_before_its_first_flush_is_a_failed_exit(tmp_path):
    """Nothing flushed yet (the engine killed at once): the file is named as not
    written, and the exit is non-zero."""
    requests = tmp_path / "requests.parquet"
    with CliServer(["--executor", "sim", "--record-requests", str(requests)]) as server:
        _engine_core(server).kill()
        code = server.wait(60)  # a dead engine ends the server
        output = server.output()
    assert code != 0, output
    assert not requests.exists()
    assert f"not written: request records ({requests})" in output, output


def test_every_record_file_is_written_or_reported(tmp_path, caplog):
    """write_records: the failing writer is reported (name, path, error) and does not
    stop the ones after it."""
    from engine.records.writers import LostRecord

    class Writer:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def __call__(self, record) -> None:
            pass

        def write(self, path: Path) -> None:
            if self.fail:
                raise OSError(28, "No space left on device")
            path.write_text("ok")

    def spec(name: str) -> RecordWriterSpec:
        return RecordWriterSpec(lambda config: Writer(False), tmp_path / name, name)

    installed = [
        InstalledWriter(spec("a"), Writer(False)),
        InstalledWriter(spec("b"), Writer(True)),
        InstalledWriter(spec("c"), Writer(False)),
    ]
    with caplog.at_level("INFO", logger="schedscope.engine"):
        lost = write_records(installed)
    assert lost == [LostRecord("b", str(tmp_path / "b"), "[Errno 28] No space left on device")]
    assert (tmp_path / "a").read_text() == (tmp_path / "c").read_text() == "ok"
    assert any(
        "could not write b to" in r.getMessage() and "No space left" in r.getMessage()
        for r in caplog.records
    )
