"""One Locust run, headless, as a subprocess: the profile's locustfile (a shipped
``loadprofiles/<name>.py``, a given ``.py`` that exposes itself, or a wrapper written for
a ``.toml`` or a ``.py`` that only defines ``PROFILE``), its records into the cell
directory, output into ``locust.log``. :func:`drive_to_end` runs one to its end and
merges its records: the load generator of ``schedscope run`` for a caller outside a
cell (``schedscope calibrate``, benchmarks), so they load the engine as a run does."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.processes.cpu_split import pin
from harness.processes.stop import stop_process
from harness.profiles.loader import ALIASES, SUFFIXES, shipped_profiles_dir
from harness.run.server import repo_env

if TYPE_CHECKING:
    import polars as pl

#: Exit codes: 0 no failure, 1 some request failed (Locust's --exit-code-on-error):
#: neither is a crash. Anything else (2: bad arguments or locustfile) is.
LOCUST_OK_CODES = (0, 1)

WRAPPER = '''"""Written by schedscope run: the profile {path} as a locustfile."""
from harness.profiles import load_profile
from harness.loadgen.expose import expose

PROFILE = load_profile({path!r})
expose(PROFILE, globals())
'''

#: The wrapper of a distributed run with remote workers: the profile and its files are
#: in it (harness/profiles/bundle.py), so that a worker needs none of them.
SHIPPED_WRAPPER = '''"""Written by schedscope run: the TOML profile {path} as a locustfile, with the
profile and every file it names packed in, for workers that have none of them."""
from harness.profiles.bundle import unpack_profile
from harness.loadgen.expose import expose

PROFILE = unpack_profile(
    """
{packed}"""
)
expose(PROFILE, globals())
'''


def profile_path(profile: str) -> Path:
    """The file of ``profile`` (a file, or a shipped name), resolved; a name that is
    neither stays as given (loading it says why)."""
    candidate = Path(profile)
    if not candidate.is_file():
        name = ALIASES.get(profile, profile)
        for suffix in SUFFIXES:
            shipped = shipped_profiles_dir() / f"{name}{suffix}"
            if shipped.is_file():
                candidate = shipped
                break
    return candidate.resolve()


def calls_expose(path: Path) -> bool:
    """Whether the Python profile at ``path`` calls ``expose(...)`` (so Locust can run
    it as it is). One that only defines ``PROFILE`` would give Locust no user class and
    none of schedscope's arguments (it exits 2 on "unrecognized arguments"); it is run
    through the wrapper instead. A file that does not parse is left to Locust, whose
    error names the line."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == "expose":
                return True
    return False


def profile_file(profile: str, cell_dir: Path, ship: bool = False) -> Path:
    """The locustfile for ``profile`` (a shipped name or a file): a ``.py`` that calls
    ``expose`` itself; else a wrapper written into ``cell_dir`` that loads it (a
    ``.toml``, or a ``.py`` that only defines ``PROFILE``) or, with ``ship`` (remote
    workers), that holds it and its files (bundle.pack_profile, which raises a
    ProfileError above its size bound)."""
    candidate = profile_path(profile)
    if candidate.suffix == ".py" and calls_expose(candidate):
        return candidate
    wrapper = cell_dir / "locustfile.py"
    if ship:
        from harness.profiles.bundle import pack_profile

        text = SHIPPED_WRAPPER.format(path=str(candidate), packed=pack_profile(candidate))
    else:
        text = WRAPPER.format(path=str(candidate))
    wrapper.write_text(text)
    return wrapper


