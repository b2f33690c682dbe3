"""The top-level deploy/ folder: the compose file and the Kubernetes manifest parse as
YAML, run one master and its workers, and use only schedscope commands and options
that exist (docs/run.md, "Load from several machines")."""

from __future__ import annotations

import yaml
from typer.main import get_command

from harness.cli import app
from tests.support.paths import REPO

DEPLOY = REPO / "deploy"


def _options(command: str) -> set[str]:
    click = get_command(app).commands[command]
    return {opt for p in click.params for opt in p.opts}


def _check_args(args: list[str]) -> None:
    command, *rest = args
    known = _options(command)
    flags = {a for a in rest if a.startswith("--")}
    assert flags <= known, flags - known


def test_compose_runs_a_master_and_scaled_workers():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"target", "master", "worker"}
    master, worker = services["master"]["command"], services["worker"]["command"]
    assert master[0] == "run" and "--expect-workers" in master
    assert master[master.index("--expect-workers") + 1] == services["worker"]["deploy"]["replicas"]
    assert worker[:3] == ["worker", "--master-host", "master"]
    assert master[master.index("--master-port") + 1] == worker[worker.index("--master-port") + 1]
    for args in (services["target"]["command"], master, worker):
        _check_args(args)


def test_kubernetes_manifest_expects_as_many_workers_as_it_runs():
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"Service", "Job", "Deployment"}
    master = kinds["Job"]["spec"]["template"]["spec"]["containers"][0]["args"]
    worker = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    expected = int(master[master.index("--expect-workers") + 1])
    assert expected == kinds["Deployment"]["spec"]["replicas"]
    assert worker[worker.index("--master-host") + 1] == kinds["Service"]["metadata"]["name"]
    assert kinds["Service"]["spec"]["ports"][0]["port"] == int(
        master[master.index("--master-port") + 1]
    )
    for args in (master, worker):
        _check_args(args)
