"""The streaming OpenAI client and its per-request measurement (runs under gevent).

``OpenAIClient.send(spec, scheduled_at, ...)`` posts one request to
``/v1/completions`` or ``/v1/chat/completions`` with ``stream: true`` and
``stream_options.include_usage`` (and ``continuous_usage_stats`` where the server has
it), reads the server-sent events as they arrive and returns the request's row
(``records.RECORD_COLUMNS``). Definitions: docs/metrics.md, docs/loadgen.md.

Token counting: with continuous usage, a chunk whose usage says k more completion
tokens carries k tokens; otherwise a chunk with non-empty text carries one. Tokens
that arrive together are 0 s apart in ``itl_s`` (so ``len(itl_s) == tokens - 1`` and
``mean(itl_s) == tpot_s``). The final usage chunk is the token count of record.

Two transports: ``fast`` (geventhttpclient, one keep-alive connection pool, the
default) and ``requests`` (what Locust's ``HttpUser`` uses), kept so that
``benchmarks/bench_loadgen.py`` can compare them. On ``fast``, a request whose pooled
connection the server had closed before any byte of a response is sent once more on a
fresh connection (harness/loadgen/keepalive.py; the row's ``retried``).

``probe`` runs once per process before the start; it chooses the prompts
(harness/loadgen/prompt_choice.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from harness.loadgen.clock import unix_now
from harness.loadgen.prompt_choice import PromptChoice, choose
from harness.loadgen.prompts import DEFAULT_ID_RANGE, TextSizer, chat_messages, token_ids

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


class TransportError(Exception):
    """The connection failed or broke (no HTTP answer, or a cut stream). ``stale``: it
    failed on a pooled keep-alive connection the server had closed before answering any
    byte (harness/loadgen/keepalive.py): sending it again on a fresh one is safe."""

    def __init__(self, message: str, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


class _FastResponse:
    def __init__(self, response) -> None:
        self._r = response
        self.status = response.status_code
        self.headers = {k.lower(): v for k, v in response.items()}

    def lines(self):
        """Body lines (without the line end) as they arrive."""
        readline = self._r.readline
        while True:
            line = readline(b"\n")
            if not line:
                return
            yield line.rstrip(b"\r\n")

    def read(self) -> bytes:
        return self._r.read()

    def discard(self) -> None:
        """Close the connection (a stream we stop reading cannot be reused)."""
        r = self._r
        sock, pool = getattr(r, "_sock", None), getattr(r, "_pool", None)
        if sock is not None and pool is not None:
            pool.release_socket(sock)
        r._sock = None
        r._pool = None

    def release(self) -> None:
        """Give the connection back to the pool. The stream is read to its end first:
        after ``[DONE]`` the chunked body's last chunk may not have been parsed yet, and
        geventhttpclient closes, rather than pools, a connection whose message it has not
        seen end (so keep-alive reuse depended on how the final bytes were split)."""
        try:
            self._r.read()
        except Exception:  # noqa: BLE001 - a broken tail: the connection cannot be reused
            self.discard()
            return
        self._r.release()


class FastTransport:
    """geventhttpclient: a pool of keep-alive connections, cheap parsing in C."""

    name = "fast"

    def __init__(self, base_url: str, concurrency: int, timeout_s: float) -> None:
        from geventhttpclient import HTTPClient
        from geventhttpclient.response import HTTPConnectionClosed

        from harness.loadgen.keepalive import ReuseWatch

        self._closed_error = HTTPConnectionClosed
        parts = urlsplit(base_url)
        self.prefix = parts.path.rstrip("/")
        self._client = HTTPClient(
            parts.hostname,
            parts.port,
            ssl=parts.scheme == "https",
            concurrency=concurrency,
            connection_timeout=min(timeout_s, 30.0),
            network_timeout=timeout_s,
        )
        self._reuse = ReuseWatch(self._client._connection_pool)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict, fresh: bool = False
    ) -> _FastResponse:
        """Send; ``fresh``: on a new connection, not a pooled one."""
        try:
            with self._reuse.fresh(fresh):
                return _FastResponse(
                    self._client.request(method, self.prefix + path, body, headers)
                )
        except Exception as e:  # noqa: BLE001 - every transport failure is a row, not a crash
            # geventhttpclient raises HTTPConnectionClosed only when no byte came back
            stale = isinstance(e, self._closed_error) and self._reuse.reused
            raise TransportError(f"{type(e).__name__}: {e}", stale=stale) from e

    def close(self) -> None:
        self._client.close()


class _RequestsResponse:
    def __init__(self, response) -> None:
        self._r = response
        self.status = response.status_code
        self.headers = {k.lower(): v for k, v in response.headers.items()}

    def lines(self):
        yield from self._r.iter_lines(chunk_size=None)

    def read(self) -> bytes:
        return self._r.content

    def discard(self) -> None:
        self._r.close()

    def release(self) -> None:
        self._r.close()


class RequestsTransport:
    """requests (urllib3), as Locust's HttpUser: for comparison in the benchmark."""

    name = "requests"

    def __init__(self, base_url: str, concurrency: int, timeout_s: float) -> None:
        import requests
        from requests.adapters import HTTPAdapter

        self.base = base_url.rstrip("/")
        self._session = requests.Session()
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=concurrency)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._timeout = timeout_s

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict, fresh: bool = False
    ):
        """Send (``fresh`` is ignored: urllib3's pool does not say what it reused)."""
        try:
            return _RequestsResponse(
                self._session.request(
                    method,
                    self.base + path,
                    data=body,
                    headers=headers,
                    stream=True,
                    timeout=self._timeout,
                )
            )
        except Exception as e:  # noqa: BLE001
            raise TransportError(f"{type(e).__name__}: {e}") from e

    def close(self) -> None:
        self._session.close()


