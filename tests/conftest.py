"""Marks what each test needs beyond Python, so `make test-fast` can leave it out.

The markers are declared in pyproject.toml. A whole file is marked where every test in
it needs the component; single tests by name where only some do. A test that needs a
real component it cannot find fails in CI and skips elsewhere (tests/support/components.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.unpatched_locust import import_unpatched

# Before any test module is collected: a module that imports Locust must not patch the
# whole test process with gevent (tests/support/unpatched_locust.py).
import_unpatched()

TESTS = Path(__file__).resolve().parent

#: File (relative to tests/) -> markers of every test in it.
FILE_MARKS: dict[str, tuple[str, ...]] = {
    # the bundled torch model computes (forward passes, a served torch engine)
    "engine/worker/test_model.py": ("torch_model",),
    "engine/worker/test_model_runner.py": ("torch_model",),
    "engine/worker/test_weights.py": ("torch_model",),
    "engine/worker/test_model_on_device.py": ("torch_model",),
    "engine/worker/test_swap_copies.py": ("torch_model",),
    "engine/worker/test_decode_graphs.py": ("torch_model",),
    "engine/worker/test_host_memory.py": ("torch_model", "slow"),
    "engine/sim/test_calibration.py": ("torch_model", "slow"),
    "engine/api/test_server_torch.py": ("torch_model", "slow"),
    # a real Prometheus scrapes a served engine
    "engine/telemetry/test_prometheus_proof.py": ("prometheus", "slow"),
    # a report opened in headless chromium, over runs made for it
    "harness/report/test_report_e2e.py": ("chromium", "slow"),
    # servers and load generators in subprocesses, under load
    "engine/api/test_server_cli.py": ("slow",),
    "engine/api/test_server_load.py": ("slow",),
    "engine/api/test_server_nothing_lost.py": ("slow",),
    "engine/serving/test_engine_process.py": ("slow",),
    "engine/serving/test_engine_supervision.py": ("slow",),
    "engine/serving/test_faults_served.py": ("slow",),
    "engine/sim/test_served_path.py": ("slow",),
    "engine/telemetry/test_metrics_served.py": ("slow",),
    "engine/telemetry/test_spans_served.py": ("slow",),
    "harness/loadgen/test_loadgen.py": ("slow",),
    "harness/loadgen/test_loadgen_profiles.py": ("slow",),
    "harness/loadgen/test_distributed.py": ("slow",),
    "harness/loadgen/test_distributed_rogue.py": ("slow",),
    "harness/run/test_run.py": ("slow",),
    "harness/run/test_run_target_vocabulary.py": ("slow",),
    "harness/run/test_run_target_external.py": ("slow",),
    "harness/run/test_run_target_hostile.py": ("slow",),
    "harness/tune/test_tune_confirm.py": ("slow",),
    "harness/calibration/test_served_calibration_sim.py": ("slow",),
    "harness/calibration/test_served_calibration_knobs.py": ("slow",),
    "test_architecture.py": ("slow",),
}

#: Folder (relative to tests/) -> markers of every test under it.
FOLDER_MARKS: dict[str, tuple[str, ...]] = {
    # a real vLLM in its own virtualenv (`make test-vllm`; `make test` leaves these out)
    "vllm/": ("vllm", "slow"),
}

#: (file, test name) -> markers of that test alone.
TEST_MARKS: dict[tuple[str, str], tuple[str, ...]] = {
    # the longest property and queueing-theory runs (~10-20 s each on 2 cores): the
    # whole suite runs them, the edit-test loop does not
    (
        "engine/core/test_scheduler_properties.py",
        "test_random_workloads_keep_invariants_and_finish_every_request",
    ): ("slow",),
    ("harness/simulate/test_simulator.py", "test_fcfs_single_server_matches_pollaczek_khinchine"): (
        "slow",
    ),
    ("engine/api/test_server_fuzz.py", "test_fuzz_completions"): ("slow",),
    # a `schedscope serve` subprocess that refuses to start (the unit tests stay fast)
    (
        "harness/calibration/test_served_calibration.py",
        "test_a_server_that_refuses_to_start_fails_the_calibration_with_its_words",
    ): ("slow",),
    # live `schedscope serve` subprocesses (the unit tests of these files stay fast)
    (
        "engine/serving/test_metrics_scrapers.py",
        "test_many_scrapers_neither_stall_the_engine_nor_make_it_render_more",
    ): ("slow",),
    (
        "engine/serving/test_metrics_scrapers.py",
        "test_an_engine_nobody_scrapes_any_more_stops_rendering",
    ): ("slow",),
    (
        "engine/serving/test_lost_records.py",
        "test_a_full_disk_loses_only_its_record_file_and_the_exit_code_says_so",
    ): ("slow",),
    (
        "engine/serving/test_lost_records.py",
        "test_an_engine_process_killed_keeps_its_records_up_to_the_last_flush",
    ): ("slow",),
    (
        "engine/serving/test_lost_records.py",
        "test_an_engine_process_killed_before_its_first_flush_is_a_failed_exit",
    ): ("slow",),
    ("harness/run/test_run.py", "test_served_torch_two_policies"): ("torch_model",),
    ("harness/tune/test_tune_confirm.py", "test_confirm_serves_with_the_torch_executor"): (
        "torch_model",
    ),
    ("harness/tune/test_search.py", "test_a_process_pool_gives_the_same_search_as_one_worker"): (
        "slow",
    ),
    ("harness/tune/test_tune_cli.py", "test_the_search_is_deterministic_for_a_seed"): ("slow",),
    (
        "harness/run/test_run.py",
        "test_prometheus_scrapes_the_cell_and_its_series_become_metrics_parquet",
    ): ("prometheus",),
    (
        "harness/run/test_metrics_at_load_end.py",
        "test_prometheus_waits_for_a_scrape_after_the_load",
    ): ("prometheus",),
    (
        "harness/bench/test_bench_steadiness.py",
        "test_the_steps_are_the_shapes_run_in_turn_on_the_runner",
    ): ("torch_model",),
    ("harness/bench/test_bench_steadiness.py", "test_a_run_too_short_for_a_median_says_so"): (
        "torch_model",
    ),
    (
        "engine/api/test_server_cli.py",
        "test_the_serving_line_is_the_first_line_on_stdout_with_the_torch_executor",
    ): ("torch_model",),
    ("engine/serving/test_engine_process.py", "test_both_engine_cores_serve_the_same_tokens"): (
        "torch_model",
    ),
}


@pytest.fixture(autouse=True, scope="session")
def _private_cost_model_store(tmp_path_factory: pytest.TempPathFactory):
    """The store of fitted cost models (harness/costmodel/store.py) in a directory of this
    session's, for every test and the subprocesses they start: no test reads or writes
    the user's cache, and simulations see no fit unless a test stores one."""
    from harness.costmodel.store import STORE_ENV

    before = os.environ.get(STORE_ENV)
    os.environ[STORE_ENV] = str(tmp_path_factory.mktemp("cost-model-store"))
    yield
    if before is None:
        os.environ.pop(STORE_ENV, None)
    else:
        os.environ[STORE_ENV] = before


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A table entry for a file that moved would silently mark nothing.
    stale = [
        f
        for f in {*FILE_MARKS, *FOLDER_MARKS, *(f for f, _ in TEST_MARKS)}
        if not (TESTS / f).exists()
    ]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py marks files that do not exist: {stale}")
    for item in items:
        relative = item.path.resolve().relative_to(TESTS).as_posix()
        name = getattr(item, "originalname", item.name)
        marks = FILE_MARKS.get(relative, ()) + TEST_MARKS.get((relative, name), ())
        marks += tuple(m for f, ms in FOLDER_MARKS.items() if relative.startswith(f) for m in ms)
        if "promtool" in name:  # runs Debian's promtool
            marks += ("prometheus",)
        for mark in marks:
            item.add_marker(getattr(pytest.mark, mark))
