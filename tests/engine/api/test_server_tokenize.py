"""vLLM's tokenizer and probe routes through a live server: /tokenize, /detokenize,
/ping, /load, the /v1/models card, and `schedscope export-tokenizer`, whose
tokenizer.json counts what the server counts.

The hash tokenizer makes counts exact (a prompt of N words is N tokens); the sim
executor emits token 3 ("w3") and never EOS.
"""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFRustTokenizer
from tokenizers import models, pre_tokenizers
from typer.testing import CliRunner

from engine.api.server import OFFLOAD_PARSE_BYTES, ServerSettings
from engine.serving.tokenizer import HashTokenizer, HFTokenizer, export_hf_tokenizer
from harness.cli import app
from harness.serve.local_server import BackgroundServer, HttpClient, sim_engine

MODEL = "tiny"
MAX_MODEL_LEN = 256
TOKENIZER = HashTokenizer(4096)  # the tiny preset's vocabulary
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}

#: Every character Python's str.isspace() or Unicode White_Space calls a space, the
#: four ASCII separators on which they disagree (U+001C..U+001F), look-alikes that are
#: neither (ZWSP, BOM), and the exported tokenizer's own vocabulary as whole pieces.
SPACES = (
    " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029"
    "\u202f\u205f\u3000\u200b\ufeff"
)
TEXT = st.lists(
    st.one_of(
        st.sampled_from(list(SPACES)),
        st.characters(exclude_categories=("Cs",)),  # JSON cannot carry lone surrogates
        st.sampled_from(["<s>", "</s>", "<pad>", "<unk>", "w3", "w17", "a</s>b", "<|user|>"]),
    ),
    max_size=40,
).map("".join)


@pytest.fixture(scope="module")
def server():
    started = time.time()
    with BackgroundServer(
        sim_engine(step_s=0.0005, max_model_len=MAX_MODEL_LEN), TOKENIZER
    ) as live:
        live.started = started
        yield live
        assert live.health()["num_unfinished"] == 0


