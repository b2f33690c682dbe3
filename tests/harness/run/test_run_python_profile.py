"""`schedscope run --profile X.py` where X.py only defines PROFILE (no `expose` call).

Before: the file itself was handed to Locust, which found no user class and none of
schedscope's arguments, and the cell failed with Locust's "unrecognized arguments:
--records-dir ...". Now such a file runs through the same wrapper as a TOML profile.
"""

from __future__ import annotations

import json

import polars as pl

from harness.run.loadgen import calls_expose, profile_file
from tests.support.paths import REPO
from tests.support.run_cli import schedscope_run

PROFILE_ONLY = """
from harness.profiles import LengthDistribution, Phase, Profile, RequestClass

PROFILE = Profile(
    name="py_profile_only",
    seed=3,
    classes=(
        RequestClass(
            name="chat",
            prompt_tokens=LengthDistribution.uniform(20, 40),
            output_tokens=LengthDistribution.uniform(4, 8),
        ),
    ),
    phases=(Phase(name="open", duration_s=4, rate=3.0),),
)
"""


def test_calls_expose_tells_the_two_kinds_apart(tmp_path):
    only = tmp_path / "only.py"
    only.write_text(PROFILE_ONLY)
    exposed = tmp_path / "exposed.py"
    exposed.write_text(
        PROFILE_ONLY + "\nfrom harness.loadgen.expose import expose\nexpose(PROFILE, globals())\n"
    )
    dotted = tmp_path / "dotted.py"
    dotted.write_text(
        PROFILE_ONLY + "\nimport harness.loadgen.expose as e\ne.expose(PROFILE, {})\n"
    )
    assert not calls_expose(only)
    assert calls_expose(exposed) and calls_expose(dotted)
    assert calls_expose(REPO / "loadprofiles" / "default_py_example.py")
    # the shipped one is its own locustfile; the other gets the wrapper
    assert profile_file(str(exposed), tmp_path) == exposed
    wrapper = profile_file(str(only), tmp_path)
    assert wrapper == tmp_path / "locustfile.py"
    assert repr(str(only)) in wrapper.read_text()


def test_run_with_a_python_profile_that_only_defines_profile(tmp_path):
    profile = tmp_path / "only.py"
    profile.write_text(PROFILE_ONLY)
    out = tmp_path / "run"
    proc = schedscope_run(
        ["--executor", "sim", "--policy", "fcfs", "--profile", str(profile)]
        + ["--duration-scale", "1", "--grace", "20", "--out", str(out)],
        tmp_path / "store",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads((out / "fcfs" / "run.json").read_text())
    assert not info.get("failures"), info.get("failures")
    frame = pl.read_parquet(out / "fcfs" / "requests.parquet")
    assert frame.height == info["scheduled_requests"] > 0
    assert (frame["status"] == "ok").all()
