"""Hypothesis fuzzing of request bodies and headers against one live server.

2,300 cases in all: completions, chat, /tokenize and /detokenize bodies built from valid
ones with fields replaced by random JSON (wrong types, huge and negative numbers, NaN,
nested junk), deleted, or joined by unknown keys; raw bytes; random X-Request-Id and
Authorization headers. Then every field of each route, alone, at each edge of its type
(int32, int64 and float bounds, 5,000-digit numbers, non-JSON literals, every other JSON
type): about 3,200 bodies. Every answer must be < 500, every error an OpenAI error body,
every 200 a well-formed completion, event stream or token list; afterwards the server is
healthy, idle, and holds no KV blocks.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.serving.tokenizer import HashTokenizer
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

MODEL = "tiny"
MAX_MODEL_LEN = 48


def fuzz(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


@pytest.fixture(scope="module")
def server():
    engine = sim_engine(step_s=0.0, num_device_blocks=64, max_model_len=MAX_MODEL_LEN)
    with BackgroundServer(engine, HashTokenizer(4096)) as live:
        yield live


@pytest.fixture(scope="module")
def http(server):
    client = HttpClient(server.url)
    yield client
    client.close()


# -- strategies --------------------------------------------------------------------------
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-3, 70)
    | st.integers(-(2**80), 2**80)
    | st.floats()
    | st.text(max_size=12)
)
json_values = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
words = st.sampled_from(["a", "hello", "halt", "wörld", "🙂", "<|user|>", "x" * 30])
text_prompt = st.lists(words, min_size=1, max_size=8).map(" ".join)

COMMON = {
    "model": st.just(MODEL),
    "max_tokens": st.integers(1, 6),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.sampled_from([-1, 0, 1, 40]),
    "seed": st.integers(0, 2**31),
    "stop": st.none() | st.just("halt") | st.lists(st.sampled_from(["halt", "a"]), max_size=2),
    "stop_token_ids": st.lists(st.integers(0, 4095), max_size=3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
    "min_tokens": st.integers(0, 1),
    "priority": st.integers(-5, 5),
    "n": st.just(1),
    "user": st.text(max_size=8),
}
COMPLETION = {
    **COMMON,
    "prompt": text_prompt | st.lists(st.integers(0, 4095), min_size=1, max_size=8),
}
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": text_prompt
        | st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": text_prompt}), max_size=2
        ),
    }
)
CHAT = {
    **COMMON,
    "messages": st.lists(message, min_size=1, max_size=3),
    "max_completion_tokens": st.integers(1, 6),
}


@st.composite
def bodies(draw, fields: dict, required: tuple[str, ...]) -> bytes:
    """A valid body, then: some fields replaced by random JSON, some deleted, unknown
    keys added; occasionally a top-level value that is not an object."""
    if draw(st.integers(0, 19)) == 0:
        return json.dumps(draw(json_values)).encode()
    body = {
        name: draw(strategy)
        for name, strategy in fields.items()
        if name in required or draw(st.booleans())
    }
    if not body.get("stream"):
        body.pop("stream_options", None)  # else most bodies fail on that one rule
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)):
        body[name] = draw(json_values)
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
        body.pop(name, None)
    body.update(draw(st.dictionaries(st.text(max_size=10), json_values, max_size=2)))
    return json.dumps(body).encode()  # NaN/Infinity are written as such: invalid JSON


@st.composite
def raw_bytes(draw) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=300))
    valid = json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2}).encode()
    cut = draw(st.integers(0, len(valid)))
    return valid[:cut] + draw(st.binary(max_size=8)) + valid[cut + draw(st.integers(0, 4)) :]


header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t"), max_size=140
)


# -- checks ------------------------------------------------------------------------------
def check(status: int, headers: dict, data: bytes) -> None:
    assert status < 500, (status, data[:300])
    if status >= 400:
        error = json.loads(data)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        return
    assert status == 200, (status, data[:300])
    if headers["content-type"].startswith("text/event-stream"):
        events = data.split(b"\n\n")
        assert events[-2:] == [b"data: [DONE]", b""], data[-300:]
        chunks = [json.loads(e[6:]) for e in events[:-2]]
        assert all("error" not in c for c in chunks), chunks
        assert len({c["id"] for c in chunks}) == 1
        assert any(
            c["choices"] and c["choices"][0]["finish_reason"] in ("stop", "length") for c in chunks
        )
    else:
        body = json.loads(data)
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        usage = body["usage"]
        assert 1 <= usage["completion_tokens"] <= MAX_MODEL_LEN
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def assert_idle_and_leak_free(server: BackgroundServer, http: HttpClient) -> None:
    deadline = time.monotonic() + 10
    while True:
        status, _, data = http.request("GET", "/health")
        health = json.loads(data)
        if (
            status == 200
            and health["num_in_flight"] == 0
            and health["num_unfinished"] == 0
            and health["num_free_device_blocks"] == health["num_device_blocks"]
        ):
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.02)
    assert health["num_engine_errors"] == 0 and health["num_failed_requests"] == 0


# -- the fuzz tests (900 + 500 + 350 + 250 + 300 = 2,300 cases) ---------------------------------
@pytest.mark.slow
def test_fuzz_completions(server, http):
    @fuzz(900)
    @given(body=bodies(COMPLETION, ("model", "prompt", "max_tokens")))
    def case(body: bytes) -> None:
        check(*http.request("POST", "/v1/completions", body, {"Content-Type": "application/json"}))

    case()
    assert_idle_and_leak_free(server, http)


def test_fuzz_chat(server, http):
    @fuzz(500)
    @given(body=bodies(CHAT, ("model", "messages", "max_tokens")))
    def case(body: bytes) -> None:
        check(*http.request("POST", "/v1/chat/completions", body))

    case()
    assert_idle_and_leak_free(server, http)


def test_fuzz_raw_bytes(server, http):
    @fuzz(350)
    @given(body=raw_bytes(), path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    def case(body: bytes, path: str) -> None:
        check(*http.request("POST", path, body, {"Content-Type": "application/octet-stream"}))

    case()
    assert_idle_and_leak_free(server, http)


def test_fuzz_headers(server, http):
    body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 1}).encode()

    @fuzz(250)
    @given(
        request_id=st.none() | header_text,
        auth=st.none() | header_text,
        content_type=st.none() | header_text,
    )
    def case(request_id, auth, content_type) -> None:
        headers = {
            name: value
            for name, value in (
                ("X-Request-Id", request_id),
                ("Authorization", auth),
                ("Content-Type", content_type),
            )
            if value is not None
        }
        status, response_headers, data = http.request("POST", "/v1/completions", body, headers)
        check(status, response_headers, data)
        given_id = (request_id or "").strip(" \t")
        if status == 200 and request_id is not None:
            assert response_headers["x-request-id"] == given_id

    case()
    assert_idle_and_leak_free(server, http)


# -- /tokenize and /detokenize -----------------------------------------------------------
TOKENIZE_FLAGS = {
    "model": st.just(MODEL),
    "add_special_tokens": st.booleans(),
    "return_token_strs": st.booleans(),
}
TOKENIZE_PROMPT = {**TOKENIZE_FLAGS, "prompt": text_prompt}
TOKENIZE_CHAT = {
    **TOKENIZE_FLAGS,
    "messages": st.lists(message, min_size=1, max_size=3),
    "add_generation_prompt": st.booleans(),
    "continue_final_message": st.booleans(),
    "chat_template": st.none() | st.text(max_size=8),
    "tools": st.just([]),
}
DETOKENIZE = {
    "model": st.just(MODEL),
    "tokens": st.lists(st.integers(0, 4095) | st.integers(-(2**70), 2**70), max_size=8),
}


def check_tokenize(path: str, status: int, headers: dict, data: bytes) -> None:
    assert status < 500, (status, data[:300])
    answer = json.loads(data)
    if status >= 400:
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
    elif path == "/tokenize":
        assert status == 200 and answer["count"] == len(answer["tokens"]), answer
        assert answer["token_strs"] is None or len(answer["token_strs"]) == answer["count"]
    else:
        assert status == 200 and isinstance(answer["prompt"], str), answer


def test_fuzz_tokenize(server, http):
    @fuzz(300)
    @given(
        case=st.one_of(
            st.tuples(st.just("/tokenize"), bodies(TOKENIZE_PROMPT, ("prompt",))),
            st.tuples(st.just("/tokenize"), bodies(TOKENIZE_CHAT, ("messages",))),
            st.tuples(st.just("/detokenize"), bodies(DETOKENIZE, ("tokens",))),
            st.tuples(st.sampled_from(["/tokenize", "/detokenize"]), raw_bytes()),
        )
    )
    def case(case: tuple[str, bytes]) -> None:
        path, body = case
        check_tokenize(path, *http.request("POST", path, body))

    case()
    assert_idle_and_leak_free(server, http)


# -- every field at the edges of its type -------------------------------------------------
#: Raw JSON: the bounds of int32, int64 and beyond (one literal longer than Python's
#: default int-parsing limit of 4,300 digits), float32's and float64's, subnormals,
#: literals JSON forbids, and every other JSON type.
EXTREMES = [
    "0", "-1", "1", "2", "2147483647", "2147483648", "-2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "18446744073709551616", "1" * 5000, "-" + "9" * 400,
    "1.0", "0.5", "-0.0", "1e-46", "1e-320", "5e-324", "3.4e38", "3.5e38", "1e308",
    "1.7976931348623157e308", "-1.7976931348623157e308", "1e999", "-1e999",
    "NaN", "Infinity", "-Infinity", "true", "false", "null", '""', '"1"',
    '"' + "x" * 5000 + '"', '"\\ud800"', "[]", "[1, 2]", '["a"]', "[[]]", "{}", '{"a": 1}',
]  # fmt: skip
BASE = {
    "/v1/completions": {"model": MODEL, "prompt": "a b", "max_tokens": 2},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
    "/tokenize": {"model": MODEL, "prompt": "a b"},
    "/detokenize": {"model": MODEL, "tokens": [5, 6]},
}
SAMPLING_FIELDS = [
    *sorted(COMMON),
    *("best_of", "echo", "suffix", "logprobs", "top_logprobs", "logit_bias"),
    *("frequency_penalty", "presence_penalty", "repetition_penalty", "min_p"),
    *("length_penalty", "prompt_logprobs", "use_beam_search", "response_format"),
]
FIELDS = {
    "/v1/completions": ["prompt", *SAMPLING_FIELDS],
    "/v1/chat/completions": ["messages", "max_completion_tokens", *SAMPLING_FIELDS],
    "/tokenize": ["model", "prompt", "add_special_tokens", "return_token_strs"],
    "/detokenize": ["model", "tokens"],
}


def with_field(base: dict, name: str, raw: str) -> bytes:
    """``base`` with ``name`` set to the raw JSON ``raw`` (appended, so it wins)."""
    rest = json.dumps({k: v for k, v in base.items() if k != name})
    return (rest[:-1] + f', "{name}": {raw}}}').encode()


@pytest.mark.parametrize("path", list(FIELDS))
def test_every_field_at_the_edges_of_its_type_is_answered_below_500(server, http, path):
    """Each field of the route, alone, at each of the extremes: a 4xx naming the
    problem, or a well-formed answer; never a 5xx. And as an element of the arrays a
    prompt, a chat and the token ids are made of."""
    cases = [(name, raw) for name in FIELDS[path] for raw in EXTREMES]
    bodies_sent = [with_field(BASE[path], name, raw) for name, raw in cases]
    if path == "/v1/completions":
        bodies_sent += [with_field(BASE[path], "prompt", f"[{raw}]") for raw in EXTREMES]
        bodies_sent += [with_field(BASE[path], "stop_token_ids", f"[{raw}]") for raw in EXTREMES]
    if path == "/v1/chat/completions":
        for raw in EXTREMES:
            bodies_sent.append(with_field(BASE[path], "messages", f"[{raw}]"))
            message = f'[{{"role": "user", "content": {raw}}}]'
            bodies_sent.append(with_field(BASE[path], "messages", message))
            bodies_sent.append(with_field(BASE[path], "messages", f'[{{"role": {raw}}}]'))
    if path == "/detokenize":
        bodies_sent += [with_field(BASE[path], "tokens", f"[{raw}]") for raw in EXTREMES]
    for body in bodies_sent:
        status, headers, data = http.request("POST", path, body)
        try:
            if path.startswith("/v1/"):
                check(status, headers, data)
            else:
                check_tokenize(path, status, headers, data)
        except AssertionError as exc:
            raise AssertionError(f"{body[:200]!r}: {exc}") from exc
    print(f"{path}: {len(bodies_sent)} bodies")
    assert_idle_and_leak_free(server, http)