TRANSPORTS = {"fast": FastTransport, "requests": RequestsTransport}


def traceparent() -> str:
    """A fresh W3C trace context, sampled: a new trace id for every request."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def error_message(body: bytes) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:500]
    except (ValueError, UnicodeDecodeError):
        pass
    return body[:500].decode("utf-8", "replace")


@dataclass
class ServerInfo:
    """What the start-up probes found."""

    model: str
    continuous_usage: bool
    clock_epoch_unix: float | None
    tokenize: bool
    probe_requests: int
    #: the prompts chosen (--prompt-mode, harness/loadgen/prompt_choice.py)
    prompts: PromptChoice | None = None


class OpenAIClient:
    """Builds, sends and measures requests for one process."""

    def __init__(
        self,
        transport,
        *,
        endpoint: str,
        model: str,
        api_key: str = "",
        prompt_mode: str = "token_ids",
        id_range: tuple[int, int] = DEFAULT_ID_RANGE,
        continuous_usage: bool = True,
        sizer: TextSizer | None = None,
        profile_name: str = "",
        run_id: str = "",
        worker: int = 0,
    ) -> None:
        self.transport = transport
        self.endpoint = endpoint
        self.path = CHAT if endpoint == "chat" else COMPLETIONS
        self.model = model
        self.prompt_mode = "text" if endpoint == "chat" else prompt_mode
        self.id_range = id_range
        self.continuous_usage = continuous_usage
        self.sizer = sizer
        self.profile_name = profile_name
        self.run_id = run_id
        self.worker = worker
        self.base_headers = {"Content-Type": "application/json"}
        if api_key:
            self.base_headers["Authorization"] = f"Bearer {api_key}"

    # -- bodies ---------------------------------------------------------------------
    def prompt_method(self) -> str:
        if self.prompt_mode == "token_ids":
            return "token_ids"
        return self.sizer.method if self.sizer is not None else "estimate"

    def body(self, spec) -> dict:
        n_out = spec.output_tokens
        body = {
            "model": self.model,
            "max_tokens": n_out,
            "min_tokens": n_out,
            "ignore_eos": True,
            "priority": spec.priority,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
        if self.prompt_mode == "token_ids":
            body["prompt"] = token_ids(spec.request_id, spec.prompt_tokens, *self.id_range)
        else:
            text = (
                self.sizer.text(spec.request_id, spec.prompt_tokens)
                if self.sizer
                else " ".join(["the"] * spec.prompt_tokens)
            )
            if self.endpoint == "chat":
                body["messages"] = chat_messages(text)
            else:
                body["prompt"] = text
        return body

    # -- one request ----------------------------------------------------------------
    def new_row(self, spec, phase_kind: str, scheduled_at: float, in_flight_capped: bool) -> dict:
        return {
            "request_id": spec.request_id,
            "run_id": self.run_id,
            "profile": self.profile_name,
            "class": spec.class_name,
            "priority": spec.priority,
            "phase": spec.phase,
            "phase_kind": phase_kind,
            "prompt_tokens": spec.prompt_tokens,
            "server_prompt_tokens": None,
            "prompt_method": self.prompt_method(),
            "output_tokens": None,
            "max_tokens": spec.output_tokens,
            "status": "aborted",
            "http_status": None,
            "error": None,
            "finish_reason": None,
            "schedule_offset_s": spec.scheduled_at,
            "scheduled_at": scheduled_at,
            "sent_at": None,
            "first_token_at": None,
            "last_token_at": None,
            "ttft_s": None,
            "ttft_from_sent_s": None,
            "tpot_s": None,
            "e2e_s": None,
            "e2e_from_sent_s": None,
            "max_itl_s": None,
            "itl_s": [],
            "send_lag_s": None,
            "token_counting": "usage" if self.continuous_usage else "chunks",
            "worker": self.worker,
            "in_flight_capped": in_flight_capped,
            "retried": False,
        }

    def send(self, row: dict, spec) -> float | None:
        """Send ``spec``, filling ``row`` as it goes (so a caller that kills this
        greenlet still holds what was measured). Returns the 429's Retry-After (s)."""
        payload = json.dumps(self.body(spec), separators=(",", ":")).encode()
        headers = {
            **self.base_headers,
            "X-Request-Id": spec.request_id,
            "X-Request-Class": spec.class_name,
            "traceparent": traceparent(),
        }
        now = unix_now
        row["sent_at"] = sent = now()
        row["send_lag_s"] = sent - row["scheduled_at"]
        try:
            response = self.transport.request("POST", self.path, payload, headers)
        except TransportError as e:
            if not e.stale:
                row.update(status="error", error=str(e))
                return None
            # The server had closed the pooled connection: it never took the request.
            row["retried"] = True
            try:
                response = self.transport.request("POST", self.path, payload, headers, fresh=True)
            except TransportError as again:
                row.update(
                    status="error",
                    error=f"{again} (sent again on a fresh connection after: {e})"[:500],
                )
                return None
        row["http_status"] = response.status
        if response.status != 200:
            try:
                message = error_message(response.read())
            except Exception as e:  # noqa: BLE001
                message = f"{type(e).__name__}: {e}"
                response.discard()
            row["error"] = message
            if response.status == 429:
                row["status"] = "rejected"
                try:
                    return float(response.headers.get("retry-after", "1"))
                except ValueError:
                    return 1.0
            row["status"] = "error"
            return None
        self._read_stream(row, response, now)
        return None

    def _read_stream(self, row: dict, response, now) -> None:
        itl = row["itl_s"]
        counted = 0
        last = None
        usage_seen = 0
        done = False
        continuous = self.continuous_usage
        chat = self.endpoint == "chat"
        try:
            for line in response.lines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                t = now()
                obj = json.loads(data)
                if "error" in obj:
                    row["status"] = "error"
                    row["error"] = str(obj["error"].get("message", obj["error"]))[:500]
                    continue
                choices = obj.get("choices") or ()
                usage = obj.get("usage")
                k = 0
                if choices:
                    choice = choices[0]
                    if choice.get("finish_reason"):
                        row["finish_reason"] = choice["finish_reason"]
                    if continuous and usage:
                        ct = usage.get("completion_tokens", 0)
                        k, usage_seen = ct - usage_seen, ct
                    else:
                        text = (
                            (choice.get("delta") or {}).get("content")
                            if chat
                            else choice.get("text")
                        )
                        k = 1 if text else 0
                elif usage:  # the final usage chunk: the count of record
                    row["output_tokens"] = usage.get("completion_tokens")
                    row["server_prompt_tokens"] = usage.get("prompt_tokens")
                    if continuous and usage.get("completion_tokens", 0) > usage_seen:
                        k = usage["completion_tokens"] - usage_seen
                        usage_seen = usage["completion_tokens"]
                if k > 0:
                    if last is None:
                        row["first_token_at"] = t
                    else:
                        itl.append(t - last)
                    if k > 1:
                        itl.extend([0.0] * (k - 1))
                    last = t
                    counted += k
        except Exception as e:  # noqa: BLE001 - a cut stream is an aborted row
            response.discard()
            row["status"] = "aborted"
            row["error"] = f"stream broken: {type(e).__name__}: {e}"[:500]
            self._finish(row, last, counted)
            return
        if not done:
            response.discard()
            if row["status"] != "error":
                row["status"] = "aborted"
                row["error"] = row["error"] or "stream ended before [DONE]"
        else:
            response.release()
            if row["status"] != "error":
                row["status"] = "ok"
        self._finish(row, last, counted)

    @staticmethod
    def _finish(row: dict, last: float | None, counted: int) -> None:
        if row["output_tokens"] is None:
            row["output_tokens"] = counted
        if last is None:
            return
        row["last_token_at"] = last
        first, sched, sent = row["first_token_at"], row["scheduled_at"], row["sent_at"]
        row["ttft_s"] = first - sched
        row["ttft_from_sent_s"] = first - sent
        row["e2e_s"] = last - sched
        row["e2e_from_sent_s"] = last - sent
        n = row["output_tokens"]
        if n and n > 1:
            row["tpot_s"] = (row["e2e_s"] - row["ttft_s"]) / (n - 1)
        row["max_itl_s"] = max(row["itl_s"]) if row["itl_s"] else None


