"""Reading profiles from files: TOML, Python, and the shipped `loadprofiles` package.

Every failure is a ProfileError that starts with the file name; the dict shape itself
is checked by `serialize.profile_from_dict`.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.profiles.errors import ProfileError
from harness.profiles.model import Profile
from harness.profiles.serialize import profile_from_dict

SUFFIXES = (".toml", ".py")
#: Other names of shipped profiles: `default` is the `mixed` profile.
ALIASES = {"default": "mixed"}


def load_profile(path: str | Path) -> Profile:
    """Load a `.toml` profile, or a `.py` file with a module-level `PROFILE` (a
    Profile or a TOML-shaped dict). Every failure is a ProfileError naming the file."""
    path = Path(path)
    try:
        return _load(path)
    except ProfileError as e:
        raise ProfileError(f"{path}: {e}") from e.__cause__


def _load(path: Path) -> Profile:
    if path.suffix not in SUFFIXES:
        raise ProfileError(
            f"unsupported profile file type {path.suffix or '(none)'!r} "
            f"(expected one of {', '.join(SUFFIXES)})"
        )
    if not path.is_file():
        raise ProfileError("no such profile file")
    base_dir = path.resolve().parent
    if path.suffix == ".toml":
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"invalid TOML: {e}") from None
        return profile_from_dict(data, base_dir)
    profile = _exec_python_profile(path)
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, Mapping):
        return profile_from_dict(profile, base_dir)
    raise ProfileError(f"PROFILE: expected a Profile or a dict, got {type(profile).__name__}")


def _exec_python_profile(path: Path) -> Any:
    # A private module name, registered only while the file runs (dataclasses defined
    # in it look their module up in sys.modules); nothing is left in sys.modules or
    # sys.path afterwards.
    module_name = f"_schedscope_profile_{path.stem}_{id(path):x}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ProfileError("cannot import this file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except ProfileError:
        raise
    except Exception as e:
        raise ProfileError(f"error while executing the file: {type(e).__name__}: {e}") from e
    finally:
        sys.modules.pop(module_name, None)
    if not hasattr(module, "PROFILE"):
        raise ProfileError("PROFILE: the file defines no module-level PROFILE")
    return module.PROFILE


def shipped_profiles_dir() -> Path:
    import loadprofiles

    return Path(loadprofiles.__file__).parent


def shipped_profile_names(aliases: bool = True) -> list[str]:
    """Names that `resolve_profile` finds in the `loadprofiles` package (with the
    aliases in ALIASES unless `aliases=False`)."""
    folder = shipped_profiles_dir()
    names = {
        p.stem for p in folder.iterdir() if p.suffix in SUFFIXES and not p.stem.startswith("_")
    }
    if aliases:
        names |= {alias for alias, target in ALIASES.items() if target in names}
    return sorted(names)


def resolve_profile(name_or_path: str | Path) -> Profile:
    """Load `name_or_path` if it is a file; otherwise the shipped profile of that
    name (`loadprofiles/<name>.toml`, then `<name>.py`; `default` is `mixed`)."""
    candidate = Path(name_or_path)
    if candidate.is_file() or candidate.suffix in SUFFIXES or len(candidate.parts) > 1:
        return load_profile(candidate)
    name = ALIASES.get(str(name_or_path), str(name_or_path))
    for suffix in SUFFIXES:
        shipped = shipped_profiles_dir() / f"{name}{suffix}"
        if shipped.is_file():
            return load_profile(shipped)
    raise ProfileError(
        f"{str(name_or_path)!r}: no such file and no shipped profile of that name "
        f"(shipped: {', '.join(shipped_profile_names())})"
    )
