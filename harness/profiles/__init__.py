"""Load profiles: the request mix and arrival process shared by the simulator and Locust.

A `Profile` (request classes + phases) and a seed give one exact schedule:
`build_plan(profile, seed)` -> `Plan`, or `sample_requests(profile, n, seed)` for
exactly n open-loop requests. Light on purpose: numpy and the stdlib only, so Locust
(gevent) can import it. Schema of the files: docs/profiles.md.

Modules, each importing only those before it: errors, distributions and trace, sessions and
system_prompts (a class's conversations and shared system prompts), model (pure data),
schedule (sampling) and serialize (dicts), prompt_layout (what a planned prompt is made
of), loader (files) and digest (a schedule's digest: what the gate and a distributed
run's workers compare), bundle (a TOML profile and its files packed into text, for remote
workers).
"""

from harness.profiles.distributions import KIND_PARAMS, LengthDistribution, SecondsDistribution
from harness.profiles.errors import ProfileError
from harness.profiles.loader import load_profile, resolve_profile, shipped_profile_names
from harness.profiles.model import Phase, Profile, RequestClass, Slo
from harness.profiles.schedule import (
    PhasePlan,
    Plan,
    RequestSpec,
    SessionSpec,
    build_plan,
    sample_requests,
)
from harness.profiles.serialize import profile_from_dict, profile_to_dict
from harness.profiles.sessions import Sessions
from harness.profiles.system_prompts import SystemPrompts
from harness.profiles.trace import ReplayTrace

__all__ = [
    "KIND_PARAMS",
    "LengthDistribution",
    "Phase",
    "PhasePlan",
    "Plan",
    "Profile",
    "ProfileError",
    "RequestClass",
    "ReplayTrace",
    "RequestSpec",
    "SecondsDistribution",
    "SessionSpec",
    "Sessions",
    "Slo",
    "SystemPrompts",
    "build_plan",
    "load_profile",
    "profile_from_dict",
    "profile_to_dict",
    "resolve_profile",
    "sample_requests",
    "shipped_profile_names",
]
