"""The chat mix several shipped profiles share: short chat turns and long generations
(the classes of `mixed`). A module, not a profile: names starting with ``_`` are not
listed by ``shipped_profile_names``."""

from __future__ import annotations

from harness.profiles import LengthDistribution, RequestClass, Slo


def chat_classes(
    short_weight: float = 0.8, long_weight: float = 0.2
) -> tuple[RequestClass, RequestClass]:
    """``short_chat`` (~70 output tokens, TTFT 1 s / TPOT 100 ms SLOs) and
    ``long_generation`` (~400 output tokens, TTFT 5 s / E2E 60 s), in these weights."""
    return (
        RequestClass(
            name="short_chat",
            weight=short_weight,
            priority=0,
            max_tokens=256,
            prompt_tokens=LengthDistribution.lognormal(200, 0.6, max=1024),
            output_tokens=LengthDistribution.lognormal(70, 0.6),
            slo=Slo(ttft_s=1.0, tpot_s=0.1),
        ),
        RequestClass(
            name="long_generation",
            weight=long_weight,
            priority=1,
            max_tokens=1024,
            prompt_tokens=LengthDistribution.lognormal(500, 0.4, max=1024),
            output_tokens=LengthDistribution.lognormal(400, 0.5),
            slo=Slo(ttft_s=5.0, e2e_s=60.0),
        ),
    )
