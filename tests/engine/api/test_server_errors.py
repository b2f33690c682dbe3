"""Every client mistake is a 4xx with an OpenAI error body that names the problem;
401, 404, 405, 409, 413 and 429 each on their own path.

One in-process server with an API key, a 256 KiB body limit, max_model_len 64, a KV
pool of 2 blocks x 16 tokens (so 33..64-token requests can never fit), one running
sequence and one waiting slot (so a third concurrent request gets 429).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.api.server import ServerSettings
from engine.serving.tokenizer import HashTokenizer
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def server():
    engine = sim_engine(
        step_s=0.01, num_device_blocks=2, max_model_len=64, max_num_seqs=1, max_waiting=1
    )
    settings = ServerSettings(
        host="127.0.0.1", port=0, api_key=KEY, max_body_bytes=LIMIT, shutdown_timeout_s=1.0
    )
    with BackgroundServer(engine, HashTokenizer(4096), settings) as live:
        yield live


@pytest.fixture()
def http(server):
    client = HttpClient(server.url)
    yield client
    client.close()


def assert_error(status: int, body: bytes, expected_status: int, fragment: str = "") -> dict:
    assert status == expected_status, body
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    assert fragment.lower() in error["message"].lower(), error["message"]
    return error


def ok(**fields) -> dict:
    return {"model": "tiny", "prompt": "hello world", "max_tokens": 2, **fields}


BAD_COMPLETIONS = [
    (b"not json", "not valid JSON"),
    (b"", "empty"),
    (b"\xff\xfe{}", "UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"model": "tiny", "prompt": "a", "max_tokens": NaN}', "NaN"),
    (b'{"model": "tiny", "prompt": "a", "max_tokens": 1' + b"0" * 5000 + b"}", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"model": "tiny", "prompt": "\\ud800 x", "max_tokens": 1}', "surrogate"),
    (json.dumps({"prompt": "a"}).encode(), "model"),
    (json.dumps({"model": "tiny"}).encode(), "prompt"),
    (json.dumps({"model": 7, "prompt": "a"}).encode(), "model must be a string"),
    (json.dumps(ok(max_tokens="ten")).encode(), "max_tokens must be an integer"),
    (json.dumps(ok(max_tokens=True)).encode(), "max_tokens must be an integer, got boolean"),
    (json.dumps(ok(max_tokens=2.0)).encode(), "max_tokens must be an integer"),
    (json.dumps(ok(max_tokens=0)).encode(), "max_tokens must be >= 1"),
    (json.dumps(ok(max_tokens=-5)).encode(), "max_tokens must be >= 1"),
    (json.dumps(ok(max_tokens=10**30)).encode(), "max_tokens"),
    (json.dumps(ok(temperature=-0.1)).encode(), "temperature must be >= 0"),
    (b'{"model": "tiny", "prompt": "a", "temperature": 1e400}', "finite"),
    (json.dumps(ok(temperature="hot")).encode(), "temperature must be a number"),
    (json.dumps(ok(top_p=0)).encode(), "top_p must be in (0, 1]"),
    (json.dumps(ok(top_p=1.5)).encode(), "top_p must be in (0, 1]"),
    (json.dumps(ok(top_k=-2)).encode(), "top_k"),
    (json.dumps(ok(seed=2**70)).encode(), "seed"),
    (json.dumps(ok(priority=False)).encode(), "priority must be an integer"),
    (json.dumps(ok(n=2)).encode(), "n=1"),
    (json.dumps(ok(stream="yes")).encode(), "stream must be a boolean"),
    (json.dumps(ok(stream_options={"include_usage": True})).encode(), "only allowed when stream"),
    (json.dumps(ok(stream=True, stream_options=[1])).encode(), "stream_options must be an object"),
    (json.dumps(ok(prompt=[1, "x"])).encode(), "token ids"),
    (json.dumps(ok(prompt=[1, 10**9])).encode(), "token ids"),
    (json.dumps(ok(prompt=[])).encode(), "empty"),
    (json.dumps(ok(prompt="   ")).encode(), "empty"),
    (json.dumps(ok(prompt={"a": [{"b": None}]})).encode(), "prompt must be a string"),
    (json.dumps(ok(prompt="w " * 64)).encode(), "maximum context length"),
    (json.dumps(ok(prompt="w " * 10, max_tokens=60)).encode(), "maximum context length"),
    (json.dumps(ok(max_tokens=40)).encode(), "never fit the KV cache"),
    (json.dumps(ok(stop=["two words"])).encode(), "one token"),
    (json.dumps(ok(stop=[1])).encode(), "stop must be a string"),
    (json.dumps(ok(stop_token_ids=[-1])).encode(), "stop_token_ids"),
    (json.dumps(ok(min_tokens=5)).encode(), "min_tokens"),
    (json.dumps(ok(logprobs=3)).encode(), "logprobs is not supported"),
    (json.dumps(ok(echo=True)).encode(), "echo is not supported"),
    (json.dumps(ok(ignore_eos=1)).encode(), "ignore_eos must be a boolean"),
]


@pytest.mark.parametrize(
    "body,fragment", BAD_COMPLETIONS, ids=[f"case{i}" for i in range(len(BAD_COMPLETIONS))]
)
def test_bad_completion_bodies_are_4xx(http, body, fragment):
    status, headers, data = http.request("POST", "/v1/completions", body, AUTH)
    assert 400 <= status < 500
    assert_error(status, data, 413 if len(body) > LIMIT else 400, fragment)
    assert headers["x-request-id"].startswith("cmpl-")


BAD_CHATS = [
    ({"model": "tiny"}, "messages"),
    ({"model": "tiny", "messages": []}, "must not be empty"),
    ({"model": "tiny", "messages": "hi"}, "messages must be an array"),
    ({"model": "tiny", "messages": [1]}, "must be an object"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"model": "tiny", "messages": [{"role": "user", "content": 5}]}, "content"),
    (
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        "only text parts",
    ),
    (
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": "3",
        },
        "max_completion_tokens must be an integer",
    ),
]


@pytest.mark.parametrize(
    "body,fragment", BAD_CHATS, ids=[f"chat{i}" for i in range(len(BAD_CHATS))]
)
def test_bad_chat_bodies_are_400(http, body, fragment):
    status, _, data = http.post_json("/v1/chat/completions", body, AUTH)
    assert_error(status, data, 400, fragment)


def test_unicode_prompt_is_fine(http):
    status, _, data = http.post_json("/v1/completions", ok(prompt="héllo wörld 🙂 ünïcode"), AUTH)
    assert status == 200, data
    assert json.loads(data)["usage"]["prompt_tokens"] == 4


def test_api_key(http):
    status, _, data = http.post_json("/v1/completions", ok())
    assert_error(status, data, 401, "API key")
    status, _, data = http.post_json("/v1/completions", ok(), {"Authorization": "Bearer nope"})
    assert json.loads(data)["error"]["code"] == "invalid_api_key" and status == 401
    status, _, _ = http.request("GET", "/v1/models", None, {"Authorization": KEY})
    assert status == 401
    assert http.post_json("/v1/completions", ok(), AUTH)[0] == 200
    assert http.request("GET", "/health")[0] == 200  # open without the key


def test_oversize_body_is_413(http):
    status, _, data = http.post_json("/v1/completions", ok(prompt="x " * LIMIT), AUTH)
    error = assert_error(status, data, 413, f"limit of {LIMIT} bytes")
    assert error["code"] == "request_too_large"


def test_unknown_model_is_404(http):
    status, _, data = http.post_json(
        "/v1/chat/completions",
        {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
        AUTH,
    )
    assert assert_error(status, data, 404, "does not exist")["code"] == "model_not_found"


def test_unknown_route_and_wrong_method(http):
    status, _, data = http.request("GET", "/v2/nothing", None, AUTH)
    assert_error(status, data, 404, "/v2/nothing")
    status, headers, data = http.request("GET", "/v1/completions", None, AUTH)
    assert_error(status, data, 405, "not allowed")
    assert headers["allow"] == "POST"
    status, _, data = http.request("DELETE", "/health")
    assert_error(status, data, 405)


@pytest.mark.parametrize("value", ["x" * 129, "tab\there", "é-accent"])
def test_bad_request_id_header(http, value):
    status, _, data = http.request(
        "POST", "/v1/completions", json.dumps(ok()).encode(), {**AUTH, "X-Request-Id": value}
    )
    assert_error(status, data, 400, "X-Request-Id")


def _stream_in_background(url: str, body: dict, request_id: str, started: threading.Event):
    """A streaming request that holds its slot until it ends; signals its first chunk."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request(
        "POST", "/v1/completions", json.dumps(body).encode(), {**AUTH, "X-Request-Id": request_id}
    )
    response = conn.getresponse()
    assert response.status == 200
    response.read(1)  # the first byte of the first event
    started.set()
    response.read()
    conn.close()


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_duplicate_in_flight_id_is_409_and_full_queue_is_429(server, http):
    long_body = ok(max_tokens=30, stream=True)  # 10 ms x 30 steps: ~0.3 s in flight
    started = threading.Event()
    first = threading.Thread(
        target=_stream_in_background, args=(server.url, long_body, "dup", started)
    )
    first.start()
    assert started.wait(10)
    status, headers, data = http.post_json("/v1/completions", ok(), {**AUTH, "X-Request-Id": "dup"})
    assert assert_error(status, data, 409, "already in flight")["code"] == "duplicate_request_id"
    assert headers["x-request-id"] == "dup"

    # "dup" runs (max_num_seqs=1); a second request waits (max_waiting=1); a third is refused.
    waiting = threading.Thread(
        target=lambda: HttpClient(server.url).post_json("/v1/completions", ok(max_tokens=30), AUTH)
    )
    waiting.start()
    _wait_for(lambda: server.health()["num_waiting"] == 1)
    status, headers, data = http.post_json("/v1/completions", ok(), AUTH)
    assert assert_error(status, data, 429, "queue is full")["code"] == "queue_full"
    assert headers["retry-after"] == "1"
    first.join(10)
    waiting.join(10)
    _wait_for(lambda: server.health()["num_in_flight"] == 0)
    health = server.health()
    assert health["num_free_device_blocks"] == health["num_device_blocks"]


