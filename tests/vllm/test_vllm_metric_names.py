"""Every ``vllm:`` family the bundled engine exposes that vLLM V1 also exposes has the same
type, label names and histogram buckets in both ``/metrics`` texts (read with
prometheus_client's text parser); the families only one side has, and the one label
difference, are exactly the ones docs/metrics.md lists ("Against a real vLLM")."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.serve.local_server import CliServer, HttpClient
from tests.support.vllm_server import SERVED_MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: The bundled engine's vLLM V0 names (vLLM's published dashboard reads them), which V1
#: no longer has (docs/metrics.md "V0 only").
ONLY_BUNDLED = {
    "vllm:cpu_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:num_requests_swapped",
    "vllm:time_per_output_token_seconds",
    "vllm:gpu_prefix_cache_hit_rate",
}
#: vLLM V1's families the bundled engine has no counterpart for: a KV connector's
#: external prefix cache, multimodal caches, sleep mode and the FLOPs/bytes estimates.
ONLY_VLLM = {
    "vllm:engine_sleep_state",
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
    "vllm:external_prefix_cache_hits",
    "vllm:external_prefix_cache_queries",
    "vllm:mm_cache_hits",
    "vllm:mm_cache_queries",
    "vllm:prompt_tokens_cached_by_source",
}
#: vllm:cache_config_info's labels are each engine's cache config: the shared ones,
#: then what only each side has.
CACHE_INFO = "vllm:cache_config_info"
CACHE_INFO_ONLY_BUNDLED = {"num_cpu_blocks_override", "swap_space", "watermark"}


def families(text: str) -> dict:
    """name -> family, ``vllm:`` only; ``*_created`` timestamps left out (schedscope drops
    them when it scrapes, docs/run.md)."""
    return {
        f.name: f
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }


def label_names(family) -> set[str]:
    return {name for sample in family.samples for name in sample.labels} - {"le"}


def buckets(family) -> list[float]:
    return sorted({float(s.labels["le"]) for s in family.samples if "le" in s.labels})


def exercise(url: str) -> bytes:
    """A few finished requests (every labelled series exists), then ``/metrics``."""
    client = HttpClient(url)
    try:
        for prompt in ("the of and", "to in is that for it"):
            status, _, raw = client.post_json(
                "/v1/completions",
                {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 4},
            )
            assert status == 200, raw
        status, _, raw = client.request("GET", "/metrics")
        assert status == 200
        return raw
    finally:
        client.close()


def test_shared_vllm_names_have_the_same_type_labels_and_buckets(vllm_server):
    with CliServer(["--executor", "sim", "--served-model-name", SERVED_MODEL_NAME]) as bundled:
        ours = families(exercise(bundled.url).decode())
    theirs = families(exercise(vllm_server.url).decode())

    assert set(ours) - set(theirs) == ONLY_BUNDLED
    assert set(theirs) - set(ours) == ONLY_VLLM
    shared = sorted(set(ours) & set(theirs))
    assert len(shared) >= 20, shared
    differences = []
    for name in shared:
        a, b = ours[name], theirs[name]
        if a.type != b.type:
            differences.append(f"{name}: type {a.type} here, {b.type} in vLLM")
        if buckets(a) != buckets(b):
            differences.append(f"{name}: buckets {buckets(a)} here, {buckets(b)} in vLLM")
        if name == CACHE_INFO:
            assert label_names(a) - label_names(b) == CACHE_INFO_ONLY_BUNDLED
            assert {"engine", "block_size", "cache_dtype", "num_gpu_blocks"} <= label_names(b)
        elif label_names(a) != label_names(b):
            differences.append(
                f"{name}: labels {sorted(label_names(a))} here, {sorted(label_names(b))} in vLLM"
            )
    assert not differences, "\n".join(differences)