@pytest.fixture(scope="module")
def http(server):
    client = HttpClient(server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def keyed():
    """A slow server behind an API key: 20 ms steps keep a stream in flight."""
    settings_ = ServerSettings(host="127.0.0.1", port=0, api_key=KEY, shutdown_timeout_s=2.0)
    with BackgroundServer(
        sim_engine(step_s=0.02, max_model_len=MAX_MODEL_LEN), TOKENIZER, settings_
    ) as live:
        yield live


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokenizer")
    result = CliRunner().invoke(app, ["export-tokenizer", str(out), "--model", MODEL])
    assert result.exit_code == 0, result.output
    return out


def post(http, path, body, headers=None) -> tuple[int, dict]:
    status, _, data = http.post_json(path, body, headers)
    return status, json.loads(data)


def tokenize(http, body, headers=None) -> dict:
    status, out = post(http, "/tokenize", body, headers)
    assert status == 200, out
    return out


PROMPTS = [
    "the quick brown fox",
    "  héllo\twörld 🙂\n\nünïcode  ",
    "one\u3000two\xa0three",
    "record\x1eseparated unit\x1fseparated",
    "<s> a</s>b <|user|>",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_tokenize_count_is_the_completions_prompt_tokens(http, client, prompt):
    out = tokenize(http, {"model": MODEL, "prompt": prompt})
    completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert out["count"] == completion.usage.prompt_tokens == len(out["tokens"])
    assert out["tokens"] == TOKENIZER.encode(prompt)
    assert out["max_model_len"] == MAX_MODEL_LEN
    assert out["token_strs"] is None
    # model is optional (vLLM); add_special_tokens changes nothing: none are ever added
    assert tokenize(http, {"prompt": prompt, "add_special_tokens": False}) == out


def test_words_split_on_unicode_white_space_only():
    # U+001C..U+001F are no White_Space: one word each, as Hugging Face splits them.
    assert len(TOKENIZER.encode("a\x1cb c\x1fd")) == 2
    assert len(TOKENIZER.encode("a\x85b\u3000c")) == 3


MESSAGES = [
    [{"role": "user", "content": "hello there"}],
    [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
        },
        {"role": "assistant", "content": None},
        {"role": "user", "content": "again\x1cglued"},
    ],
]


@pytest.mark.parametrize("messages", MESSAGES)
def test_tokenize_chat_count_is_the_chat_prompt_tokens(http, client, messages):
    out = tokenize(http, {"model": MODEL, "messages": messages})
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert out["count"] == chat.usage.prompt_tokens == len(out["tokens"])
    # Without the generation prompt the template leaves out the "<|assistant|>" cue:
    # one word fewer; continue_final_message leaves the last message open, the same.
    no_cue = tokenize(http, {"messages": messages, "add_generation_prompt": False})
    assert no_cue["tokens"] == out["tokens"][:-1]
    assert tokenize(http, {"messages": messages, "continue_final_message": True}) == no_cue


def test_token_strs(http):
    out = tokenize(http, {"prompt": "to be\tor  not", "return_token_strs": True})
    assert out["token_strs"] == ["to", "be", "or", "not"]
    chat = tokenize(
        http, {"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True}
    )
    assert chat["token_strs"] == ["<|user|>", "hi", "<|assistant|>"]


def test_empty_prompt_is_zero_tokens(http):
    assert tokenize(http, {"prompt": ""})["count"] == 0


def test_detokenize_round_trips_what_the_engine_decodes(http, client):
    completion = client.completions.create(
        model=MODEL, prompt="a b c", max_tokens=6, extra_body={"ignore_eos": True}
    )
    generated = [3] * completion.usage.completion_tokens  # the sim executor's token
    status, out = post(http, "/detokenize", {"model": MODEL, "tokens": generated})
    assert status == 200 and out == {"prompt": completion.choices[0].text}
    # ...and that text tokenizes back to as many tokens
    assert tokenize(http, {"prompt": out["prompt"]})["count"] == len(generated)
    # special tokens are kept in the text (vLLM decodes them here); no tokens, no text
    assert post(http, "/detokenize", {"tokens": [1, 17, 2]})[1] == {"prompt": "<s> w17 </s>"}
    assert post(http, "/detokenize", {"tokens": []})[1] == {"prompt": ""}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": ["a", "b"]}, "prompt"),
        ("/tokenize", {"prompt": [5, 6]}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "messages"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ("/tokenize", {"prompt": "a", "return_token_strs": 1}, "return_token_strs"),
        ("/tokenize", {"prompt": "a", "model": 7}, "model"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": [{"role": "robot", "content": "a"}]}, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": 3}]}, "messages"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "a"}], "tools": [{"x": 1}]},
            "tools",
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "a"}], "chat_template": "{{x}}"},
            "chat_template",
        ),
        (
            "/tokenize",
            {
                "messages": [{"role": "user", "content": "a"}],
                "add_generation_prompt": True,
                "continue_final_message": True,
            },
            "continue_final_message",
        ),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"tokens": [1, True]}, "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": [4096]}, "tokens"),
        ("/detokenize", {"tokens": [1.0]}, "tokens"),
    ],
)
def test_bad_requests_are_400_naming_the_field(http, path, body, param):
    status, out = post(http, path, body)
    assert status == 400, out
    assert out["error"]["type"] == "invalid_request_error"
    assert out["error"]["param"] == param
    assert out["error"]["message"]


@pytest.mark.parametrize("raw", [b"", b"{nope", b"[1, 2]", b'{"prompt": NaN}'])
def test_bad_json_is_400(http, raw):
    for path in ("/tokenize", "/detokenize"):
        status, _, data = http.request("POST", path, raw, {"Content-Type": "application/json"})
        assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body"), [("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [5]})]
)
def test_wrong_model_is_404(http, path, body):
    status, out = post(http, path, {**body, "model": "gpt-nope"})
    assert status == 404
    assert out["error"]["code"] == "model_not_found" and out["error"]["param"] == "model"