class LocustRun:
    def __init__(
        self,
        locustfile: Path,
        host: str,
        records_dir: Path,
        log_path: Path,
        rate_scale: float,
        duration_scale: float,
        seed: int | None,
        extra: list[str] | None = None,
        grace_s: float = 30.0,
        secrets: dict[str, str] | None = None,
        cpus: tuple[int, ...] | None = None,
    ) -> None:
        """``secrets``: environment variables for Locust (``LOCUST_API_KEY``): a secret
        on its command line would be in every process list. ``cpus``: pin Locust (and
        the worker processes it starts) to these CPU ids; None: not pinned."""
        self.secrets = dict(secrets or {})
        self.cpus = cpus
        self.args = [
            "-f",
            str(locustfile),
            "--host",
            host,
            "--headless",
            "--only-summary",
            "--records-dir",
            str(records_dir),
            "--rate-scale",
            f"{rate_scale:g}",
            "--duration-scale",
            f"{duration_scale:g}",
            "--grace",
            f"{grace_s:g}",
            "--loglevel",
            "WARNING",
        ]
        if seed is not None:
            self.args += ["--seed", str(seed)]
        self.args += list(extra or [])
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.timed_out = False

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "locust", *self.args]

    def start(self) -> None:
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            self.command,
            env={**repo_env(), **self.secrets},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        if self.cpus:  # before it forks its workers, which inherit it
            pin(self.process.pid, self.cpus)

    def _started(self) -> subprocess.Popen:
        assert self.process is not None, "start() first"
        return self.process

    def poll(self) -> int | None:
        return self._started().poll()

    def wait(self, deadline: float) -> int:
        """Wait until it ends or ``deadline`` (monotonic); then SIGTERM, SIGKILL."""
        process = self._started()
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if process.poll() is None:
            self.timed_out = True
            self._terminate(process)
        self.exit_code = process.returncode
        self._log.close()
        return self.exit_code

    def stop(self) -> None:
        """Stop Locust if it still runs (SIGTERM, SIGKILL after 20 s) and close its log;
        nothing once it has ended. For clean-up on an exception (Ctrl-C): the normal
        end is :meth:`wait`, which records the exit code and a time-out."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self._terminate(self.process)
        self._log.close()

    def _terminate(self, process: subprocess.Popen) -> None:
        stop_process(process, 20.0)

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


#: Locust's default master port (its --master-port / --master-bind-port).
MASTER_PORT = 5557


def distribution_args(
    workers: int,
    expect_workers: int | None,
    master_port: int,
    wait_s: float,
    bind_host: str = "127.0.0.1",
) -> list[str]:
    """Locust arguments that spread a cell's schedule over worker processes (the same
    exact split, harness/loadgen/split.py; their records come to the master,
    harness/loadgen/forward.py). ``workers`` > 1: Locust's ``--processes`` (a local
    master and that many local workers); ``expect_workers``: this Locust is the master
    and waits at most ``wait_s`` for that many workers started elsewhere with
    :func:`worker_command`. Neither: one process (no arguments). The master listens on
    ``bind_host``: this machine only by default, since whatever reaches its port talks to
    it (harness/loadgen/master_guard.py); ``*`` or ``0.0.0.0`` is every interface, for
    workers elsewhere on a trusted network. (Locust's own default is ``*``, for
    ``--processes`` too, whose workers connect to 127.0.0.1.)"""
    if expect_workers is not None and workers > 1:
        raise ValueError(
            "--workers (local processes) and --expect-workers (remote) exclude each other"
        )
    if expect_workers is not None:
        if expect_workers < 1:
            raise ValueError(f"--expect-workers {expect_workers}: need at least 1")
        return [
            "--master",
            "--master-bind-host",
            bind_host,
            "--master-bind-port",
            str(master_port),
            "--expect-workers",
            str(expect_workers),
            "--expect-workers-max-wait",
            str(max(1, round(wait_s))),
        ]
    if workers < 1:
        raise ValueError(f"--workers {workers}: need at least 1")
    return ["--master-bind-host", bind_host, "--processes", str(workers)] if workers > 1 else []


def worker_command(master_host: str, master_port: int = MASTER_PORT) -> list[str]:
    """The Locust command of one remote worker (``schedscope worker``): its locustfile
    comes from the master (``-f -``), its options and share too."""
    return [
        sys.executable,
        "-m",
        "locust",
        "-f",
        "-",
        "--worker",
        "--master-host",
        master_host,
        "--master-port",
        str(master_port),
    ]


def worker_line(master_host: str, master_port: int = MASTER_PORT) -> str:
    """The one-line command a user runs on each worker machine."""
    port = "" if master_port == MASTER_PORT else f" --master-port {master_port}"
    return f"schedscope worker --master-host {master_host}{port}"


class LoadDriveError(RuntimeError):
    """Locust crashed, hung or left records that do not merge; the message says which,
    with the end of its log."""


@dataclass(frozen=True)
class DrivenLoad:
    """What :func:`drive_to_end` leaves: the client rows (``merge_records``'
    requests.parquet: one per scheduled request) and the run's summary (send lag,
    ``generator_limited``, counts by status ...)."""

    client: pl.DataFrame
    summary: dict


def drive_to_end(
    profile: Path,
    url: str,
    records_dir: Path,
    limit_s: float,
    seed: int | None = None,
    on_progress: Callable[[int], object] | None = None,
    grace_s: float = 30.0,
    cpus: tuple[int, ...] | None = None,
) -> DrivenLoad:
    """Run ``profile`` (a file) with Locust against ``url`` until it ends, at most
    ``limit_s`` seconds (then it is stopped and this raises), its records and
    ``locust.log`` into ``records_dir``; ``on_progress`` gets the number of requests
    ended so far, about twice a second; ``cpus``: Locust's CPU ids (None: not pinned).
    Raises :class:`LoadDriveError`."""
    import polars as pl

    from harness.loadgen.merge import MergeError, merge_records
    from harness.run.live import RecordsTail

    records_dir.mkdir(parents=True, exist_ok=True)
    locust = LocustRun(
        profile_file(str(profile), records_dir),
        url,
        records_dir,
        records_dir / "locust.log",
        rate_scale=1.0,
        duration_scale=1.0,
        seed=seed,
        grace_s=grace_s,
        cpus=cpus,
    )
    tail = RecordsTail(records_dir)
    locust.start()
    try:
        deadline = time.monotonic() + limit_s
        while locust.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if on_progress is not None:
                tail.poll()
                on_progress(tail.done)
        code = locust.wait(deadline)
    finally:
        locust.stop()  # a no-op once it ended; else (^C, an error) Locust ends too
    if locust.timed_out:
        raise LoadDriveError(
            f"Locust still running {limit_s:.0f} s after its start: stopped; its log ends:\n"
            + locust.log_tail()
        )
    if code not in LOCUST_OK_CODES:
        raise LoadDriveError(f"Locust exited with {code}; its log ends:\n{locust.log_tail()}")
    try:
        summary = merge_records(records_dir)
        client = pl.read_parquet(records_dir / "requests.parquet")
    except (MergeError, OSError, ValueError, pl.exceptions.PolarsError) as exc:
        raise LoadDriveError(f"Locust's records in {records_dir}: {exc}") from None
    if on_progress is not None:
        tail.poll()
        on_progress(tail.done)
    return DrivenLoad(client, summary)
