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

What a target sends is checked before it is recorded
(harness/loadgen/target_values.py): a usage count that is not a count, a count beyond
what was asked, a chunk that is not JSON make that request's row an ``error`` naming the
field; lines and bodies are read within bounds (harness/loadgen/body_lines.py), so
neither a record nor the generator's memory grows with what a target claims.

``probe`` runs once per process before the start; it chooses the prompts
(harness/loadgen/prompt_choice.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

from harness.loadgen import target_values as tv
from harness.loadgen.body_lines import bounded_lines
from harness.loadgen.clock import unix_now
from harness.loadgen.prompt_choice import PromptChoice, choose
from harness.loadgen.prompts import (
    DEFAULT_ID_RANGE,
    TextSizer,
    chat_messages,
    segment_ids,
    segment_words,
    token_ids,
)
from harness.profiles.prompt_layout import salted, segments

#: The fields of every generated request beside its model, prompt, lengths and priority:
#: exactly that many tokens, streamed with the usage; no ``temperature`` (the server's
#: default sampling). The light replay client (open_loop_client.py) sends the same.
REQUEST_FIELDS: dict = {
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
#: A model id from /v1/models longer than this is not taken (it is sent in every body).
MAX_MODEL_NAME_CHARS = 1000


class TransportError(Exception):
    """The connection failed or broke (no HTTP answer, or a cut stream). ``stale``: it
    failed on a pooled keep-alive connection the server had closed before answering any
    byte (harness/loadgen/keepalive.py): sending it again on a fresh one is safe."""

    def __init__(self, message: str, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


#: What is read of a stream after its ``[DONE]`` before the connection is pooled again.
TAIL_BYTES = 64 << 10


def _read_at_most(response, limit: int) -> bytes:
    """The body, or its first ``limit`` bytes; a longer body's connection is closed (it
    cannot be pooled with the rest unread)."""
    data = bytearray()
    for piece in response.pieces():
        data += piece
        if len(data) > limit:
            response.discard()
            return bytes(data[:limit])
    return bytes(data)


class _FastResponse:
    def __init__(self, response, closed_error=ConnectionError) -> None:
        self._r = response
        self._closed_error = closed_error
        self.status = response.status_code
        self.headers = {k.lower(): v for k, v in response.items()}

    def pieces(self):
        """The body as it arrives, in the pieces the socket gives (geventhttpclient's
        ``readline`` loop, without its unbounded search for a line end)."""
        r = self._r
        while True:
            buffer = r._body_buffer
            if buffer:
                piece = bytes(buffer)
                del buffer[:]
                yield piece
                continue
            if r.message_complete:
                return
            sock = r._sock
            if sock is None:
                raise self._closed_error("connection closed.")
            try:
                r.feed(sock.recv(r.block_size))
            except BaseException:
                r.release()
                raise

    def lines(self, max_bytes: int = tv.MAX_LINE_BYTES):
        """Body lines (without the line end) as they arrive; LineTooLong past
        ``max_bytes``."""
        return bounded_lines(self.pieces(), max_bytes)

    def read(self, limit: int) -> bytes:
        """The body, or its first ``limit`` bytes (the connection then is not reused)."""
        return _read_at_most(self, limit)

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
        seen end (so keep-alive reuse depended on how the final bytes were split). A tail
        longer than TAIL_BYTES is not read: the connection is closed instead."""
        try:
            tail = 0
            for piece in self.pieces():
                tail += len(piece)
                if tail > TAIL_BYTES:
                    self.discard()
                    return
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
        if parts.hostname is None:
            raise ValueError(f"no host in {base_url!r}")
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
                    self._client.request(method, self.prefix + path, body, headers),
                    self._closed_error,
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

    def pieces(self):
        """The body as it arrives (urllib3's ``read1``: what is there, up to 64 KiB;
        ``iter_lines`` would buffer a line, or a chunk, however long)."""
        read1 = self._r.raw.read1
        while True:
            piece = read1(64 << 10, decode_content=True)
            if not piece:
                return
            yield piece

    def lines(self, max_bytes: int = tv.MAX_LINE_BYTES):
        return bounded_lines(self.pieces(), max_bytes)

    def read(self, limit: int) -> bytes:
        return _read_at_most(self, limit)

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


#: An error body's message (kept under this name for its callers).
error_message = tv.error_message


#: The statuses of a request the server refused before starting it: a full queue's 429,
#: vLLM's admission caps' 503 (--max-num-queued-reqs/-tokens; a draining server's too).
#: The row is ``rejected``; the user waits the answer's Retry-After (1 s without one).
REFUSED = (429, 503)


def retry_after_s(value: str | None) -> float:
    """A 429's Retry-After in seconds: 1 s when absent, an HTTP date, negative or not a
    finite number (a NaN would reach a sleep)."""
    try:
        seconds = float(value if value is not None else "1")
    except ValueError:
        return 1.0
    return seconds if math.isfinite(seconds) and seconds >= 0 else 1.0


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
    def prompt_method(self, spec=None) -> str:
        """How the prompt was sized: ``token_ids``, or text sized with ``tokenize`` or
        ``estimate`` (one token per word); a session's turn is always text (chat)."""
        if self.prompt_mode == "token_ids" and (spec is None or spec.session_id is None):
            return "token_ids"
        return self.sizer.method if self.sizer is not None else "estimate"

    def body(self, spec, messages: list[dict] | None = None) -> dict:
        """The request's JSON body. Its prompt is laid out as the spec says
        (harness/profiles/prompt_layout.py), each segment's content keyed by this run's
        id as well (``salted``), so that a later run against the same server does not find
        this one's prompts in its prefix cache; ``messages``: a session turn's whole
        conversation (chat), built by the caller."""
        n_out = spec.output_tokens
        body = {
            **REQUEST_FIELDS,
            "stream_options": dict(REQUEST_FIELDS["stream_options"]),  # added to below
            "model": self.model,
            "max_tokens": n_out,
            "min_tokens": n_out,
            "priority": spec.priority,
        }
        if self.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
        salt = self.run_id
        if messages is not None:
            body["messages"] = messages
        elif self.prompt_mode == "token_ids":
            body["prompt"] = segment_ids(segments(spec), salt, *self.id_range)
        elif not spec.shared:
            key = salted(spec.request_id, salt)
            text = (
                self.sizer.text(key, spec.prompt_tokens)
                if self.sizer
                else " ".join(["the"] * spec.prompt_tokens)
            )
            if self.endpoint == "chat":
                body["messages"] = chat_messages(text)
            else:
                body["prompt"] = text
        else:
            shared = " ".join(self.segment_text(key, n) for key, n in spec.shared)
            own = self.segment_text(spec.request_id, spec.own_tokens)
            if self.endpoint == "chat":
                body["messages"] = chat_messages(own, system=shared)
            else:
                body["prompt"] = f"{shared} {own}" if own else shared
        return body

    def segment_text(self, key: str, tokens: int) -> str:
        """The words of one segment of a prompt (a system prompt, a message)."""
        m = self.sizer.segment_num_words(tokens) if self.sizer else tokens
        return segment_words(key, self.run_id, m)

    def session_messages(self, spec, history: list[dict]) -> list[dict]:
        """A session turn's chat messages: its system prompt (if any), ``history`` (the
        earlier turns' user messages and the answers received, in order), its new
        message."""
        messages = [
            {"role": "system", "content": self.segment_text(key, n)} for key, n in spec.shared
        ]
        messages += history
        messages.append(
            {"role": "user", "content": self.segment_text(spec.request_id, spec.own_tokens)}
        )
        return messages

    # -- one request ----------------------------------------------------------------
    def new_row(self, spec, phase_kind: str, scheduled_at: float, in_flight_capped: bool) -> dict:
        """The row of ``spec`` before it is sent (``aborted`` until its end says more)."""
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
            "cached_tokens": None,
            "prompt_method": self.prompt_method(spec),
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
            "cut_at": None,
            "session_id": spec.session_id,
            "turn": spec.turn,
        }

    def send(
        self,
        row: dict,
        spec,
        messages: list[dict] | None = None,
        answer: list[str] | None = None,
    ) -> float | None:
        """Send ``spec``, filling ``row`` as it goes (so a caller that kills this
        greenlet still holds what was measured). Returns the 429's Retry-After (s).
        ``messages``: a session turn's conversation; ``answer``: where the text of the
        answer is collected (a session's next turn sends it back)."""
        payload = json.dumps(self.body(spec, messages), separators=(",", ":")).encode()
        path = CHAT if messages is not None else self.path  # a session's turns are chat
        headers = {
            **self.base_headers,
            "X-Request-Id": spec.request_id,
            "X-Request-Class": spec.class_name,
            "traceparent": traceparent(),
        }
        if spec.turn is not None:  # the engine's prefix-cache hit rate by turn
            headers["X-Session-Turn"] = str(spec.turn)
        now = unix_now
        row["sent_at"] = sent = now()
        row["send_lag_s"] = sent - row["scheduled_at"]
        try:
            response = self.transport.request("POST", path, payload, headers)
        except TransportError as e:
            if not e.stale:
                row.update(status="error", error=tv.clean_text(str(e)))
                return None
            # The server had closed the pooled connection: it never took the request.
            row["retried"] = True
            try:
                response = self.transport.request("POST", path, payload, headers, fresh=True)
            except TransportError as again:
                row.update(
                    status="error",
                    error=tv.clean_text(f"{again} (sent again on a fresh connection after: {e})"),
                )
                return None
        row["http_status"] = response.status
        if response.status != 200:
            try:
                message = tv.error_message(response.read(tv.ERROR_BODY_BYTES))
            except Exception as e:  # noqa: BLE001
                message = tv.clean_text(f"{type(e).__name__}: {e}")
                response.discard()
            row["error"] = message
            if response.status in REFUSED:
                row["status"] = "rejected"
                return retry_after_s(response.headers.get("retry-after"))
            row["status"] = "error"
            return None
        self._read_stream(
            row, response, now, spec.output_tokens, spec.prompt_tokens, answer, path == CHAT
        )
        return None

    def _read_stream(
        self,
        row: dict,
        response,
        now,
        max_tokens: int,
        prompt_tokens: int = 0,
        answer: list[str] | None = None,
        chat: bool | None = None,
    ) -> None:
        """Read the stream into ``row``. Whatever the target claims, at most
        ``max_tokens`` tokens are counted (so ``itl_s`` holds at most ``max_tokens - 1``
        gaps): a count beyond it, a value that is no count, a chunk that is not JSON, a
        line or body beyond its bound end the request as an ``error`` naming it
        (harness/loadgen/target_values.py)."""
        itl = row["itl_s"]
        counted = 0
        last = None
        usage_seen = 0
        done = False
        continuous = self.continuous_usage
        if chat is None:
            chat = self.endpoint == "chat"
        body_limit = tv.body_limit(max_tokens)
        prompt_limit = tv.prompt_limit(prompt_tokens)
        received = 0
        try:
            for line in response.lines(tv.MAX_LINE_BYTES):
                received += len(line) + 1
                if received > body_limit:
                    raise tv.BadTargetValue(
                        f"target sent more than {body_limit} bytes for {max_tokens} tokens"
                    )
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                t = now()
                chunk = tv.parse_chunk(data, chat)
                if chunk.error is not None:
                    row["status"] = "error"
                    row["error"] = chunk.error
                    continue
                ct = chunk.completion_tokens
                if ct is not None and ct > max_tokens:
                    raise tv.BadTargetValue(
                        f"target sent usage.completion_tokens {tv.shown(ct)}: more than the "
                        f"{max_tokens} max_tokens asked"
                    )
                pt = chunk.prompt_tokens
                if pt is not None and pt > prompt_limit:
                    raise tv.BadTargetValue(
                        f"target sent usage.prompt_tokens {tv.shown(pt)}: more than "
                        f"{prompt_limit} for a prompt of {prompt_tokens} tokens"
                    )
                k = 0
                by_usage = False  # k is the target's own count, not one per text chunk
                if answer is not None and chunk.content:
                    answer.append(chunk.content)
                if chunk.choice:
                    if chunk.finish_reason:
                        row["finish_reason"] = chunk.finish_reason
                    if continuous and chunk.usage:
                        if ct is not None:
                            k, usage_seen, by_usage = ct - usage_seen, ct, True
                    else:
                        k = 1 if chunk.text else 0
                elif chunk.usage:  # the final usage chunk: the count of record
                    row["output_tokens"] = ct
                    row["server_prompt_tokens"] = pt
                    row["cached_tokens"] = chunk.cached_tokens
                    if continuous and ct is not None and ct > usage_seen:
                        k, usage_seen, by_usage = ct - usage_seen, ct, True
                if k > 0:
                    if counted + k > max_tokens:
                        if by_usage:  # the target's own count: a claim beyond what was asked
                            raise tv.BadTargetValue(
                                f"target sent {counted + k} tokens: more than the "
                                f"{max_tokens} max_tokens asked"
                            )
                        # Counted by chunks, a text chunk is not always a new token (held
                        # back stop-string text flushed at the end): the request still
                        # ends when its content does, but the count and itl_s stay within
                        # max_tokens (the extra time joins the last gap).
                        if itl:
                            itl[-1] += t - last
                        last = t
                        continue
                    if last is None:
                        row["first_token_at"] = t
                    else:
                        itl.append(t - last)
                    if k > 1:
                        itl.extend([0.0] * (k - 1))
                    last = t
                    counted += k
        except tv.BadTargetValue as e:  # the target's fault: this request is an error
            response.discard()
            row["status"] = "error"
            row["error"] = tv.clean_text(str(e))
            self._finish(row, last, counted)
            return
        except Exception as e:  # noqa: BLE001 - a cut stream is an aborted row
            response.discard()
            row["status"] = "aborted"
            row["error"] = tv.clean_text(f"stream broken: {type(e).__name__}: {e}")
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
    transport,
    *,
    endpoint: str,
    model: str,
    api_key: str,
    prompt_mode: str,
    continuous: str,
    model_flag: str = "--model",
) -> tuple[ServerInfo, TextSizer | None]:
    """Ask the server (once per process, before the run): the model and its
    ``max_model_len`` (/v1/models), its clock epoch (/health), the prompts to send
    (``prompt_mode`` token_ids|text|auto: harness/loadgen/prompt_choice.py; auto asks
    /tokenize and may send one 1-token request), /tokenize for text prompts, and whether
    streams take ``continuous_usage_stats`` (one 2-token request, id
    ``schedscope-probe-<pid>``; ``continuous`` is auto|on|off, and only auto sends it).

    ``RuntimeError`` when no ``model`` is given and /v1/models names none: a server that
    did not answer at all is said to be that (with the connection's error), one that
    answered is told to ``model_flag``, the caller's option for the model name."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    unanswered: list[str] = []  # why each call that got no HTTP answer got none

    def call(method, path, body=None, extra=None):
        try:
            r = transport.request(
                method,
                path,
                None if body is None else json.dumps(body).encode(),
                {**headers, **(extra or {})},
            )
            data = r.read(tv.PROBE_BODY_BYTES)
            r.release()
            return r.status, data
        except Exception as exc:  # noqa: BLE001 - no answer, whatever broke
            why = str(exc) if isinstance(exc, TransportError) else f"{type(exc).__name__}: {exc}"
            unanswered.append(why)
            return None, b""

    def answer(status, data) -> dict:
        """A probe's JSON object ({} for anything else: the probes' values are checked
        one by one, as a stream's are)."""
        if status != 200:
            return {}
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return {}
        return obj if isinstance(obj, dict) else {}

    models_status, models_body = call("GET", "/v1/models")
    models = answer(models_status, models_body).get("data")
    models = [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    if not model:
        if models_status is None:
            raise RuntimeError(
                f"the server did not answer GET /v1/models: {tv.clean_text(unanswered[-1])}"
            )
        first = models[0].get("id") if models else None
        if not isinstance(first, str) or not first or len(first) > MAX_MODEL_NAME_CHARS:
            raise RuntimeError(
                f"cannot read the model from {transport.__class__.__name__} "
                f"/v1/models (first id: {tv.shown(first)}); pass {model_flag}"
            )
        model = first
    card: dict = next((m for m in models if m.get("id") == model), {})
    max_model_len = card.get("max_model_len")
    if type(max_model_len) is not int or max_model_len <= 0:
        max_model_len = None
    epoch = answer(*call("GET", "/health")).get("clock_epoch_unix")
    if not tv.is_number(epoch) or not math.isfinite(epoch):
        epoch = None
    probes = 0

    def tokenize_ids(text: str) -> list[int] | None:
        tokens = answer(*call("POST", "/tokenize", {"model": model, "prompt": text})).get("tokens")
        if not isinstance(tokens, list) or not tokens:
            return None
        if any(type(t) is not int or t < 0 for t in tokens):
            return None  # not token ids: as if there were no /tokenize
        return tokens

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
            body["prompt"] = token_ids("probe", 4, *(prompts.id_range or DEFAULT_ID_RANGE))
        else:
            body["prompt"] = "probe"
        h = {**headers, "X-Request-Id": f"schedscope-probe-{os.getpid()}"}
        try:
            r = transport.request(
                "POST", CHAT if endpoint == "chat" else COMPLETIONS, json.dumps(body).encode(), h
            )
            probes += 1
            data = r.read(tv.PROBE_BODY_BYTES)
            r.release()
            has = r.status == 200 and any(
                line.startswith(b"data: {")
                and b'"choices":[{' in line.replace(b" ", b"")
                and b'"usage":{' in line.replace(b" ", b"")
                for line in data.split(b"\n")
            )
        except Exception:  # noqa: BLE001 - a probe that breaks: no continuous usage
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
            n = answer(*call("POST", "/tokenize", body)).get("count")
            try:
                return tv.token_count(n, "count")
            except tv.BadTargetValue:
                return None  # no count: as if there were no /tokenize

        tokenize = count("probe") is not None
        sizer = TextSizer(count if tokenize else None)
    return ServerInfo(model, cont, epoch, tokenize, probes, prompts), sizer
