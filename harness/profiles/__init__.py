"""Load profiles: the request mix and arrival process shared by the simulator and Locust.

A `Profile` (request classes + phases) and a seed give one exact schedule, `Plan`.
Light on purpose: numpy and the stdlib only, so Locust (gevent) can import it.
Schema of the files: docs/profiles.md.
"""

from harness.profiles.distributions import KIND_PARAMS, LengthDistribution
from harness.profiles.errors import ProfileError
from harness.profiles.loader import (
    load_profile,
    profile_from_dict,
    profile_to_dict,
    resolve_profile,
    shipped_profile_names,
)
from harness.profiles.model import Phase, Profile, RequestClass, Slo
from harness.profiles.schedule import PhasePlan, Plan, RequestSpec

__all__ = [
    "KIND_PARAMS",
    "LengthDistribution",
    "Phase",
    "PhasePlan",
    "Plan",
    "Profile",
    "ProfileError",
    "RequestClass",
    "RequestSpec",
    "Slo",
    "load_profile",
    "profile_from_dict",
    "profile_to_dict",
    "resolve_profile",
    "shipped_profile_names",
]
