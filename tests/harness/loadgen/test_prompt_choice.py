"""--prompt-mode auto against servers of small and large vocabularies (in process).

The small-vocabulary server is tests/support/vllm_stub.py, which stands in for vLLM (it
refuses ids at or above its vocabulary with vLLM's error text); the large one is the
bundled server (a 4096-id vocabulary) or the stub with a large vocabulary.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.loadgen.client import FastTransport, OpenAIClient, probe
from harness.loadgen.options import LoadgenOptions
from harness.loadgen.prompt_choice import MIN_ID_SPAN, PromptChoice, choose
from harness.loadgen.prompts import DEFAULT_ID_RANGE
from harness.profiles.schedule import RequestSpec
from tests.support.paths import REPO
from tests.support.vllm_stub import VllmStub


def spec(i: int, prompt_tokens: int = 40, output_tokens: int = 3) -> RequestSpec:
    return RequestSpec(f"req-{i}", i, 0, "c", prompt_tokens, output_tokens, 16, 0, 0.0)


def probe_server(url: str, mode: str):
    transport = FastTransport(url, 8, 10.0)
    info, sizer = probe(
        transport, endpoint="completions", model="", api_key="", prompt_mode=mode, continuous="auto"
    )
    return transport, info, sizer


def send_all(transport, info, sizer, n: int = 20) -> list[dict]:
    client = OpenAIClient(
        transport,
        endpoint="completions",
        model=info.model,
        prompt_mode=info.prompts.mode,
        id_range=info.prompts.id_range or DEFAULT_ID_RANGE,
        continuous_usage=info.continuous_usage,
        sizer=sizer,
    )
    rows = []
    for i in range(n):
        s = spec(i)
        row = client.new_row(s, "open", time.time(), False)
        client.send(row, s)
        rows.append(row)
    return rows


def test_token_ids_by_default_fail_on_a_small_vocabulary_as_on_vllm():
    """The failure the auto mode is for: the default ids reach past 1250."""
    with VllmStub(vocab_size=1250) as stub:
        transport, info, sizer = probe_server(stub.url, "token_ids")
        rows = send_all(transport, info, sizer)
    assert info.prompts.mode == "token_ids" and info.prompts.reason == "as asked"
    failed = [r for r in rows if r["status"] != "ok"]
    assert len(failed) >= 15, [r["status"] for r in rows]
    assert all("is out of vocabulary" in r["error"] and r["http_status"] == 400 for r in failed)


def test_auto_keeps_token_ids_below_a_small_vocabulary_and_every_request_succeeds():
    with VllmStub(vocab_size=1250, max_model_len=777) as stub:
        transport, info, sizer = probe_server(stub.url, "auto")
        rows = send_all(transport, info, sizer)
        refused = stub.refused
    p = info.prompts
    assert p.requested == "auto" and p.mode == "token_ids"
    assert p.vocab_bound is not None and p.vocab_bound <= 1250
    lo, hi = p.id_range
    assert hi == p.vocab_bound and hi - lo >= MIN_ID_SPAN
    assert "refused ids 1000 and 2999" in p.reason and "out of vocabulary" in p.reason
    assert p.max_model_len == 777
    assert refused == 1  # the probe only
    assert [r["status"] for r in rows] == ["ok"] * len(rows)
    assert all(r["server_prompt_tokens"] == r["prompt_tokens"] for r in rows)
    assert info.probe_requests == 2  # the vocabulary probe and the continuous-usage probe
    assert info.continuous_usage


def test_auto_uses_the_default_ids_where_the_vocabulary_holds_them():
    with VllmStub(vocab_size=50000) as stub:
        _, info, _ = probe_server(stub.url, "auto")
    assert info.prompts.mode == "token_ids" and info.prompts.id_range == DEFAULT_ID_RANGE
    assert "/tokenize returned ids up to" in info.prompts.reason
    assert info.probe_requests == 1  # no vocabulary probe needed


def test_auto_falls_back_to_text_sized_with_tokenize_on_a_tiny_vocabulary():
    with VllmStub(vocab_size=200) as stub:
        transport, info, sizer = probe_server(stub.url, "auto")
        rows = send_all(transport, info, sizer, n=5)
    assert info.prompts.mode == "text" and "text sized with /tokenize" in info.prompts.reason
    assert sizer is not None and sizer.method == "tokenize"
    assert [r["status"] for r in rows] == ["ok"] * 5
    assert all(r["prompt_method"] == "tokenize" for r in rows)
    assert all(r["server_prompt_tokens"] == r["prompt_tokens"] for r in rows)


def test_choose_without_tokenize_asks_the_server_then_falls_back_to_estimated_text():
    asked = []

    def accepts(ids):
        asked.append(ids)
        return False, "400: Token id 2999 is out of vocabulary"

    c = choose("auto", "completions", lambda text: None, accepts)
    assert asked == [[1000, 2999]]
    assert c.mode == "text" and c.vocab_bound is None and "estimate" in c.reason
    c = choose("auto", "completions", lambda text: None, lambda ids: (True, ""))
    assert c.mode == "token_ids" and c.id_range == DEFAULT_ID_RANGE
    assert "accepted ids 1000 and 2999" in c.reason


@pytest.mark.parametrize("mode", ["token_ids", "text"])
def test_an_explicit_mode_asks_the_server_nothing(mode):
    def never(*_a):
        raise AssertionError("probed")

    c = choose(mode, "completions", never, never)
    assert c.mode == mode and c.reason == "as asked"
    assert choose("auto", "chat", never, never).mode == "text"


def test_the_choice_reads_back_from_its_dict():
    c = PromptChoice("auto", "token_ids", "why", 1240, (310, 1240), 2048)
    assert PromptChoice.from_dict(c.to_dict()) == c
    assert c.line() == "token ids in [310, 1240) (auto: why)"


PARSE = """
import sys
from locust.argument_parser import get_parser
from harness.loadgen import options
parser = get_parser()
options.add_arguments(parser)
parsed = parser.parse_args(["-f", "x.py", *sys.argv[1:]])
print(parsed.prompt_mode, parsed.endpoint)
"""


def test_the_custom_arguments_read_their_locust_environment_variables():
    """LOCUST_PROMPT_MODE had no effect: Locust reads a variable only for an argument that
    names one. (In a subprocess: importing Locust monkey-patches the process.)"""
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOCUST_PROMPT_MODE": "text"}
    env["LOCUST_ENDPOINT"] = "chat"

    def parse(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", PARSE, *args], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert parse() == ["text", "chat"]
    assert parse("--prompt-mode", "auto") == ["auto", "chat"]  # the command line wins


def test_locust_defaults_to_auto_prompts_as_schedscope_run_target_does():
    """``locust -f loadprofiles/mixed.py`` against a vLLM with a small vocabulary exited 1
    on "Token id ... is out of vocabulary": token ids were the default."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCUST_PROMPT_MODE",)}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", PARSE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "auto"
    assert LoadgenOptions().prompt_mode == "auto"