# -- vLLM sampling and decoding fields that are not implemented ---------------------------
UNIMPLEMENTED = [
    ("min_p", 0.05),
    ("use_beam_search", True),
    ("length_penalty", 0.8),
    ("prompt_logprobs", 0),  # 0 is not neutral: it asks for the prompt tokens' logprobs
    ("prompt_logprobs", 5),
    ("guided_json", {"type": "object", "properties": {"a": {"type": "string"}}}),
    ("guided_regex", "[a-z]+"),
    ("guided_choice", ["yes", "no"]),
    ("guided_grammar", 'root ::= "a"'),
    ("guided_whitespace_pattern", " "),
    ("guided_decoding_backend", "xgrammar"),
    ("structured_outputs", {"json": {"type": "object"}}),
    ("include_stop_str_in_output", True),
    ("skip_special_tokens", False),
    ("skip_special_tokens", 1),  # not the boolean true
    ("allowed_token_ids", [5, 6]),
    ("allowed_token_ids", []),  # vLLM refuses an empty list too
    ("bad_words", ["hello"]),
    ("truncate_prompt_tokens", 1),
    ("truncate_prompt_tokens", -1),  # vLLM: truncate to max_model_len
    ("early_stopping", True),
    ("early_stopping", "never"),
    ("spaces_between_special_tokens", False),
    ("logits_processors", ["my.module:Processor"]),
    ("return_tokens_as_token_ids", True),
    ("chat_template", "{{ messages }}"),
    ("chat_template_kwargs", {"enable_thinking": True}),
    ("add_generation_prompt", False),
    ("continue_final_message", True),
]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("name,value", UNIMPLEMENTED)
def test_unimplemented_vllm_sampling_fields_are_a_400_naming_the_field(http, route, name, value):
    """They were accepted and ignored: a guided_json request got free text, min_p and
    beam search were silently off; allowed_token_ids and bad_words did not constrain
    the output, truncate_prompt_tokens did not cut the prompt."""
    body = ok(**{name: value})
    if route == "/v1/chat/completions":
        body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], name: value}
    status, _, data = http.post_json(route, body, AUTH)
    error = assert_error(status, data, 400, f"{name} is not supported")
    assert error["param"] == name


