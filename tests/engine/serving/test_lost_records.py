"""A record file that cannot be written at shutdown (a full disk) is lost alone: the
other record files are written, the spans are still flushed, the lost file is named in
the log with its error, and ``schedscope serve`` exits non-zero. Real subprocesses;
the full disk is real too: the record path becomes a link to ``/dev/full`` (every
write fails with ENOSPC) after the start-up check has passed it."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from engine.records.writers import InstalledWriter, RecordWriterSpec, write_records
from harness.local_server import CliServer, HttpClient
from harness.spans import read_spans

BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 5, "ignore_eos": True}

needs_dev_full = pytest.mark.skipif(
    not os.access("/dev/full", os.W_OK), reason="needs /dev/full (Linux)"
)


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


def test_an_engine_process_killed_before_writing_its_records_is_a_failed_exit(tmp_path):
    """The records live in the engine process: when it dies, they are lost, and the
    server says so (the file named, a non-zero exit) rather than exiting 0."""
    import psutil

    requests = tmp_path / "requests.parquet"
    with CliServer(["--executor", "sim", "--record-requests", str(requests)]) as server:
        status, _, _ = HttpClient(server.url).post_json("/v1/completions", BODY)
        assert status == 200
        children = psutil.Process(server.process.pid).children()
        cores = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
        assert len(cores) == 1
        cores[0].kill()
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
