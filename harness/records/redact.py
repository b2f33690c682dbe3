"""Secrets kept out of what schedscope writes and prints.

A run records its command line, its target's URL and Locust's command line (run.json,
summary.json, the report), and errors name URLs. None of these may carry a secret: the
value of a flag that takes one (:data:`SECRET_FLAGS`), or the password of a URL
(``http://user:password@host``). Each is replaced by :data:`MASK`; the rest is kept,
so a recorded command still says that a key was given.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

#: What stands for a secret in anything written or printed.
MASK = "***"
#: Flags whose value is a secret (``schedscope run``'s, Locust's, ``dashboards push``').
SECRET_FLAGS = ("--api-key", "--worker-token", "--grafana-token", "--token")


def redact_url(url: str) -> str:
    """``url`` without the password of its user part (``http://ann:***@host/``); a string
    that is not a URL with credentials comes back as it is."""
    if not isinstance(url, str) or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return MASK  # not parseable: it may still hold a secret
    if parts.password is None and parts.username is None:
        return url
    user = f"{parts.username}:{MASK}" if parts.password is not None else MASK
    return _with_userinfo(parts, user + "@")


def strip_credentials(url: str) -> str:
    """``url`` with no user part at all (``http://ann:pw@host/v1`` -> ``http://host/v1``):
    what may travel to another machine."""
    if not isinstance(url, str) or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return _with_userinfo(parts, "")


def _with_userinfo(parts, userinfo: str) -> str:
    # The host and port as written (parts.port raises on a bad one: keep it as it is).
    host_port = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, userinfo + host_port, parts.path, parts.query, parts.fragment))


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with every secret flag's value masked (``--api-key K`` and
    ``--api-key=K``) and every URL's password removed."""
    out: list[str] = []
    masked_next = False
    for arg in argv:
        if masked_next:
            out.append(MASK)
            masked_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                masked_next = True
            continue
        out.append(f"{flag}={redact_url(arg[len(flag) + 1 :])}" if eq else redact_url(arg))
    return out


def worker_host(master_host: str, own_host: str | None) -> str:
    """The target a load-generator worker sends to: the master's (which comes without
    credentials: :func:`strip_credentials`), or the worker's own ``--host`` when that is
    the same target with the credentials the master does not send."""
    if own_host and (not master_host or strip_credentials(own_host) == master_host):
        return own_host
    return master_host or own_host or ""
