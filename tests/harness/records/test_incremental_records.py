"""Record files written as the engine runs (harness/records/incremental.py): the merged
file is the file a writer holding everything in memory would have written, whatever
the flush points; a crash keeps every row up to the last flush; a failed flush loses
nothing; the rows held in memory are only those since the last flush."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import harness.records.incremental as incremental_records
from harness.cli import app
from harness.records.decision_log import SCHEMA as DECISION_SCHEMA
from harness.records.decision_log import DecisionLog
from harness.records.incremental import (
    IncrementalRecordWriter,
    part_paths,
    parts_dir,
    recover_record_file,
)
from harness.records.requests import REQUEST_SCHEMA, RequestRecorder
from harness.records.steps import STEP_SCHEMA, StepLog
from tests.support.engine_helpers import Req, drive, make_engine

#: Long enough that the background thread never flushes during a test that flushes by hand.
NEVER_S = 3600.0

KINDS = {
    "requests": (lambda: RequestRecorder("fcfs", "served"), REQUEST_SCHEMA),
    "steps": (StepLog, STEP_SCHEMA),
    "decisions": (DecisionLog, DECISION_SCHEMA),
}


def _requests() -> list[Req]:
    # More KV demand than the 24 blocks hold: preemptions, swaps and waits, so the
    # decisions and steps are not all alike.
    return [
        Req(f"r{i}", arrival=0.01 * i, prompt_len=6 + (i * 7) % 23, max_tokens=3 + (i * 5) % 17)
        for i in range(40)
    ]


def _run(tmp_path: Path, flush_at_steps: set[int], flush_interval_s: float = NEVER_S):
    """One simulated run observed by an in-memory collector and an incremental writer of
    each kind; the incremental ones flush after the steps in ``flush_at_steps``."""
    engine = make_engine(gpu_blocks=24, cpu_blocks=8, preemption_mode="swap")
    whole = {}
    writers = {}
    for name, (make, schema) in KINDS.items():
        whole[name] = engine.observers.add(make())
        writers[name] = engine.observers.add(
            IncrementalRecordWriter(make(), tmp_path / f"{name}.parquet", schema, flush_interval_s)
        )

    def on_step(record, trace) -> None:
        if record.step in flush_at_steps:
            for writer in writers.values():
                writer.flush()

    trace = drive(engine, _requests(), on_step=on_step)
    return whole, writers, trace


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(flush_at_steps=st.sets(st.integers(0, 120), max_size=12))
def test_the_merged_file_is_the_whole_file_whatever_the_flush_points(
    tmp_path_factory, flush_at_steps
):
    tmp_path = tmp_path_factory.mktemp("run")
    whole, writers, _ = _run(tmp_path, flush_at_steps)
    for name, writer in writers.items():
        expected = tmp_path / f"whole-{name}.parquet"
        whole[name].write(expected)
        writer.write(writer.path)
        assert not parts_dir(writer.path).exists(), "the parts are removed once merged"
        assert_frame_equal(pl.read_parquet(writer.path), pl.read_parquet(expected))
    merged = pl.read_parquet(writers["requests"].path)
    assert merged.height == 40 and merged["request_id"].n_unique() == 40


def test_a_crash_keeps_every_row_up_to_the_last_flush(tmp_path):
    whole, writers, trace = _run(tmp_path, flush_at_steps={10, 30})
    steps = [record.step for record in trace.steps]
    assert max(steps) > 30
    for writer in writers.values():
        writer.flush()  # the last flush before the "crash": no write() follows
    # the parts are whole Parquet files, readable as they are
    direct = pl.read_parquet(parts_dir(tmp_path / "steps.parquet"))
    assert direct["step"].to_list() == whole["steps"].frame()["step"].to_list()
    for name in KINDS:
        path = tmp_path / f"{name}.parquet"
        assert len(part_paths(path)) == 3
        assert recover_record_file(path) == pl.read_parquet(path).height
        expected = tmp_path / f"whole-{name}.parquet"
        whole[name].write(expected)
        assert_frame_equal(pl.read_parquet(path), pl.read_parquet(expected))
    assert recover_record_file(tmp_path / "requests.parquet") is None  # nothing left


def test_rows_after_the_last_flush_are_what_a_crash_loses(tmp_path):
    whole, writers, trace = _run(tmp_path, flush_at_steps={20})
    path = tmp_path / "steps.parquet"
    recover_record_file(path)
    assert pl.read_parquet(path)["step"].to_list() == [s.step for s in trace.steps if s.step <= 20]


def test_memory_holds_only_the_rows_since_the_last_flush(tmp_path):
    _, writers, _ = _run(tmp_path, flush_at_steps=set())
    recorder = writers["requests"].collector
    assert len(recorder.rows) == 40
    writers["requests"].flush()
    assert recorder.rows == []
    assert writers["steps"].collector.num_steps > 0
    writers["steps"].flush()
    assert writers["steps"].collector.num_steps == 0
    assert writers["decisions"].collector.decisions
    writers["decisions"].flush()
    assert writers["decisions"].collector.decisions == []


def test_the_thread_flushes_without_being_asked(tmp_path):
    """Rows reach the disk while nothing else happens (an idle engine writes too)."""
    _, writers, _ = _run(tmp_path, flush_at_steps=set(), flush_interval_s=0.02)
    path = writers["requests"].path
    done = threading.Event()
    for _ in range(500):
        if part_paths(path) and pl.read_parquet(parts_dir(path)).height == 40:
            done.set()
            break
        done.wait(0.02)
    assert done.is_set(), "no part was written by the flush thread"
    for writer in writers.values():
        writer.write(writer.path)
    assert pl.read_parquet(path).height == 40


def test_a_failed_flush_keeps_its_rows_for_the_next(tmp_path, monkeypatch):
    whole, writers, _ = _run(tmp_path, flush_at_steps=set())
    writer = writers["requests"]
    real = incremental_records.write_parquet

    def full_disk(frame, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(incremental_records, "write_parquet", full_disk)
    with pytest.raises(OSError, match="No space left"):
        writer.flush()
    assert not part_paths(writer.path)
    assert not list(parts_dir(writer.path).iterdir()), "no half-written part is left"
    monkeypatch.setattr(incremental_records, "write_parquet", real)
    writer.write(writer.path)
    assert pl.read_parquet(writer.path).height == 40


def test_a_file_that_cannot_be_merged_keeps_its_parts(tmp_path):
    _, writers, _ = _run(tmp_path, flush_at_steps={5})
    writer = writers["decisions"]
    (tmp_path / "decisions.parquet").mkdir()  # the file's place is taken
    with pytest.raises(OSError):
        writer.write(writer.path)
    assert len(part_paths(writer.path)) == 2, "the rows stay recoverable"


def test_recover_records_command(tmp_path):
    _, writers, _ = _run(tmp_path, flush_at_steps={5})
    for writer in writers.values():
        writer.flush()
    runner = CliRunner()
    result = runner.invoke(app, ["recover-records", str(tmp_path / "requests.parquet")])
    assert result.exit_code == 0, result.output
    assert "40 rows recovered" in " ".join(result.output.split())
    assert pl.read_parquet(tmp_path / "requests.parquet").height == 40
    result = runner.invoke(app, ["recover-records", str(tmp_path / "requests.parquet")])
    assert result.exit_code == 1
    assert "nothing to recover" in " ".join(result.output.split())


def test_a_run_that_did_not_finish_is_not_mixed_into_the_next(tmp_path):
    """Parts left by a crashed server are refused at the next start (they would be
    merged into the new run's file), with the command that recovers them."""
    requests = tmp_path / "requests.parquet"
    parts_dir(requests).mkdir()
    args = ["serve", "--executor", "sim", "--port", "0", "--record-requests", str(requests)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "schedscope recover-records" in text and "did not finish" in text, text
