"""The dashboards built as code (harness/grafana/dashboards.py): the committed JSON is what the
generator writes, it loads back through grafana-foundation-sdk, every panel explains itself,
every query parses (promtool) and names only metrics that exist, and panels over names that
differ between vLLM V0 and V1 query both generations."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.grafana import dashboards
from tests.support.components import promtool
from tests.support.paths import REPO

ROOT = REPO
DASHBOARD_DIR = ROOT / "dashboards"

# The metric names the engine exposes (docs/metrics.md). An independent copy:
# a typo in a panel query must not be "fixed" by the same typo here.
SHARED = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
}
SHARED_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
}
V0_ONLY = {"vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:num_requests_swapped"}
V0_ONLY_HISTOGRAMS = {"vllm:time_per_output_token_seconds"}
V1_ONLY = {
    "vllm:kv_cache_usage_perc",
    "vllm:num_requests_waiting_by_reason",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_by_source_total",
    "vllm:prompt_tokens_cached_total",
}
V1_ONLY_HISTOGRAMS = {
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_num_preemptions",
    "vllm:request_prefill_kv_computed_tokens",
}
SCHEDSCOPE = {
    "schedscope_decisions_total",
    "schedscope_preemptions_total",
    "schedscope_swap_fallbacks_total",
    "schedscope_stalls_total",
    "schedscope_idle_running_sequences",
    "schedscope_idle_running_sequence_steps_total",
    "schedscope_swap_bytes_total",
    "schedscope_swap_blocks_total",
    "schedscope_recomputed_tokens_total",
    "schedscope_prefix_cache_evicted_blocks_total",
    "schedscope_prefix_cache_evicted_prefix_tokens_total",
    "schedscope_prefix_cache_queries_by_turn_total",
    "schedscope_prefix_cache_hits_by_turn_total",
    "schedscope_kv_blocks_free",
    "schedscope_kv_blocks_capacity",
    "schedscope_token_budget_tokens",
    "schedscope_scheduler_config_info",
    "schedscope_dropped_spans_total",
}
SCHEDSCOPE_HISTOGRAMS = {
    "schedscope_stall_duration_seconds",
    "schedscope_queue_time_seconds",
    "schedscope_step_duration_seconds",
    "schedscope_batch_tokens",
}
HISTOGRAMS = SHARED_HISTOGRAMS | V0_ONLY_HISTOGRAMS | V1_ONLY_HISTOGRAMS | SCHEDSCOPE_HISTOGRAMS
PLAIN = SHARED | V0_ONLY | V1_ONLY | SCHEDSCOPE
# A V0 name and the V1 name(s) that replaced it: a query over one must also query the other.
RENAMED = {
    "vllm:gpu_cache_usage_perc": {"vllm:kv_cache_usage_perc"},
    "vllm:time_per_output_token_seconds": {
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    },
}
KNOBS = (
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--swap-space",
    "--gpu-memory-utilization",
    "--preemption-mode",
    "--scheduling-policy",
    "--aging-rate",
    "--max-wait-s",
)

METRIC = re.compile(r"\b(vllm:[a-z0-9_:]+|schedscope_[a-z0-9_]+)")


def committed(uid: str) -> Path:
    return DASHBOARD_DIR / dashboards.dashboard_filename(uid)


def all_panels() -> list[tuple[str, dict]]:
    return [
        (uid, panel)
        for uid in dashboards.DASHBOARDS
        for panel in dashboards.dashboard_dict(uid)["panels"]
        if panel["type"] != "row"
    ]


def metric_names(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


@pytest.mark.parametrize("uid", list(dashboards.DASHBOARDS))
def test_committed_json_is_what_the_generator_writes(uid):
    path = committed(uid)
    assert path.exists(), f"{path} is missing: run `schedscope dashboards build`"
    assert path.read_text(encoding="utf-8") == dashboards.dashboard_text(uid), (
        f"{path.relative_to(ROOT)} is stale (harness/grafana/dashboards.py changed): "
        "run `schedscope dashboards build` and commit the result"
    )


def test_build_command_writes_the_committed_files(tmp_path):
    result = CliRunner().invoke(app, ["dashboards", "build", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted(dashboards.dashboard_filename(uid) for uid in dashboards.DASHBOARDS)
    for uid in dashboards.DASHBOARDS:
        assert (tmp_path / "out" / dashboards.dashboard_filename(uid)).read_text() == committed(
            uid
        ).read_text()


@pytest.mark.parametrize("uid", list(dashboards.DASHBOARDS))
def test_json_round_trips_through_the_sdk(uid):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel
    from grafana_foundation_sdk.models.prometheus import Dataquery

    register_default_plugins()
    data = json.loads(committed(uid).read_text())
    model = Dashboard.from_json(data)
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == data
    assert model.uid == uid
    for panel in model.panels:
        assert isinstance(panel, Panel | RowPanel)
        if isinstance(panel, Panel):
            assert panel.targets and all(isinstance(t, Dataquery) for t in panel.targets)


def test_uids_and_ids_are_unique_and_stable():
    for uid in dashboards.DASHBOARDS:
        data = dashboards.dashboard_dict(uid)
        assert data["uid"] == uid and 8 <= len(uid) <= 40
        ids = [p["id"] for p in data["panels"]]
        assert len(ids) == len(set(ids))
        refs = [(p["id"], t["refId"]) for p in data["panels"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs))


def test_variables_are_datasource_model_name_and_instance():
    for uid in dashboards.DASHBOARDS:
        variables = {v["name"]: v for v in dashboards.dashboard_dict(uid)["templating"]["list"]}
        assert set(variables) == {"datasource", "model_name", "instance"}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for name in ("model_name", "instance"):
            assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        for _, panel in all_panels():
            assert panel["datasource"]["uid"] == "${datasource}"


def test_every_panel_says_healthy_unhealthy_engines_and_a_knob():
    for uid, panel in all_panels():
        text = panel.get("description", "")
        where = f"{uid} / {panel['title']}"
        assert text.strip(), f"{where}: no description"
        assert "Healthy:" in text and "Unhealthy:" in text, f"{where}: healthy/unhealthy shapes"
        assert "Engines:" in text, f"{where}: which engines fill it"
        assert any(knob in text for knob in KNOBS), f"{where}: names no knob"


def test_every_panel_with_exemplars_says_they_are_schedscope_only():
    """vLLM exposes no exemplars: a panel whose dots link to traces must say a real vLLM
    fills its series but not its dots (and a panel without exemplars must not)."""
    with_exemplars = 0
    for uid, panel in all_panels():
        text = panel["description"]
        where = f"{uid} / {panel['title']}"
        if any(t.get("exemplar") for t in panel["targets"]):
            with_exemplars += 1
            assert "schedscope-only" in text and "exemplar" in text, where
            assert "a real vLLM fills this panel's series but not its exemplar dots" in text, where
        else:
            assert "schedscope-only" not in text, where
    assert with_exemplars >= 6  # the stall-length panel and the five latency panels


def test_every_query_is_scoped_by_the_variables():
    for query in dashboards.panel_queries(raw=True):
        for selector in re.findall(r"(?:vllm:|schedscope_)[a-z0-9_:]+(\{[^}]*\})?", query.expr):
            assert (
                'model_name=~"$model_name"' in selector and 'instance=~"$instance"' in selector
            ), f"{query.panel_title}/{query.ref_id}: {query.expr}"


def test_every_metric_a_panel_queries_exists():
    seen = set()
    for query in dashboards.panel_queries():
        for name in metric_names(query.expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name != base:
                assert base in HISTOGRAMS, f"{query.panel_title}: {name} is not a histogram series"
            else:
                assert name in PLAIN, f"{query.panel_title}: unknown metric {name}"
            seen.add(base)
    # The traps' metrics are on a panel.
    for needed in (
        "schedscope_idle_running_sequences",
        "schedscope_recomputed_tokens_total",
        "schedscope_queue_time_seconds",
        "schedscope_swap_fallbacks_total",
    ):
        assert needed in seen


def test_v0_v1_renamed_metrics_are_queried_together():
    for query in dashboards.panel_queries():
        names = {re.sub(r"_(bucket|sum|count)$", "", n) for n in metric_names(query.expr)}
        for v0, v1s in RENAMED.items():
            if v0 in names or names & v1s:
                assert v0 in names and names & v1s and " or " in query.expr, (
                    f"{query.panel_title}/{query.ref_id} queries one generation only: {query.expr}"
                )


def test_generation_only_metrics_are_named_in_the_description():
    for _, panel in all_panels():
        names = {
            re.sub(r"_(bucket|sum|count)$", "", n)
            for t in panel["targets"]
            for n in metric_names(t["expr"])
        }
        text = panel["description"]
        if names & (V0_ONLY | V0_ONLY_HISTOGRAMS):
            assert "V0" in text, panel["title"]
        if names & (V1_ONLY | V1_ONLY_HISTOGRAMS):
            assert "V1" in text, panel["title"]


def test_latency_quantiles_use_histogram_quantile_with_exemplars():
    latency = {
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    }
    found = set()
    for query in dashboards.panel_queries():
        names = {re.sub(r"_bucket$", "", n) for n in metric_names(query.expr)}
        if names & latency:
            found |= names & latency
            assert "histogram_quantile(" in query.expr and "_bucket{" in query.expr
            assert "rate(" in query.expr
            assert query.exemplar, f"{query.panel_title}/{query.ref_id}: exemplars off"
    assert found == latency


def test_panel_queries_substitutes_every_variable():
    queries = dashboards.panel_queries()
    assert queries and all("$" not in q.expr for q in queries)
    assert any("[1m]" in q.expr for q in queries)
    concrete = dashboards.panel_queries(
        {"model_name": "tiny", "instance": "127.0.0.1:8000", "__rate_interval": "30s"}
    )
    assert all('model_name=~"tiny"' in q.expr for q in concrete if "model_name=~" in q.expr)
    assert any("[30s]" in q.expr for q in concrete)
    raw = dashboards.panel_queries(raw=True)
    assert [q.expr for q in raw] != [q.expr for q in queries]
    assert any("$__rate_interval" in q.expr for q in raw)
    with pytest.raises(KeyError, match=r"\$nope"):
        dashboards.substitute('up{a="$nope"}', dashboards.DEFAULT_SUBSTITUTIONS)
    assert dashboards.substitute('x{a=~"${model_name}"}', {"model_name": "m"}) == 'x{a=~"m"}'


def _check_rules(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess:
    # promtool cannot parse a lone expression: each one becomes a recording rule.
    rules = [{"record": f"schedscope_dashboard_query_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard_queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.prometheus
def test_every_query_parses_with_promtool(tmp_path):
    queries = dashboards.panel_queries()
    result = _check_rules(tmp_path, [q.expr for q in queries])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


@pytest.mark.prometheus
def test_promtool_check_catches_a_broken_query(tmp_path):
    result = _check_rules(
        tmp_path, ["sum by (le (rate(vllm:e2e_request_latency_seconds_bucket[1m]))"]
    )
    assert result.returncode != 0
