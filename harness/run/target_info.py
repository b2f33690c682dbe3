"""What a ``--target`` says of itself, read before and after its cell's load and kept
in the cell's run.json as ``target_info`` (``{"before": ..., "after": ...}``): the
engine (``/v1/models``' ``owned_by``), its version (``/version``), the model sent and its
``max_model_len``. ``schedscope calibrate --from-run`` keys the target's cost model by
them, and refuses a run whose target changed between the two reads (a restart with
another version or model: its steps would be of two engines).

Nothing from the target is trusted: each answer is read up to :data:`MAX_BODY_BYTES`,
must be a JSON object, and each value kept is a short plain string or a positive int;
anything else is recorded as unknown (None), with the reason in ``problems``.
"""

from __future__ import annotations

import json
import urllib.request

from harness.loadgen import target_values as tv

#: The most of an answer read (a /v1/models of a server with many models fits).
MAX_BODY_BYTES = 1 << 20
#: Seconds each GET may take.
TIMEOUT_S = 5.0


def _get(url: str, headers: dict) -> tuple[dict | None, str | None]:
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            body = response.read(MAX_BODY_BYTES)
    except Exception as exc:  # noqa: BLE001 - any failure is "unknown", said
        return None, tv.clean_text(f"{type(exc).__name__}: {exc}", 200)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None, "not JSON"
    return (data, None) if isinstance(data, dict) else (None, "not a JSON object")


def _short(value: object) -> str | None:
    """A plain string of at most 128 printable characters, else None."""
    if not isinstance(value, str) or not value or len(value) > 128:
        return None
    return value if value.isprintable() else None


def read_target_info(url: str, api_key: str | None = None, model: str | None = None) -> dict:
    """``{engine, version, model, max_model_len, problems}`` of the server at ``url``;
    ``model``: the one the run sends (default: the first /v1/models lists)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    problems = []
    version_body, problem = _get(base + "/version", headers)
    if problem:
        problems.append(f"/version: {problem}")
    models_body, problem = _get(base + "/v1/models", headers)
    if problem:
        problems.append(f"/v1/models: {problem}")
    cards = (models_body or {}).get("data")
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    card = next((c for c in cards if model and c.get("id") == model), cards[0] if cards else {})
    length = card.get("max_model_len")
    return {
        "engine": _short(card.get("owned_by")),
        "version": _short((version_body or {}).get("version")),
        "model": _short(model) or _short(card.get("id")),
        "max_model_len": length if type(length) is int and length > 0 else None,
        "problems": problems,
    }
