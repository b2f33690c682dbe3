"""The step log's block of a decode run's members-only steps (``StepLog.add_decode_steps``)
gives the rows that the same steps' records would give through ``add_row`` (a record
of decodes with no per-sequence entries, ``num_seqs`` given), column for column, an
idle wait carried from an empty step included."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from engine.records.step_record import StepRecord
from engine.sim.decode_runs import DecodeSteps
from harness.records.steps import StepLog


@given(
    num_seqs=st.lists(st.integers(1, 300), min_size=1, max_size=20),
    start=st.floats(0, 1e4),
    idle=st.floats(0, 5),
    carried=st.floats(0, 5),
    swap_s=st.sampled_from([0.0, float("nan")]),
)
def test_a_block_of_decode_steps_is_the_rows_of_their_records(
    num_seqs, start, idle, carried, swap_s
):
    steps = DecodeSteps(
        7, idle, num_device_blocks=900, num_free_host_blocks=40, num_host_blocks=64, swap_s=swap_s
    )
    records, now = [], start
    for k, num in enumerate(num_seqs):
        ended = now + 0.001 * num
        steps.starts.append(now)
        steps.ends.append(ended)
        steps.num_seqs.append(num)
        steps.context_tokens.append(100 * num + k)
        steps.free_device_blocks.append(800 - k)
        record = StepRecord(
            7 + k,
            now,
            now,
            ended,
            ended,
            num_decode_seqs=num,
            num_decode_context_tokens=100 * num + k,
            num_running=num,
            swap_out_s=swap_s,
            swap_in_s=swap_s,
            idle_before_s=idle if k == 0 else 0.0,
        )
        record.num_free_device_blocks = 800 - k
        record.num_device_blocks = 900
        record.num_free_host_blocks = 40
        record.num_host_blocks = 64
        records.append(record)
        now = ended
    empty = StepRecord(6, start - carried, start - carried, start - carried, start - carried)
    by_rows, by_block = StepLog(), StepLog()
    for log in (by_rows, by_block):
        log(empty)  # an empty step: its idle wait is charged to the next step
    for record, num in zip(records, num_seqs, strict=True):
        by_rows.add_row(record, num)
    by_block.add_decode_steps(steps)
    assert by_block.num_steps == len(num_seqs)
    assert_frame_equal(by_block.frame(), by_rows.frame())
