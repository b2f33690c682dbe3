"""What a --target says of itself (harness/run/target_info.py), read from a real HTTP
server of the test's: kept when it is plain, recorded as unknown (with the reason) when
it is not, never trusted; and ``run --target-knobs`` checked at the command line."""

from __future__ import annotations

import json

from aiohttp import web
from typer.testing import CliRunner

from harness.cli.app import app
from harness.run.target_info import read_target_info
from tests.support.threaded_app import ThreadedApp


class Target(ThreadedApp):
    name = "the identity target"

    def __init__(self, version_body: bytes, models: object) -> None:
        super().__init__()
        self.version_body = version_body
        self.models = models
        self.seen_auth: list[str | None] = []

    def add_routes(self, application: web.Application) -> None:
        async def version(request: web.Request) -> web.Response:
            self.seen_auth.append(request.headers.get("Authorization"))
            return web.Response(body=self.version_body, content_type="application/json")

        async def models(request: web.Request) -> web.Response:
            return web.json_response(self.models)

        application.router.add_get("/version", version)
        application.router.add_get("/v1/models", models)


def test_a_plain_target_is_read_as_it_says():
    cards = {"data": [{"id": "a", "owned_by": "vllm"}, {"id": "b", "max_model_len": 4096}]}
    with Target(json.dumps({"version": "0.32.0"}).encode(), cards) as target:
        info = read_target_info(target.url, api_key="k", model="b")
        first = read_target_info(target.url)
        assert target.seen_auth == ["Bearer k", None]
    assert info == {
        "engine": None,  # b's card names no owner
        "version": "0.32.0",
        "model": "b",
        "max_model_len": 4096,
        "problems": [],
    }
    assert (first["engine"], first["model"], first["max_model_len"]) == ("vllm", "a", None)


def test_what_a_target_may_not_send_is_unknown_with_the_reason():
    hostile = {"data": [{"id": "x" * 500, "owned_by": "evil\x1b[2J", "max_model_len": -5}]}
    with Target(b"not json", hostile) as target:
        info = read_target_info(target.url)
    assert info["version"] is None and info["engine"] is None
    assert info["model"] is None and info["max_model_len"] is None
    assert info["problems"] == ["/version: not JSON"]
    nothing = read_target_info("http://127.0.0.1:9")  # nothing listens: both unanswered
    assert len(nothing["problems"]) == 2 and nothing["version"] is None


def test_target_knobs_need_a_target_and_must_read_as_flags():
    runner = CliRunner()
    alone = runner.invoke(app, ["run", "--target-knobs", "--max-num-seqs 4", "--simulate"])
    assert alone.exit_code == 2 and "only with --target" in alone.output
    bad = runner.invoke(
        app, ["run", "--target", "http://127.0.0.1:9", "--target-knobs", "max-num-seqs 4"]
    )
    assert bad.exit_code == 2
    assert "expected a flag such as --max-num-seqs" in bad.output
