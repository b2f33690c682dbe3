"""The master's guard over what reaches its port: Locust's worker -> master messages.

Locust's master takes whatever reaches its port (``--master-bind-port``) as it comes:

- a frame that does not decode as Locust's ``(type, data, node_id)`` (``msgpack`` of a
  bare integer, a byte msgpack never uses) raises out of ``MasterRunner.client_listener``,
  whose greenlet then dies: the master hears no worker again (locust/rpc/zmqrpc.py
  catches only a few decoding errors);
- a message names its sender in its body (``node_id``), which the sender writes;
- Locust's own handlers index into a message's data unchecked, so one of another shape
  (``client_ready`` with a number, ``exception`` with none) kills the listener as well.

:class:`MasterGuard` closes these on one runner, without touching Locust's code: it
replaces the runner's ``server.recv_from_client`` (again after each
``reset_connection``) and ``handle_message`` on that instance only. A frame that does
not decode, or whose ``node_id`` is not the connection's ZMQ identity, is dropped; so is
a message from a peer that never registered (other than Locust's registration,
``client_ready`` and ``locustfile``); a handler's exception drops its message instead of
killing the listener. The sender of every message that passes is its connection's
identity (libzmq refuses a second connection with an identity already connected, so a
peer cannot take a worker's), and ``msg.node_id`` is that identity: the schedscope
handlers (``master_side.py``) take the worker from it, never from the message's data.

Each drop is counted, and its first per sender logged as a warning naming the sender.

``SCHEDSCOPE_WORKER_TOKEN`` (optional, the same on the master and every worker): each
worker sends it in a ``schedscope_hello`` as soon as it is connected; a master that has
one numbers at the start only the workers that presented it (:meth:`wait_for_hellos`)
and drops the schedscope messages of every other peer. The token keeps out peers that
can merely reach the port; it travels in clear, so the network must still be trusted
(docs/run.md, "Load from several machines").
"""

from __future__ import annotations

import hmac
import logging
import os
import time

import gevent
import zmq.error
from locust.exception import RPCError
from locust.rpc.protocol import Message
from locust.stats import RequestStats, StatsEntry, StatsError

log = logging.getLogger("schedscope.loadgen")

#: The shared secret a worker presents and a master with one requires.
TOKEN_ENV = "SCHEDSCOPE_WORKER_TOKEN"
#: A worker's first message: ``{"token": ...}``.
HELLO = "schedscope_hello"
#: Locust's messages of a peer not yet registered: its registration, and the locustfile
#: a worker started with ``-f -`` asks for before it registers.
REGISTRATION = ("client_ready", "locustfile")
#: Seconds the master waits at the start for the hello of a connected worker.
HELLO_WAIT_S = 5.0


def worker_token() -> str:
    """This process's ``$SCHEDSCOPE_WORKER_TOKEN`` ('' when unset)."""
    return os.environ.get(TOKEN_ENV, "").strip()


def decode(frames: list[bytes]) -> tuple[str | None, Message | None, str | None]:
    """``(sender, message, None)`` of one ROUTER frame list, or ``(sender or None,
    None, why)`` for one the master drops."""
    if len(frames) < 2:
        return None, None, "a message of no frame"
    try:
        sender = frames[0].decode("utf-8")
    except UnicodeDecodeError:
        return frames[0].hex(), None, "a sender identity that is not UTF-8"
    try:
        msg = Message.unserialize(frames[1])
    except Exception as e:  # noqa: BLE001 - any frame a peer sends must not stop the master
        return sender, None, f"a frame that is not a Locust message ({type(e).__name__})"
    if not isinstance(msg.type, str) or not isinstance(msg.node_id, str):
        return sender, None, f"a message of another form ({msg.type!r:.40}, {msg.node_id!r:.40})"
    if msg.node_id != sender:
        return sender, None, f"a message that claims to be from {msg.node_id!r:.80}"
    return sender, msg, None


def stats_problem(data: object) -> str | None:
    """Why a worker's ``stats`` report would fail Locust's own reader (None: it reads),
    found by reading it as Locust does into a scratch set of statistics."""
    if not isinstance(data, dict):
        return f"data of type {type(data).__name__}"
    try:
        scratch = RequestStats(use_response_times_cache=True)
        for entry_data in data["stats"]:
            entry = StatsEntry.unserialize(entry_data, scratch)
            StatsEntry(scratch, entry.name, entry.method, use_response_times_cache=True).extend(
                entry
            )
        for error in data["errors"].values():
            StatsError.unserialize(error)
            0 + error["occurrences"]  # Locust adds it to a count
        scratch.total.extend(StatsEntry.unserialize(data["stats_total"], scratch))
    except Exception as e:  # noqa: BLE001 - any fault of the report's shape
        return f"{type(e).__name__}: {e!s:.60}"
    return None


