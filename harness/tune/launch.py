"""``tune --target URL --launch "COMMAND {flags}"``: the user's own engine started with each
configuration to confirm, one at a time (docs/tune.md, "Confirming on your engine").

For each configuration: ``{flags}`` in the command is replaced by its knobs in vLLM's flag
names (:func:`launch_flags`), the command is started in a session of its own (its output in
``<confirm>/launch-<label>.log``), its health awaited at the target URL (``/health``, else
``/v1/models``: 200), the confirmation load served, and the engine stopped: SIGTERM to its
process group, then SIGKILL (harness/processes/stop.py). A command that exits, or never
answers within the timeout, is a :class:`LaunchError` for that configuration: the others go
on. Before the first start nothing may answer at the URL (it would be served in place of the
engine launched: refused, naming it).
"""

from __future__ import annotations

import shlex
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from harness.processes.stop import stop_process
from harness.serve.knobs import knob_flag
from harness.serve.vllm_flags import VLLM_KNOBS, VLLM_POLICIES
from harness.tune.space import Param, Space

#: The placeholder the command must hold.
FLAGS = "{flags}"
#: Seconds between health probes, and the stop's grace before SIGKILL.
POLL_S = 0.5
STOP_TIMEOUT_S = 30.0


#: The knobs a launched engine is given as flags: vLLM's (which ``schedscope serve``
#: takes too), but the pool-sizing ones a search has no business in.
LAUNCH_KNOBS = tuple(
    k for k in VLLM_KNOBS if k not in ("block_size", "max_model_len", "num_gpu_blocks_override")
)


class LaunchError(RuntimeError):
    """A configuration's engine could not be started; the message says why (its exit
    status or the wait, and the tail of its log)."""


def check_command(command: str) -> list[str]:
    """The command split as a shell would (no shell runs it); ValueError when it cannot
    be split or holds no ``{flags}`` word."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"cannot read {command!r}: {exc}") from None
    if not words:
        raise ValueError("the command is empty")
    if FLAGS not in words:
        raise ValueError(
            f"the command holds no {FLAGS} (a word of its own) for the configuration's flags: "
            f"{command!r}"
        )
    return words


def launchable(space: Space) -> tuple[Space, list[str]]:
    """(``space`` with only what a launched engine takes as flags, what was left out):
    the knobs of :data:`LAUNCH_KNOBS`, and the scheduling policies vLLM has."""
    kept: list[Param] = []
    dropped: list[str] = []
    for p in space.params:
        if p.name not in LAUNCH_KNOBS:
            dropped.append(p.name)
            continue
        if p.name == "scheduling_policy":
            choices = tuple(c for c in p.choices if c in VLLM_POLICIES)
            if not choices:
                dropped.append(p.name)
                continue
            if choices != tuple(p.choices):
                dropped += [f"scheduling_policy={c}" for c in p.choices if c not in choices]
                p = replace(p, choices=choices)
        kept.append(p)
    return Space(tuple(kept)), dropped


def with_flags(words: list[str], flags: list[str]) -> list[str]:
    """The command of ``words`` with ``flags`` in place of its ``{flags}`` word."""
    i = words.index(FLAGS)
    return [*words[:i], *flags, *words[i + 1 :]]


def launch_flags(knobs: dict, names: list[str]) -> list[str]:
    """Every knob of ``names`` spelled out with its value in ``knobs`` (vLLM's spelling:
    ``--max-num-seqs 64``, ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``),
    whether or not it is a default: the engine's defaults are not ours."""
    flags: list[str] = []
    for name in names:
        if knobs.get(name) is not None:
            flags += knob_flag(name, knobs[name])
    return flags


def answers(url: str, timeout_s: float = 2.0) -> bool:
    """Whether an OpenAI-compatible server answers 200 at ``url`` (/health, /v1/models)."""
    for path in ("/health", "/v1/models"):
        try:
            with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout_s) as response:
                if response.status == 200:
                    return True
        except Exception:  # noqa: BLE001 - not answering, whatever the reason
            continue
    return False


def _tail(log: Path, chars: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@contextmanager
def launched(words: list[str], flags: list[str], url: str, log: Path, timeout_s: float):
    """The engine of ``words`` (``{flags}`` replaced by ``flags``) running and healthy at
    ``url`` for the ``with`` block, stopped after it; LaunchError when it exits or is not
    healthy within ``timeout_s``."""
    if answers(url):
        raise LaunchError(
            f"something already answers at {url} before the launch: stop it (--launch starts "
            "the engine itself, with each configuration's flags)"
        )
    argv = with_flags(words, flags)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        out.write(("$ " + shlex.join(argv) + "\n").encode())
        out.flush()
        try:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        try:
            deadline = time.monotonic() + timeout_s
            while not answers(url):
                if process.poll() is not None:
                    raise LaunchError(
                        f"the engine exited with status {process.returncode} before it "
                        f"answered at {url}; its log ({log}) ends:\n{_tail(log)}"
                    )
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"the engine did not answer at {url} within {timeout_s:g} s; its log "
                        f"({log}) ends:\n{_tail(log)}"
                    )
                time.sleep(POLL_S)
            yield process
        finally:
            stop_process(process, STOP_TIMEOUT_S, group=True)