def test_the_neutral_values_vllm_clients_send_are_served(http):
    neutral = {
        "min_p": 0,
        "use_beam_search": False,
        "length_penalty": 1.0,
        "prompt_logprobs": None,
        "guided_json": None,
        "guided_regex": None,
        "guided_choice": None,
        "guided_grammar": None,
        "guided_decoding_backend": None,
        "structured_outputs": None,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,  # vLLM's default, and what the output text does
        "allowed_token_ids": None,
        "bad_words": [],
        "truncate_prompt_tokens": None,
        "early_stopping": False,
        "spaces_between_special_tokens": True,
        "logits_processors": None,
        "return_tokens_as_token_ids": False,
        "chat_template": None,
        "chat_template_kwargs": {},
        "add_generation_prompt": True,
        "continue_final_message": False,
    }
    status, _, data = http.post_json("/v1/completions", ok(**neutral), AUTH)
    assert status == 200, data
    other = {"min_p": 0.0, "length_penalty": 1}
    assert http.post_json("/v1/completions", ok(**other), AUTH)[0] == 200


# -- one rule for every integer field ----------------------------------------------------
INTEGER_FIELDS = [
    ("n", 1.0),  # was accepted, while max_tokens=1000.0 was refused
    ("max_tokens", 2.0),
    ("min_tokens", 0.0),
    ("top_k", 40.0),
    ("seed", 7.0),
    ("priority", 0.0),
    ("best_of", 1.0),  # was "best_of is not supported": the value is not an integer
    ("top_logprobs", 0.0),
    ("prompt_logprobs", 0.0),
    ("truncate_prompt_tokens", 5.0),
]