def test_large_body_is_tokenized_on_a_worker_thread(http, monkeypatch):
    calls = []
    real = asyncio.to_thread

    async def spy(fn, *args):
        # The route hands its parser (the last argument) to a generic body reader.
        calls.append(getattr(args[-1], "__name__", fn.__name__))
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    words = ["lorem", "ipsum", "dolor", "sit"] * (OFFLOAD_PARSE_BYTES // 16)
    prompt = " ".join(words)
    out = tokenize(http, {"prompt": prompt})
    assert out["count"] == len(words) and out["tokens"] == TOKENIZER.encode(prompt)
    assert tokenize(http, {"prompt": "short"})["count"] == 1
    status, _ = post(http, "/detokenize", {"tokens": [5] * (OFFLOAD_PARSE_BYTES // 2)})
    assert status == 200
    assert calls == ["tokenize_body", "detokenize_body"]


def test_api_key_guards_tokenize_but_not_probes(keyed):
    http = HttpClient(keyed.url)
    for path, body in (("/tokenize", {"prompt": "a b"}), ("/detokenize", {"tokens": [5]})):
        status, out = post(http, path, body)
        assert status == 401 and out["error"]["code"] == "invalid_api_key"
        status, _ = post(http, path, body, {"Authorization": "Bearer wrong"})
        assert status == 401
        assert post(http, path, body, AUTH)[0] == 200
    for method, path in (("GET", "/ping"), ("POST", "/ping"), ("GET", "/load")):
        assert http.request(method, path)[0] == 200, path
    assert http.request("GET", "/v1/models")[0] == 401
    http.close()


def test_ping(http):
    for method in ("GET", "POST"):
        status, _, data = http.request(method, "/ping")
        assert (status, data) == (200, b"")


def test_load_counts_requests_in_flight(keyed):
    http = HttpClient(keyed.url)
    assert json.loads(http.request("GET", "/load")[2]) == {"server_load": 0}
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    # 100 tokens of 20 ms steps: in flight for two seconds unless closed
    with client.completions.create(
        model=MODEL, prompt="go", max_tokens=100, stream=True, extra_body={"ignore_eos": True}
    ) as stream:
        next(iter(stream))
        assert json.loads(http.request("GET", "/load")[2]) == {"server_load": 1}
    deadline = time.monotonic() + 10
    while (
        json.loads(http.request("GET", "/load")[2])["server_load"] and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert json.loads(http.request("GET", "/load")[2]) == {"server_load": 0}
    http.close()


def test_models_card_as_vllm(server, client):
    before = time.time()
    [card] = client.models.list().data
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "schedscope")
    assert server.started - 1 <= card.created <= before  # the server's start, not now, not 0
    body = card.model_dump()
    assert body["root"] == MODEL and body["parent"] is None
    assert body["max_model_len"] == MAX_MODEL_LEN
    [perm] = body["permission"]
    assert perm.pop("id").startswith("modelperm-")
    assert perm == {
        "object": "model_permission",
        "created": card.created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    time.sleep(1.01)
    assert client.models.list().data[0].created == card.created


def test_exported_tokenizer_files(exported):
    assert sorted(p.name for p in exported.iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == "</s>"
    hf = HFRustTokenizer.from_file(str(exported / "tokenizer.json"))
    # The server's output text encodes back to the server's ids; other words are <unk>.
    ids = [3, 17, 4095]
    assert hf.encode(TOKENIZER.decode(ids)).ids == ids
    assert hf.encode("hello world").ids == [4096, 4096]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT)
def test_exported_tokenizer_counts_what_the_server_counts(http, exported, text):
    hf = HFRustTokenizer.from_file(str(exported / "tokenizer.json"))
    served = tokenize(http, {"prompt": text})["count"]
    assert len(hf.encode(text).ids) == served == len(TOKENIZER.encode(text))
    assert len(hf.encode(text, add_special_tokens=True).ids) == served


def test_export_copies_a_tokenizer_json(tmp_path):
    source = tmp_path / "model" / "tokenizer.json"
    source.parent.mkdir()
    hf = HFRustTokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.save(str(source))
    path = export_hf_tokenizer(HFTokenizer(source), tmp_path / "out")
    assert path.read_bytes() == source.read_bytes()
    assert (
        json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )


def test_export_cli_refuses_an_unknown_model(tmp_path):
    result = CliRunner().invoke(app, ["export-tokenizer", str(tmp_path), "--model", "gigantic"])
    assert result.exit_code == 2 and "--model" in result.output
