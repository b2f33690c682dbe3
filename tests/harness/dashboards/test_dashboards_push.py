"""`schedscope dashboards push` against a fake Grafana.

FakeGrafana is a test double: Grafana cannot be installed on these machines (not in Debian,
no PyPI/npm binary), so a small aiohttp server on 127.0.0.1 implements the two endpoints
grafana-client calls for a push (GET /api/frontend/settings for the health check, POST
/api/dashboards/db to save) with Grafana's status codes and answer shapes, and records
every request it gets.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from typer.testing import CliRunner

from harness.cli import app
from harness.grafana import dashboards
from tests.support.ports import free_port

TOKEN = "glsa_TestOnlyToken_0123456789abcdef"


@dataclass
class FakeGrafana:
    token: str = TOKEN
    mode: str = "grafana"  # grafana | forbidden | not-grafana | html
    requests: list[dict] = field(default_factory=list)
    saved: dict[str, dict] = field(default_factory=dict)
    url: str = ""

    def app(self) -> web.Application:
        application = web.Application()
        application.router.add_get("/api/frontend/settings", self.settings)
        application.router.add_post("/api/dashboards/db", self.save)
        return application

    async def _record(self, request: web.Request) -> dict:
        body = await request.json() if request.can_read_body else None
        entry = {
            "method": request.method,
            "path": request.path,
            "authorization": request.headers.get("Authorization"),
            "json": body,
        }
        self.requests.append(entry)
        return entry

    def _auth_error(self, entry: dict) -> web.Response | None:
        if entry["authorization"] != f"Bearer {self.token}":
            return web.json_response({"message": "invalid API key"}, status=401)
        if self.mode == "forbidden" and entry["method"] == "POST":
            return web.json_response({"message": "Access denied"}, status=403)
        return None

    async def settings(self, request: web.Request) -> web.Response:
        entry = await self._record(request)
        if self.mode == "not-grafana":
            return web.Response(status=404, text="404 page not found")
        if self.mode == "html":
            return web.Response(text="<html>hello</html>", content_type="text/html")
        return self._auth_error(entry) or web.json_response(
            {"buildInfo": {"version": "11.6.0", "edition": "Open Source"}}
        )

    async def save(self, request: web.Request) -> web.Response:
        entry = await self._record(request)
        error = self._auth_error(entry)
        if error:
            return error
        body = entry["json"]
        uid = body["dashboard"]["uid"]
        if uid in self.saved and not body.get("overwrite"):
            return web.json_response(
                {
                    "message": "A dashboard with the same uid already exists",
                    "status": "name-exists",
                },
                status=412,
            )
        version = self.saved.get(uid, {}).get("version", 0) + 1
        self.saved[uid] = {"version": version, "dashboard": body["dashboard"]}
        return web.json_response(
            {
                "id": list(self.saved).index(uid) + 1,
                "uid": uid,
                "url": f"/d/{uid}/x",
                "status": "success",
                "version": version,
            }
        )


@pytest.fixture()
def grafana():
    fake = FakeGrafana()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    started = threading.Event()

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        fake.url = f"http://127.0.0.1:{port}"
        started.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True
    )
    thread.start()
    assert started.wait(10)
    yield fake
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def push(url: str, token: str | None = TOKEN, *extra: str):
    env = {"GRAFANA_TOKEN": token} if token is not None else {"GRAFANA_TOKEN": ""}
    return CliRunner().invoke(app, ["dashboards", "push", "--grafana-url", url, *extra], env=env)


def assert_token_hidden(result, caplog) -> None:
    assert TOKEN not in result.output
    assert TOKEN not in (result.stderr or "")
    assert TOKEN not in caplog.text
    assert not any(TOKEN in str(r.args) for r in caplog.records)


def test_push_is_idempotent_by_uid_and_overwrites(grafana, caplog):
    caplog.set_level(logging.DEBUG)
    first = push(grafana.url)
    second = push(grafana.url)
    assert first.exit_code == 0, first.output
    assert second.exit_code == 0, second.output
    uids = set(dashboards.DASHBOARDS)
    assert set(grafana.saved) == uids
    assert all(entry["version"] == 2 for entry in grafana.saved.values())
    posts = [r for r in grafana.requests if r["method"] == "POST"]
    assert len(posts) == 2 * len(uids)
    for post in posts:
        assert post["path"] == "/api/dashboards/db"
        assert post["json"]["overwrite"] is True
        assert post["json"]["dashboard"]["uid"] in uids
        assert post["json"]["dashboard"]["id"] is None
        assert post["authorization"] == f"Bearer {TOKEN}"
    assert [p["json"]["dashboard"]["uid"] for p in posts[: len(uids)]] == [
        p["json"]["dashboard"]["uid"] for p in posts[len(uids) :]
    ]
    # What Grafana stores is exactly the generated dashboard.
    for uid, entry in grafana.saved.items():
        assert {
            k: v for k, v in entry["dashboard"].items() if k != "id"
        } == dashboards.dashboard_dict(uid)
    for uid in uids:
        assert f"pushed {uid} (version 2)" in second.output
    assert_token_hidden(first, caplog)
    assert_token_hidden(second, caplog)


def test_folder_uid_is_sent(grafana):
    result = push(grafana.url, TOKEN, "--folder-uid", "schedscope")
    assert result.exit_code == 0, result.output
    assert all(
        r["json"]["folderUid"] == "schedscope" for r in grafana.requests if r["method"] == "POST"
    )


def test_bad_token_is_a_clear_error(grafana, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "glsa_WrongToken_fedcba9876543210"
    result = push(grafana.url, wrong)
    assert result.exit_code == 1
    assert (
        "401" in result.output and "GRAFANA_TOKEN" in result.output and grafana.url in result.output
    )
    assert wrong not in result.output and wrong not in caplog.text
    assert not grafana.saved


def test_missing_token_says_it_is_not_set(grafana):
    result = push(grafana.url, None)
    assert result.exit_code == 1
    assert "GRAFANA_TOKEN is not set" in result.output and "401" in result.output


def test_token_without_permission_is_a_clear_error(grafana, caplog):
    caplog.set_level(logging.DEBUG)
    grafana.mode = "forbidden"
    result = push(grafana.url)
    assert result.exit_code == 1
    assert (
        "403" in result.output
        and "permission" in result.output
        and "GRAFANA_TOKEN" in result.output
    )
    assert_token_hidden(result, caplog)


def test_connection_refused_names_the_url(caplog):
    caplog.set_level(logging.DEBUG)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    result = push(url)
    assert result.exit_code == 1
    assert (
        f"cannot connect to Grafana at {url}" in result.output and "--grafana-url" in result.output
    )
    assert_token_hidden(result, caplog)


@pytest.mark.parametrize("mode", ["not-grafana", "html"])
def test_a_server_that_is_not_grafana_names_the_url(grafana, mode, caplog):
    caplog.set_level(logging.DEBUG)
    grafana.mode = mode
    result = push(grafana.url)
    assert result.exit_code == 1
    assert f"{grafana.url} does not look like Grafana" in result.output
    assert_token_hidden(result, caplog)
    assert not grafana.saved


def test_a_url_that_is_not_http_is_refused_before_any_request():
    result = push("localhost:3000")
    assert result.exit_code == 1
    assert "is not an http(s) URL" in result.output


def test_a_password_in_the_url_is_never_printed(caplog):
    caplog.set_level(logging.DEBUG)
    port = free_port()
    result = push(f"http://admin:hunter2@127.0.0.1:{port}")
    assert result.exit_code == 1
    assert f"cannot connect to Grafana at http://admin:***@127.0.0.1:{port}" in result.output
    assert "hunter2" not in result.output and "hunter2" not in caplog.text


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_a_timeout_that_is_not_positive_is_a_usage_error(timeout):
    result = CliRunner().invoke(
        app, ["dashboards", "push", "--grafana-url", "http://127.0.0.1:9", "--timeout-s", timeout]
    )
    assert result.exit_code == 2, result.output
    assert "--timeout-s" in result.output and "look like Grafana" not in result.output


def test_a_url_with_a_port_out_of_range_is_refused_without_a_traceback():
    result = push("http://admin:hunter2@127.0.0.1:99999")
    assert result.exit_code == 1 and not isinstance(result.exception, ValueError)
    assert "is not an http(s) URL" in result.output and "hunter2" not in result.output