@pytest.mark.parametrize("name,value", INTEGER_FIELDS)
def test_an_integral_float_is_refused_on_every_integer_field(http, name, value):
    status, _, data = http.post_json("/v1/completions", ok(**{name: value}), AUTH)
    error = assert_error(status, data, 400, f"{name} must be an integer, got number {value}")
    assert error["param"] == name


def test_an_integral_float_is_refused_for_max_completion_tokens(http):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 3.0,
    }
    status, _, data = http.post_json("/v1/chat/completions", body, AUTH)
    error = assert_error(status, data, 400, "max_completion_tokens must be an integer")
    assert error["param"] == "max_completion_tokens"


@pytest.mark.parametrize("name", ["max_tokens", "min_tokens", "seed"])
@pytest.mark.parametrize("value", [2**63, 10**30])
def test_an_integer_over_int64_is_too_large_not_too_small(http, name, value):
    """max_tokens=2**63 was answered "max_tokens must be >= 1"."""
    status, _, data = http.post_json("/v1/completions", ok(**{name: value}), AUTH)
    error = assert_error(status, data, 400, f"{name} is too large: must be at most {2**63 - 1}")
    assert ">=" not in error["message"] and error["param"] == name


def test_max_completion_tokens_over_int64_is_too_large(http):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 2**64,
    }
    status, _, data = http.post_json("/v1/chat/completions", body, AUTH)
    assert_error(status, data, 400, "max_completion_tokens is too large")


@pytest.mark.parametrize(
    "fields,fragment",
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"min_tokens": -1}, "min_tokens must be >= 0, got -1"),
        ({"seed": -(2**63) - 1}, f"seed must be >= {-(2**63)}"),
        ({"top_k": 2**31}, f"top_k must be in [-1, {2**31 - 1}]"),
        ({"priority": -(2**31) - 1}, f"priority must be in [{-(2**31)}, {2**31 - 1}]"),
        ({"n": 2}, "only n=1 is supported, got n=2"),
    ],
)
def test_integer_bounds_are_named_truly(http, fields, fragment):
    status, _, data = http.post_json("/v1/completions", ok(**fields), AUTH)
    assert_error(status, data, 400, fragment)
