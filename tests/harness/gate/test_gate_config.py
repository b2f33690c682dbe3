"""The gate's TOML rules: every key checked, each error naming the key it is about."""

from __future__ import annotations

import pytest

from harness.gate.config import GateConfigError, default_config, load_config, parse_config


def rules(*tables, gate=None) -> dict:
    body: dict = {"rule": list(tables)}
    if gate is not None:
        body["gate"] = gate
    return body


def test_a_valid_file_parses_with_its_defaults(tmp_path):
    path = tmp_path / "gate.toml"
    path.write_text(
        '[gate]\nconfidence = 0.9\nresamples = 500\nsimulated = "rules"\n'
        '[[rule]]\nname = "short"\ncell = "sjf"\nclass = "short_chat"\nmetric = "ttft"\n'
        "percentile = 99\nmax_regression = 0.05\nmax = 2.0\n"
        '[[rule]]\nmetric = "goodput"\nmin = 1.5\n'
        '[[rule]]\nmetric = "e2e"\npercentile = "mean"\nmax_regression = 0.1\n'
    )
    config = load_config(path)
    assert (config.confidence, config.resamples, config.simulated) == (0.9, 500, "rules")
    short, good, mean = config.rules
    assert (short.cell, short.klass, short.metric, short.percentile) == (
        "sjf",
        "short_chat",
        "ttft",
        99,
    )
    assert (short.max_regression, short.max, short.label) == (0.05, 2.0, "ttft p99")
    assert (good.cell, good.klass, good.min, good.statistic, good.higher_is_better) == (
        "*",
        "all",
        1.5,
        "rate",
        True,
    )
    assert mean.percentile is None and mean.label == "e2e mean"
    assert [r.name for r in config.rules] == ["short", "rule2", "rule3"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (
            {"rule": [{"metric": "ttft", "max_regression": 0.1, "tolerance": 1}]},
            "rule[0].tolerance",
        ),
        ({"rule": [{"metric": "latency", "max": 1}]}, "rule[0].metric"),
        ({"rule": [{"max": 1}]}, "rule[0].metric"),
        ({"rule": [{"metric": "goodput", "percentile": 95, "min": 1}]}, "rule[0].percentile"),
        ({"rule": [{"metric": "ttft", "percentile": 101, "max": 1}]}, "rule[0].percentile"),
        ({"rule": [{"metric": "ttft", "percentile": "p95", "max": 1}]}, "rule[0].percentile"),
        ({"rule": [{"metric": "ttft"}]}, "rule[0]: give at least one"),
        ({"rule": [{"metric": "ttft", "min": 1}]}, "rule[0].min"),
        ({"rule": [{"metric": "goodput", "max": 1}]}, "rule[0].max"),
        ({"rule": [{"metric": "error_rate", "max": 2}]}, "rule[0].max"),
        ({"rule": [{"metric": "ttft", "max_regression": -0.1}]}, "rule[0].max_regression"),
        ({"rule": [{"metric": "ttft", "max_regression": True}]}, "rule[0].max_regression"),
        ({"rule": [{"metric": "ttft", "max": 1, "cell": ""}]}, "rule[0].cell"),
        (
            {
                "rule": [
                    {"metric": "ttft", "max": 1, "name": "a"},
                    {"metric": "e2e", "max": 1, "name": "a"},
                ]
            },
            "rule.name",
        ),
        ({"rule": []}, "rule:"),
        ({}, "rule:"),
        ({"rules": []}, "rules: unknown top-level key"),
        (rules({"metric": "ttft", "max": 1}, gate={"confidense": 0.9}), "gate.confidense"),
        (rules({"metric": "ttft", "max": 1}, gate={"confidence": 1.5}), "gate.confidence"),
        (rules({"metric": "ttft", "max": 1}, gate={"resamples": 10}), "gate.resamples"),
        (rules({"metric": "ttft", "max": 1}, gate={"simulated": "close"}), "gate.simulated"),
    ],
)
def test_each_bad_key_is_named(body, named):
    with pytest.raises(GateConfigError) as caught:
        parse_config(body)
    assert named in str(caught.value)


def test_unreadable_and_invalid_files_name_the_file(tmp_path):
    with pytest.raises(GateConfigError, match="missing.toml"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rule]\n")
    with pytest.raises(GateConfigError, match="bad.toml: not valid TOML"):
        load_config(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[[rule]]\nmetric = "ttfb"\nmax = 1\n')
    with pytest.raises(
        GateConfigError, match=r"wrong.toml: rule\[0\].metric: unknown metric 'ttfb'"
    ):
        load_config(wrong)


def test_the_default_rules():
    config = default_config()
    assert [(r.metric, r.max_regression, r.max) for r in config.rules] == [
        ("ttft", 0.10, None),
        ("e2e", 0.10, None),
        ("error_rate", None, 0.01),
    ]