class MasterGuard:
    """One master runner's guard (module docstring). ``token``: the shared secret its
    workers must present ('' or None: none required)."""

    def __init__(self, runner, token: str | None = None) -> None:
        self.runner = runner
        self.token = (token or "").encode()
        self.refused = 0  # messages dropped
        self.refused_by: dict[str, int] = {}  # sender -> messages dropped
        self.presented: set[str] = set()  # client ids that presented the token
        self.known: set[str] = set()  # client ids that ever registered
        #: The run's workers while a run is on (:meth:`lock`): every other peer is
        #: dropped, its Locust registration included (None: no run on).
        self.locked: frozenset[str] | None = None
        self._handle = runner.handle_message
        self._reset = runner.reset_connection

    # -- installing ---------------------------------------------------------------------
    def install(self) -> MasterGuard:
        runner = self.runner
        runner.handle_message = self.handle_message
        runner.reset_connection = self.reset_connection
        self._wrap_server()
        return self

    def reset_connection(self) -> None:
        self._reset()
        self._wrap_server()  # Locust's reset opened a new server

    def _wrap_server(self) -> None:
        server = self.runner.server
        if getattr(server, "schedscope_guarded", False):
            return

        def recv_from_client():
            while True:
                try:
                    frames = server.socket.recv_multipart()
                except zmq.error.ZMQError as e:  # as Locust's own: the listener resets
                    raise RPCError("ZMQ network broken") from e
                sender, msg, why = decode(frames)
                if why is None:
                    return sender, msg
                self.refuse(sender, why)

        server.recv_from_client = recv_from_client
        server.schedscope_guarded = True

    # -- what passes --------------------------------------------------------------------
    def refuse(self, sender: str | None, why: str) -> None:
        """Count a dropped message; warn on the first of each sender."""
        key = sender or "?"
        self.refused += 1
        self.refused_by[key] = self.refused_by.get(key, 0) + 1
        if self.refused_by[key] == 1:
            log.warning(
                "schedscope: ignored %s from %s (a peer that is not a worker of this run, or "
                "a message of another form); further ones from it are counted in workers.json",
                why,
                f"client {sender!r}" if sender else "an unknown sender",
            )

    def trusted(self, client_id: str) -> bool:
        """Whether ``client_id`` may be numbered a worker (it presented the token, or
        none is required)."""
        return not self.token or client_id in self.presented

    def lock(self, workers: list[str]) -> None:
        """A run starts with ``workers``: until :meth:`unlock`, every message from any
        other peer is dropped. A peer that registers mid-run would otherwise join
        Locust's user dispatch, and its reports reach Locust's own handlers."""
        self.locked = frozenset(workers)

    def unlock(self) -> None:
        self.locked = None

    def handle_message(self, client_id: str, msg: Message) -> None:
        """Locust's ``handle_message``, for a message that passed :func:`decode`."""
        kind = msg.type
        if kind == HELLO:
            self._hello(client_id, msg.data)
            return
        if self.locked is not None and client_id not in self.locked:
            self.refuse(client_id, f"a {kind!r:.40} message (not a worker of the run on)")
            return
        if kind not in REGISTRATION and client_id not in self.known:
            if client_id not in self.runner.clients:
                self.refuse(client_id, f"a {kind!r:.40} message")
                return
            self.known.add(client_id)
        if kind not in REGISTRATION and not self.trusted(client_id):
            # Locust's registration must pass (a worker registers before its hello);
            # nothing else does from a peer without the token.
            self.refuse(client_id, f"a {kind!r:.40} message without the worker token")
            return
        if kind == "stats":
            why = stats_problem(msg.data)
            if why is not None:
                # Locust reads a report in an event listener whose exception it does
                # not raise but remembers, and the master then exits 2.
                self.refuse(client_id, f"a stats report that Locust cannot read ({why})")
                return
        try:
            self._handle(client_id, msg)
        except Exception as e:  # noqa: BLE001 - one message must not stop the listener
            self.refuse(client_id, f"a {kind!r:.40} message Locust could not handle ({e!r:.80})")
            return
        if kind == "client_ready" and client_id in self.runner.clients:
            self.known.add(client_id)

    def _hello(self, client_id: str, data: object) -> None:
        if not self.token:
            return
        token = data.get("token") if isinstance(data, dict) else None
        if isinstance(token, str) and hmac.compare_digest(token.encode(), self.token):
            self.presented.add(client_id)
        else:
            self.refuse(client_id, "a hello without the right worker token")

    def wait_for_hellos(self, client_ids: list[str], timeout_s: float = HELLO_WAIT_S) -> None:
        """Wait (at most ``timeout_s``) until each of ``client_ids`` has presented the
        token; nothing to wait for without one. A worker sends its hello as soon as it
        is connected, so Locust may start the test a moment before it arrives."""
        if not self.token:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(c in self.presented for c in client_ids):
            gevent.sleep(0.02)

    def facts(self) -> dict:
        """What workers.json records of the guard."""
        return {
            "token_required": bool(self.token),
            "refused_messages": self.refused,
            "refused_by_sender": dict(sorted(self.refused_by.items())),
        }
