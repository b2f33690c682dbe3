"""Upload the dashboards to a running Grafana over its HTTP API (grafana-client).

Idempotent by uid: every dashboard is posted with ``overwrite: true``, so a second push
replaces the first (a new version of the same dashboard). Failures are a
:class:`PushError` whose message names what is wrong: the URL (unreachable, not Grafana)
or the token (rejected, lacking permission). The token is never printed or logged; any
text that could echo it back is redacted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlparse

import niquests.exceptions
from grafana_client import GrafanaApi
from grafana_client.client import (
    GrafanaClientError,
    GrafanaException,
    GrafanaServerError,
    GrafanaTimeoutError,
    GrafanaUnauthorizedError,
)

from harness.records.redact import MASK, redact_url

TOKEN_ENV = "GRAFANA_TOKEN"


class PushError(Exception):
    """A push that could not complete; the message says which input is at fault."""


@dataclass(frozen=True)
class PushResult:
    uid: str
    title: str
    version: int | None
    url: str | None


def push_dashboards(
    grafana_url: str,
    token: str | None,
    dashboards: Iterable[dict],
    *,
    folder_uid: str | None = None,
    timeout_s: float = 10.0,
) -> list[PushResult]:
    """Post each dashboard JSON model to ``grafana_url`` (``/api/dashboards/db``, overwrite).

    ``token`` is a Grafana service-account token or API key (sent as ``Authorization:
    Bearer``); ``None`` pushes without credentials (a Grafana with anonymous editors).
    """
    shown = redact_url(grafana_url)  # the URL as messages name it: no password
    try:
        parsed = urlparse(grafana_url)
        scheme: str | None = parsed.scheme
        hostname, password = parsed.hostname, parsed.password
        parsed.port  # noqa: B018 - raises on a port out of range
    except ValueError:  # a bad port or IPv6 literal
        scheme = hostname = password = None
    if scheme not in ("http", "https") or not hostname:
        raise PushError(
            f"--grafana-url {shown!r} is not an http(s) URL (e.g. http://localhost:3000)"
        )
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise PushError(f"--timeout-s {timeout_s!r}: must be a number of seconds > 0")
    api = GrafanaApi.from_url(grafana_url, credential=token or None, timeout=timeout_s)
    redact = _redactor(token, password)
    grafana_url = shown

    try:
        info = api.health.check()
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message naming its cause
        raise PushError(
            redact(_explain(exc, grafana_url, token, "GET /api/frontend/settings"))
        ) from None
    if not isinstance(info, dict) or "version" not in info:
        raise PushError(
            f"{grafana_url} does not look like Grafana: GET /api/frontend/settings "
            "answered without Grafana's buildInfo (check --grafana-url, including any "
            "path prefix)"
        )

    results = []
    for model in dashboards:
        payload: dict = {
            "dashboard": {**model, "id": None},
            "overwrite": True,
            "message": "schedscope dashboards push",
        }
        if folder_uid:
            payload["folderUid"] = folder_uid
        try:
            answer = api.dashboard.update_dashboard(payload)
        except Exception as exc:  # noqa: BLE001
            raise PushError(
                redact(
                    _explain(
                        exc, grafana_url, token, f"POST /api/dashboards/db (uid {model.get('uid')})"
                    )
                )
            ) from None
        answer = answer if isinstance(answer, dict) else {}
        results.append(
            PushResult(
                uid=str(answer.get("uid", model.get("uid")) or ""),
                title=model.get("title", ""),
                version=answer.get("version"),
                url=answer.get("url"),
            )
        )
    return results


def _explain(exc: Exception, url: str, token: str | None, what: str) -> str:
    token_hint = (
        f"the token in {TOKEN_ENV}"
        if token
        else f"{TOKEN_ENV} is not set and the request had no credentials"
    )
    if isinstance(exc, GrafanaUnauthorizedError):
        return (
            f"Grafana at {url} rejected the credentials (401 Unauthorized on {what}): {token_hint}"
        )
    if isinstance(exc, GrafanaClientError) and exc.status_code == 403:
        return (
            f"Grafana at {url} refused {what} (403 Forbidden): {token_hint} lacks permission "
            "(dashboards need an Editor or Admin service-account token)"
        )
    if isinstance(exc, GrafanaClientError) and exc.status_code == 404:
        return (
            f"{url} does not look like Grafana: {what} returned 404 (check --grafana-url, "
            "including any path prefix)"
        )
    if isinstance(exc, GrafanaClientError):
        return f"Grafana at {url} refused {what}: {exc.message}"
    if isinstance(exc, GrafanaServerError):
        return f"Grafana at {url} failed on {what}: {exc.message}"
    if isinstance(exc, GrafanaTimeoutError):
        return f"Grafana at {url} did not answer {what} in time (check --grafana-url)"
    if isinstance(exc, niquests.exceptions.ConnectionError):
        reason = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(exc))
        return (
            f"cannot connect to Grafana at {url} (check --grafana-url): "
            f"{reason.group(1).strip() if reason else _short(exc)}"
        )
    if isinstance(exc, json.JSONDecodeError | ValueError | AttributeError):
        # AttributeError: grafana-client's health check read a text/* answer as a dict.
        return f"{url} does not look like Grafana: {what} did not answer JSON (check --grafana-url)"
    if isinstance(exc, GrafanaException | niquests.exceptions.RequestException):
        return f"request to Grafana at {url} failed on {what}: {_short(exc)}"
    raise exc


def _short(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "..."


def _redactor(*secrets: str | None):
    """Masks each secret wherever a library's message may have put it."""

    def redact(text: str) -> str:
        for secret in secrets:
            if secret:
                text = text.replace(secret, MASK)
        return text

    return redact
