"""The custom command-line arguments of every profile run by Locust.

Registered through Locust's ``events.init_command_line_parser``, so they appear in
``locust --help``, in the web UI's start form, in ``locust.conf`` files and as
``LOCUST_*`` environment variables (``LOCUST_PROMPT_MODE`` for ``--prompt-mode``: Locust
reads a variable only for an argument that names it, so :func:`add_arguments` names one
for each), and the master hands them to its workers.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

#: The argument names, as attributes of Locust's parsed options.
NAMES = (
    "rate_scale",
    "duration_scale",
    "seed",
    "endpoint",
    "records_dir",
    "max_in_flight",
    "model",
    "api_key",
    "prompt_mode",
    "continuous_usage",
    "grace",
    "request_timeout",
    "http_client",
    "lag_limit_ms",
)

#: The options that are secrets: never sent to a worker, masked where written.
SECRETS = ("api_key",)

#: ``--prompt-mode``: token ids, text sized with /tokenize, or chosen from the server's
#: vocabulary (harness/loadgen/prompt_choice.py).
PROMPT_MODES = ("token_ids", "text", "auto")
ENDPOINTS = ("completions", "chat")
#: ``--grace``: seconds after the schedule's end the load generator waits for the last
#: responses (``schedscope run --grace`` too).
GRACE_S = 30.0


def env_var(flag: str) -> str:
    """The environment variable of a custom argument: ``--prompt-mode`` ->
    ``LOCUST_PROMPT_MODE``."""
    return "LOCUST_" + flag.lstrip("-").replace("-", "_").upper()


class _WithEnvVars:
    """Locust's parser, each argument given its ``LOCUST_*`` variable (:func:`env_var`)."""

    def __init__(self, parser) -> None:
        self._parser = parser

    def add_argument(self, flag: str, **kwargs):
        kwargs.setdefault("env_var", env_var(flag))
        return self._parser.add_argument(flag, **kwargs)


def add_arguments(parser) -> None:
    group = _WithEnvVars(parser)  # Locust's own add_argument (an argument group drops is_secret)
    from harness.loadgen.relative_rate import rate_scale_arg

    group.add_argument(
        "--rate-scale",
        type=rate_scale_arg,
        default=1.0,
        help="multiply every open-loop rate (default 1); auto[:F]: so the mean offered load "
        "is F (0.8) of the host's capacity on the profile's mix, measured at the start by a "
        "30-second saturation probe",
    )
    group.add_argument(
        "--duration-scale",
        type=float,
        default=1.0,
        help="multiply every phase's duration (default 1)",
    )
    group.add_argument(
        "--seed", type=int, default=-1, help="schedule seed (default: the profile's own)"
    )
    group.add_argument(
        "--endpoint",
        choices=list(ENDPOINTS),
        default="completions",
        help="/v1/completions or /v1/chat/completions",
    )
    group.add_argument(
        "--records-dir",
        default="runs/locust",
        help="per-process JSON-lines records go here (default runs/locust)",
    )
    group.add_argument(
        "--max-in-flight",
        type=int,
        default=1000,
        help="in-flight cap per process; reaching it is recorded (default 1000)",
    )
    group.add_argument(
        "--model", default="", help="model name to send (default: the first of /v1/models)"
    )
    group.add_argument(
        "--api-key", default="", is_secret=True, help="sent as Authorization: Bearer KEY"
    )
    group.add_argument(
        "--prompt-mode",
        choices=list(PROMPT_MODES),
        default="auto",
        help="completions prompts as token ids (exact lengths), text (sized with /tokenize) "
        "or auto (the default, as `schedscope run --target`: token ids below the vocabulary "
        "bound /tokenize shows, else text)",
    )
    group.add_argument(
        "--continuous-usage",
        choices=["auto", "on", "off"],
        default="auto",
        help="per-chunk usage counts (auto: probe the server once)",
    )
    group.add_argument(
        "--grace",
        type=float,
        default=GRACE_S,
        help="seconds after the schedule's end to wait for the last responses",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds a request may wait for its next bytes",
    )
    group.add_argument(
        "--http-client",
        choices=["fast", "requests"],
        default="fast",
        help="fast: geventhttpclient (default); requests: as HttpUser",
    )
    group.add_argument(
        "--lag-limit-ms",
        type=float,
        default=10.0,
        help="p99 send lag above this flags the run generator-limited",
    )


@dataclass(frozen=True)
class LoadgenOptions:
    rate_scale: float = 1.0
    duration_scale: float = 1.0
    seed: int = -1
    endpoint: str = "completions"
    records_dir: str = "runs/locust"
    max_in_flight: int = 1000
    model: str = ""
    api_key: str = ""
    prompt_mode: str = "auto"
    continuous_usage: str = "auto"
    grace: float = GRACE_S
    request_timeout: float = 600.0
    http_client: str = "fast"
    lag_limit_ms: float = 10.0

    @classmethod
    def from_parsed(cls, parsed) -> LoadgenOptions:
        values = {}
        for f in fields(cls):
            if parsed is not None and hasattr(parsed, f.name):
                assert f.default is not MISSING, "every option has a default"
                values[f.name] = type(f.default)(getattr(parsed, f.name))
        return cls(**values)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def shareable(self) -> dict:
        """The options a master sends its workers (``schedscope_split``): every one but
        the secrets. A worker takes its API key from its own command line or
        environment (``--api-key``, ``$LOCUST_API_KEY``; ``schedscope worker --api-key``,
        ``$SCHEDSCOPE_API_KEY``), never from the network."""
        return {k: v for k, v in self.to_dict().items() if k not in SECRETS}

    def public(self) -> dict:
        d = self.to_dict()
        d["api_key"] = "***" if self.api_key else ""
        return d
