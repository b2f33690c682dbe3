"""A TOML profile and every file it names, packed into one text that loads the same
profile on a machine that has none of them.

What a distributed run's master ships to its remote workers (docs/run.md, "Load from
several machines"): the locustfile Locust sends to ``locust -f - --worker`` carries the
packed text, so a worker needs schedscope installed but not the profile's files. The
files a TOML profile names are its empirical length files (``file`` of an ``empirical``
distribution) and its replay traces (``trace`` of a phase); they are packed with the
TOML, up to :data:`MAX_SHIPPED_BYTES` in all (above it, :func:`pack_profile` refuses,
naming the largest file). Unpacking writes them into a private temporary directory that
lives as long as the process (a trace is read again when a rate scale rescales it).
"""

from __future__ import annotations

import atexit
import base64
import json
import shutil
import tempfile
import tomllib
import zlib
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from harness.profiles.errors import ProfileError
from harness.profiles.loader import load_profile
from harness.profiles.model import Profile
from harness.profiles.serialize import profile_from_dict

#: The most bytes (the TOML and its files, uncompressed) a profile may ship.
MAX_SHIPPED_BYTES = 16 * 2**20


def _file_refs(data: Any) -> Iterator[tuple[MutableMapping[str, Any], str]]:
    """(table, key) of every file name in a TOML profile's dict, as the TOML spells it
    (the places serialize.profile_from_dict reads a file from)."""
    if not isinstance(data, dict):
        return
    for item in data.get("classes") or ():
        if isinstance(item, dict):
            for key in ("prompt_tokens", "output_tokens"):
                dist = item.get(key)
                if isinstance(dist, dict) and isinstance(dist.get("file"), str):
                    yield dist, "file"
    for item in data.get("phases") or ():
        if not isinstance(item, dict):
            continue
        trace = item.get("trace")
        if isinstance(trace, str):
            yield item, "trace"
        elif isinstance(trace, dict) and isinstance(trace.get("file"), str):
            yield trace, "file"


def check_shippable(path: str | Path, limit: int = MAX_SHIPPED_BYTES) -> dict[str, Path]:
    """The files the TOML profile at ``path`` names (as it spells them -> where they
    are); a ProfileError naming the largest when they and the TOML exceed ``limit``
    bytes. Sizes only: nothing is read but the TOML (a broken one: as ``load_profile``
    says)."""
    path = Path(path)
    if path.suffix != ".toml":
        raise ProfileError(f"{path}: only a .toml profile is packed")
    try:
        toml = path.read_bytes()
        names = [table[key] for table, key in _file_refs(tomllib.loads(toml.decode("utf-8")))]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        load_profile(path)  # says what is wrong with the file
        raise
    here = path.resolve().parent
    files = {name: here / name for name in names}  # an absolute name stays as it is
    sizes = {name: f.stat().st_size for name, f in files.items() if f.is_file()}
    total = len(toml) + sum(sizes.values())
    if total > limit:
        largest = max(sizes, key=lambda n: sizes[n], default=str(path))
        raise ProfileError(
            f"{path}: the profile and the files it names are {_size(total)}, more than the "
            f"{_size(limit)} a distributed run ships to its workers (largest: {largest}, "
            f"{_size(sizes.get(largest, len(toml)))}); shorten that file "
            f"(a trace: keep only the rows you replay) or run without --expect-workers"
        )
    return files


def pack_profile(path: str | Path, limit: int = MAX_SHIPPED_BYTES) -> str:
    """The TOML profile at ``path`` and the files it names, as text (base64 of
    compressed JSON) for :func:`unpack_profile`; refused as :func:`check_shippable`
    says, else as ``load_profile`` fails for a broken profile."""
    path = Path(path)
    files = check_shippable(path, limit)
    load_profile(path)  # a broken profile fails here, not on the workers
    payload = {
        "name": path.name,
        "toml": base64.b64encode(path.read_bytes()).decode("ascii"),
        "files": {
            name: base64.b64encode(f.read_bytes()).decode("ascii") for name, f in files.items()
        },
    }
    packed = zlib.compress(json.dumps(payload).encode("utf-8"), 9)
    return base64.encodebytes(packed).decode("ascii")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def unpack_profile(packed: str) -> Profile:
    """The profile :func:`pack_profile` packed, its files written into a temporary
    directory removed when the process exits."""
    payload = json.loads(zlib.decompress(base64.b64decode(packed)))
    directory = Path(tempfile.mkdtemp(prefix="schedscope-profile-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    data = tomllib.loads(base64.b64decode(payload["toml"]).decode("utf-8"))
    written: dict[str, str] = {}
    for i, name in enumerate(payload["files"]):
        # the suffix tells a JSONL trace from a CSV one
        target = directory / f"{i}{Path(name).suffix}"
        target.write_bytes(base64.b64decode(payload["files"][name]))
        written[name] = str(target)
    for table, key in _file_refs(data):
        table[key] = written[table[key]]
    try:
        return profile_from_dict(data, directory)
    except ProfileError as e:
        raise ProfileError(f"{payload['name']} (shipped): {e}") from e.__cause__