def probe(
    transport, *, endpoint: str, model: str, api_key: str, prompt_mode: str, continuous: str
) -> tuple[ServerInfo, TextSizer | None]:
    """Ask the server (once per process, before the run): the model and its
    ``max_model_len`` (/v1/models), its clock epoch (/health), the prompts to send
    (``prompt_mode`` token_ids|text|auto: harness/loadgen/prompt_choice.py; auto asks
    /tokenize and may send one 1-token request), /tokenize for text prompts, and whether
    streams take ``continuous_usage_stats`` (one 2-token request, id
    ``schedscope-probe-<pid>``; ``continuous`` is auto|on|off, and only auto sends it)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def call(method, path, body=None, extra=None):
        try:
            r = transport.request(
                method,
                path,
                None if body is None else json.dumps(body).encode(),
                {**headers, **(extra or {})},
            )
            data = r.read()
            r.release()
            return r.status, data
        except (TransportError, Exception):  # noqa: BLE001
            return None, b""

    status, data = call("GET", "/v1/models")
    models = []
    if status == 200:
        try:
            models = json.loads(data)["data"]
        except (ValueError, KeyError, TypeError):
            models = []
    if not model:
        if not models:
            raise RuntimeError(
                f"cannot read the model from {transport.__class__.__name__} "
                f"/v1/models (status {status}); pass --model"
            )
        model = models[0]["id"]
    card = next((m for m in models if isinstance(m, dict) and m.get("id") == model), {})
    max_model_len = card.get("max_model_len") if isinstance(card, dict) else None
    epoch = None
    status, data = call("GET", "/health")
    if status == 200:
        try:
            epoch = json.loads(data).get("clock_epoch_unix")
        except (ValueError, AttributeError):
            epoch = None
    probes = 0

    def tokenize_ids(text: str) -> list[int] | None:
        st, d = call("POST", "/tokenize", {"model": model, "prompt": text})
        try:
            tokens = json.loads(d).get("tokens") if st == 200 else None
        except (ValueError, AttributeError):
            return None
        return [int(t) for t in tokens] if isinstance(tokens, list) and tokens else None

    def accepts(ids: list[int]) -> tuple[bool, str]:
        nonlocal probes
        probes += 1
        body = {"model": model, "prompt": ids, "max_tokens": 1, "stream": False}
        st, d = call(
            "POST", COMPLETIONS, body, {"X-Request-Id": f"schedscope-vocab-probe-{os.getpid()}"}
        )
        if st == 200:
            return True, ""
        return False, (f"{st}: {error_message(d)}" if st is not None else "no answer")[:200]

    prompts = choose(prompt_mode, endpoint, tokenize_ids, accepts, max_model_len)
    if continuous == "auto":
        body = {
            "model": model,
            "max_tokens": 2,
            "min_tokens": 2,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if endpoint == "chat":
            body["messages"] = chat_messages("probe")
        elif prompts.mode == "token_ids":
            body["prompt"] = token_ids("probe", 4, *prompts.id_range)
        else:
            body["prompt"] = "probe"
        h = {**headers, "X-Request-Id": f"schedscope-probe-{os.getpid()}"}
        try:
            r = transport.request(
                "POST", CHAT if endpoint == "chat" else COMPLETIONS, json.dumps(body).encode(), h
            )
            probes += 1
            data = r.read()
            r.release()
            has = r.status == 200 and any(
                line.startswith(b"data: {")
                and b'"choices":[{' in line.replace(b" ", b"")
                and b'"usage":{' in line.replace(b" ", b"")
                for line in data.split(b"\n")
            )
        except TransportError:
            has = False
        cont = has
    else:
        cont = continuous == "on"
    sizer = None
    tokenize = False
    if endpoint == "chat" or prompts.mode == "text":

        def count(text: str) -> int | None:
            body = (
                {"model": model, "messages": chat_messages(text)}
                if endpoint == "chat"
                else {"model": model, "prompt": text}
            )
            st, d = call("POST", "/tokenize", body)
            return json.loads(d)["count"] if st == 200 else None

        tokenize = count("probe") is not None
        sizer = TextSizer(count if tokenize else None)
    return ServerInfo(model, cont, epoch, tokenize, probes, prompts), sizer
