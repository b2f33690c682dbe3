"""Open an HTML file in real headless Debian chromium over the DevTools protocol:
console errors, uncaught exceptions, a DOM query, a screenshot (tests only)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import aiohttp

from harness.processes.stop import stop_process

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


# Counts plots and the plots Plotly actually drew (an SVG with a plot area inside).
DOM_CHECK = (
    """(() => {
  const divs = [...document.querySelectorAll('div.plotly-graph-div')];
  const drawn = divs.filter(d => d.querySelector('svg.main-svg') &&
      d.querySelector('.cartesianlayer, .barlayer, .scatterlayer'));
  const traces = divs.map(d => (d.data || []).length);
  return JSON.stringify({plots: divs.length, drawn: drawn.length, traces,
                         declared: Number(document.body.dataset.plots || -1),
"""
    "                         sections: [...document.querySelectorAll('div.plot')]"
    ".map(p => p.dataset.section)});\n"
    "})()"
)


async def _inspect(url: str, screenshot: Path, chromium: str, timeout_s: float) -> dict:
    profile = tempfile.mkdtemp(prefix="schedscope-chromium-")
    proc = subprocess.Popen(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ws_url = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while ws_url is None:
            line = await loop.run_in_executor(None, proc.stderr.readline)
            if not line and proc.poll() is not None:
                raise RuntimeError("chromium exited before DevTools listened")
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                ws_url = m.group(1)
            if loop.time() > deadline:
                raise TimeoutError("chromium DevTools did not come up")
        port = int(re.search(r":(\d+)/", ws_url).group(1))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            page = next(t for t in targets if t.get("type") == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 10**6))
                events: list[dict] = []
                pending: dict[int, asyncio.Future] = {}

                async def reader():
                    async for msg in ws:
                        data = json.loads(msg.data)
                        if "id" in data and data["id"] in pending:
                            pending.pop(data["id"]).set_result(data)
                        elif "method" in data:
                            events.append(data)

                task = asyncio.create_task(reader())

                async def call(method, **params):
                    i = next(ids)
                    fut = loop.create_future()
                    pending[i] = fut
                    await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                    return await asyncio.wait_for(fut, timeout_s)

                for domain in ("Runtime", "Log", "Page"):
                    await call(f"{domain}.enable")
                await call("Page.navigate", url=url)
                while not any(e["method"] == "Page.loadEventFired" for e in events):
                    await asyncio.sleep(0.1)
                    if loop.time() > deadline:
                        raise TimeoutError("page did not load")
                await asyncio.sleep(1.0)  # let Plotly finish drawing
                result = await call("Runtime.evaluate", expression=DOM_CHECK, returnByValue=True)
                dom = json.loads(result["result"]["result"]["value"])
                shot = await call(
                    "Page.captureScreenshot", format="png", captureBeyondViewport=False
                )
                screenshot.write_bytes(base64.b64decode(shot["result"]["data"]))
                task.cancel()
        errors = []
        for e in events:
            if e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in (
                "error",
                "assert",
            ):
                errors.append(json.dumps(e["params"].get("args"))[:500])
            elif e["method"] == "Runtime.exceptionThrown":
                errors.append(json.dumps(e["params"]["exceptionDetails"])[:500])
            elif e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error":
                errors.append(e["params"]["entry"].get("text", "")[:500])
        return {"dom": dom, "errors": errors, "screenshot": str(screenshot)}
    finally:
        stop_process(proc, 10.0)
        shutil.rmtree(profile, ignore_errors=True)


def inspect_html(path: Path, screenshot: Path, timeout_s: float = 60.0) -> dict:
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium")
    return asyncio.run(_inspect(Path(path).resolve().as_uri(), screenshot, chromium, timeout_s))


def chromium_required() -> bool:
    return os.environ.get("CI", "").lower() == "true"
