"""``schedscope serve``'s server options are generated from ServerSettings: one
default and one help text per limit, in engine/api/state.py, and a value out of range
is a usage error naming its flag."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main
from typer.testing import CliRunner

from engine.api.state import ServerSettings, ServerSettingsError
from harness.cli import app
from harness.serve.server_flags import server_fields, server_flag


def _serve_params() -> dict[str, object]:
    command = typer.main.get_command(app).commands["serve"]
    return {p.name: p for p in command.params}


def test_every_server_setting_with_a_flag_is_an_option_with_its_default_and_help():
    params = _serve_params()
    fields = server_fields()
    assert {f.name for f in fields} >= {"host", "port", "max_connections", "metrics"}
    for f in fields:
        param = params[f.name]
        assert server_flag(f) in param.opts, f.name
        assert param.default == f.default, f.name
        assert param.help == f.metadata["help"], f.name
    # internal settings stay off the command line
    assert "retry_after_s" not in params and "metrics_timeout_s" not in params
    assert params["header_timeout_s"].opts == ["--header-timeout"]
    assert params["api_key"].envvar == "SCHEDSCOPE_API_KEY"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--port", "70000"], "--port"),
        (["--header-timeout", "0"], "--header-timeout"),
        (["--body-timeout", "inf"], "--body-timeout"),
        (["--max-connections", "0"], "--max-connections"),
        (["--max-connections-per-client", "0"], "--max-connections-per-client"),
        (["--engine-liveness-timeout-s", "-1"], "--engine-liveness-timeout-s"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--api-key", ""], "--api-key"),
    ],
)
def test_a_setting_out_of_range_is_exit_2_naming_its_flag(args, flag):
    result = CliRunner().invoke(app, ["serve", "--executor", "sim", *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_validate_names_the_field():
    with pytest.raises(ServerSettingsError) as caught:
        dataclasses.replace(ServerSettings(), max_tokenize_tokens=0).validate()
    assert caught.value.field == "max_tokenize_tokens"
    ServerSettings().validate()  # the defaults are in range
