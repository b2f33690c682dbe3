"""The report's time axes: seconds since the start of each run's schedule, with the
absolute time kept in the hover text (docs/report.md, Pictures)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from harness.records.steps import STEP_SCHEMA
from harness.report import figures, tables
from harness.report.build import ReportOptions, build_report

#: Two cells served one after another on the Unix clock (December 2026), 1000 s apart.
STARTS = {"fcfs": 1_796_164_450.0, "sjf": 1_796_165_450.0}
FIRST_OFFSET_S = 0.5  # the schedule's first arrival, after the schedule started
N = 40
SPACING_S = 0.5
E2E_S = 2.0
TAIL_S = 3.0  # the last step: this long after the last arrival
#: Everything a cell plots lies within [schedule start, schedule start + RUN_S].
RUN_S = FIRST_OFFSET_S + (N - 1) * SPACING_S + TAIL_S


def _requests(start: float) -> pl.DataFrame:
    offsets = [FIRST_OFFSET_S + i * SPACING_S for i in range(N)]
    at = [start + o for o in offsets]
    return pl.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(N)],
            "class": ["short" if i % 2 else "long" for i in range(N)],
            "status": ["ok"] * N,
            "prompt_tokens": [10] * N,
            "output_tokens": [101] * N,
            "max_tokens": [101] * N,
            "schedule_offset_s": offsets,
            "scheduled_at": at,
            "sent_at": [t + 0.001 for t in at],
            "queue_s": [0.2] * N,
            "first_scheduled_at": [t + 0.2 for t in at],
            "first_token_at": [t + 0.5 for t in at],
            "finished_at": [t + E2E_S for t in at],
            "ttft_s": [0.5] * N,
            "tpot_s": [(E2E_S - 0.5) / 100] * N,
            "e2e_s": [E2E_S] * N,
            "max_itl_s": [0.6] * N,
            "stall_s": [0.6 if i % 4 == 0 else 0.0 for i in range(N)],
            "num_stalls": [1 if i % 4 == 0 else 0 for i in range(N)],
            "stalls": [
                [{"start_s": t + 1.0, "duration_s": 0.6}] if i % 4 == 0 else []
                for i, t in enumerate(at)
            ],
        }
    )


def _steps(start: float) -> pl.DataFrame:
    ends = np.arange(start + FIRST_OFFSET_S + 0.1, start + RUN_S, 0.1)
    n = ends.size
    cols = {name: [0] * n for name, dtype in STEP_SCHEMA.items() if dtype == pl.Int64}
    cols |= {name: [0.0] * n for name, dtype in STEP_SCHEMA.items() if dtype == pl.Float64}
    cols |= {
        "step": list(range(n)),
        "schedule_start": ends - 0.05,
        "execute_start": ends - 0.04,
        "execute_end": ends,
        "num_seqs": [4] * n,
        "num_decode_seqs": [4] * n,
        "num_running": [4] * n,
        "num_waiting": [i % 3 for i in range(n)],
        "num_free_device_blocks": [600] * n,
        "num_device_blocks": [1000] * n,
        "num_free_host_blocks": [100] * n,
    }
    return pl.DataFrame(cols, schema=STEP_SCHEMA)


def _metrics(start: float) -> pl.DataFrame:
    scrapes = np.arange(start + 1.0, start + RUN_S, 1.0)
    names = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
    rows = [(float(t), n, "{}", 0.4 if "kv" in n else 2.0) for t in scrapes for n in names]
    return pl.DataFrame(rows, schema=["timestamp", "name", "labels", "value"], orient="row")


@pytest.fixture(scope="module")
def served_run(tmp_path_factory) -> Path:
    """A served-like run: requests, steps (fcfs) or scrapes only (sjf), Unix instants."""
    root = tmp_path_factory.mktemp("served")
    for policy, start in STARTS.items():
        cell = root / policy
        cell.mkdir()
        _requests(start).with_columns(policy=pl.lit(policy)).write_parquet(
            cell / "requests.parquet"
        )
        if policy == "fcfs":
            _steps(start).write_parquet(cell / "steps.parquet")
        else:
            _metrics(start).write_parquet(cell / "metrics.parquet")
    return root


def _time_traces(fig):
    """Every trace drawn against time (x), with the title of its x axis."""
    layout = fig.layout
    for trace in fig.data:
        axis = "xaxis" + (trace.xaxis or "x")[1:]
        yield trace, layout[axis]


def _unix(label: str) -> float:
    return float(label.rsplit("Unix ", 1)[1].rstrip(")"))


def test_served_report_plots_seconds_since_each_schedule_start(served_run: Path):
    """Unix instants (~1.796e9 s) must not reach the time axes: each cell's points lie
    in [0, its run's length], the axis says what 0 is, the hover keeps the UTC time."""
    report = build_report([served_run], ReportOptions(resamples=20))
    timed = [(s, f) for s, _, f in report.figures if s in ("timeline", "stalls")]
    assert sorted(s for s, _ in timed) == ["stalls", "timeline", "timeline"]
    titles = set()
    for _, fig in timed:
        for trace, axis in _time_traces(fig):
            x = np.asarray(trace.x, dtype=float)
            assert x.size
            assert x.min() >= 0.0 and x.max() <= RUN_S, (trace.name, x.min(), x.max())
            if axis.title.text:
                titles.add(axis.title.text)
            # absolute time in the hover: UTC ISO time of this very point
            assert "%{customdata}" in trace.hovertemplate
            labels = list(trace.customdata)
            assert len(labels) == x.size
            assert all(lab.startswith("2026-12-") and "Z (Unix " in lab for lab in labels)
            origin = np.array([_unix(lab) for lab in labels]) - x
            assert origin.max() - origin.min() < 1e-3  # one origin per trace
    assert titles and all("seconds since the start of the schedule" in t for t in titles)


def test_schedule_origin_is_the_one_home_of_a_run_s_time_zero():
    served = _requests(STARTS["fcfs"])
    assert figures.schedule_origin(served) == pytest.approx(STARTS["fcfs"])
    # a closed loop sends later than its offset: the schedule still started at the min
    lagged = served.with_columns(scheduled_at=pl.col("scheduled_at") + pl.col("schedule_offset_s"))
    assert figures.schedule_origin(lagged) == pytest.approx(STARTS["fcfs"] + FIRST_OFFSET_S * 2)
    # records without offsets: Unix instants start at the earliest arrival ...
    unix = served.drop("schedule_offset_s")
    assert figures.schedule_origin(unix) == pytest.approx(STARTS["fcfs"] + FIRST_OFFSET_S)
    # ... a simulation's virtual clock already starts at its schedule's start
    sim = served.with_columns(scheduled_at=pl.col("schedule_offset_s")).drop("schedule_offset_s")
    assert figures.schedule_origin(sim) == 0.0
    # the report's request table fills a missing offset with nulls: same answer
    loaded = tables.load_requests(sim.lazy(), {})
    assert loaded["schedule_offset_s"].null_count() == loaded.height
    assert figures.schedule_origin(loaded) == 0.0
    assert figures.schedule_origin(loaded.clear()) == 0.0


def test_timelines_of_cells_served_one_after_another_line_up():
    """Each cell gets its own origin: the arrivals' first bar is at the first schedule
    offset in both, though the cells ran 1000 s apart."""
    firsts = []
    for policy, start in STARTS.items():
        frame = _requests(start)
        origin = figures.schedule_origin(frame)
        fig = figures.queue_timeline(
            policy,
            _steps(start).lazy(),
            None,
            frame["scheduled_at"].to_numpy(),
            origin=origin,
        )
        bars = next(t for t in fig.data if t.name == "arrivals (req/s)")
        firsts.append(float(bars.x[0]))
        for trace in fig.data:
            x = np.asarray(trace.x, dtype=float)
            assert 0.0 <= x.min() and x.max() <= RUN_S
        assert fig.layout.xaxis.title.text == (
            "seconds since the start of the schedule (0 = "
            + np.datetime_as_string(np.datetime64(int(start * 1000), "ms"), unit="ms")
            + "Z)"
        )
    assert firsts == pytest.approx([FIRST_OFFSET_S, FIRST_OFFSET_S])
    stall_frames = {
        p: pl.DataFrame(
            {"start_s": [s + 5.0, s + 9.0], "duration_s": [0.5, 0.7], "cause": ["other"] * 2}
        )
        for p, s in STARTS.items()
    }
    fig = figures.stalls_timeline(stall_frames, {p: s for p, s in STARTS.items()})
    assert [float(t.x[0]) for t in fig.data] == pytest.approx([5.0, 5.0])
    for trace, start in zip(fig.data, STARTS.values(), strict=True):
        assert _unix(trace.customdata[0]) == pytest.approx(start + 5.0)


def test_a_simulated_run_s_virtual_clock_is_unchanged():
    """Times already seconds from 0 (the virtual clock): offset 0, the same x values."""
    frame = _requests(0.0).drop("schedule_offset_s")
    origin = figures.schedule_origin(frame)
    assert origin == 0.0
    steps = _steps(0.0)
    fig = figures.queue_timeline(
        "sim", steps.lazy(), None, frame["scheduled_at"].to_numpy(), origin
    )
    line = next(t for t in fig.data if t.name == "waiting (max per bin)")
    assert float(line.x[0]) == pytest.approx(float(steps["execute_end"].min()))
    assert line.customdata[0] == f"clock {float(line.x[0]):.3f} s"
    assert fig.layout.xaxis.title.text == "seconds since the start of the schedule"
    stall = pl.DataFrame({"start_s": [3.25], "duration_s": [0.5], "cause": ["other"]})
    fig = figures.stalls_timeline({"sim": stall}, {"sim": origin})
    assert float(fig.data[0].x[0]) == pytest.approx(3.25)


def test_stalls_timeline_of_many_cells():
    """A row per cell however many: 12 cells (a tune's confirm run) once raised
    plotly's 'Vertical spacing cannot be greater than (1 / (rows - 1))'."""
    stall = pl.DataFrame({"start_s": [1.0], "duration_s": [0.5], "cause": ["other"]})
    fig = figures.stalls_timeline({f"cell{n}": stall for n in range(12)})
    assert fig is not None and len(fig.data) == 12


def test_hover_labels_of_missing_instants_say_so_without_a_numpy_warning():
    # Rows with no first token (rejected, cut) have no instant: np.nanmin of them all
    # leaked "RuntimeWarning: All-NaN slice encountered" onto the report's console.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert figures.absolute_times([np.nan, np.nan]) == ["–", "–"]
        labels = figures.absolute_times([1.7e9, np.nan])
        assert labels[0].endswith("(Unix 1700000000.000)") and labels[1] == "–"
        assert figures.absolute_times([3.0, np.nan]) == ["clock 3.000 s", "–"]
