"""dashboards/ provisioning, Prometheus, Tempo and compose files: they parse, they point at
each other consistently, and every file the compose stack mounts or builds from exists.
(Docker cannot run here; this checks the files, not a running stack.)"""

from __future__ import annotations

import pytest
import yaml

from harness.grafana import dashboards
from tests.support.paths import REPO

DIR = REPO / "dashboards"
YAML_FILES = sorted([*DIR.glob("*.yml"), *DIR.glob("*.yaml"), *DIR.glob("provisioning/**/*.yml")])


def load(relative: str) -> dict:
    return yaml.safe_load((DIR / relative).read_text())


def test_there_are_yaml_files_and_they_all_parse():
    names = {p.relative_to(DIR).as_posix() for p in YAML_FILES}
    assert {
        "docker-compose.yml",
        "prometheus.yml",
        "tempo.yaml",
        "provisioning/datasources/datasources.yml",
        "provisioning/dashboards/dashboards.yml",
    } <= names
    for path in YAML_FILES:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


def test_prometheus_datasource_links_exemplars_to_tempo():
    sources = {d["uid"]: d for d in load("provisioning/datasources/datasources.yml")["datasources"]}
    prom, tempo = sources["prometheus"], sources["tempo"]
    assert prom["type"] == "prometheus" and tempo["type"] == "tempo"
    assert prom["url"] == "http://prometheus:9090" and tempo["url"] == "http://tempo:3200"
    destinations = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert {"name": "trace_id", "datasourceUid": "tempo"}.items() <= destinations[0].items()


def test_dashboard_provider_loads_the_generated_json():
    compose = load("docker-compose.yml")
    provider = load("provisioning/dashboards/dashboards.yml")["providers"][0]
    path = provider["options"]["path"]
    mounts = compose["services"]["grafana"]["volumes"]
    for uid in dashboards.DASHBOARDS:
        name = dashboards.dashboard_filename(uid)
        assert f"./{name}:{path}/{name}:ro" in mounts


def test_prometheus_scrapes_the_engine_every_second():
    config = load("prometheus.yml")
    job = config["scrape_configs"][0]
    assert job["scrape_interval"] == "1s" and job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["engine:8000"]


def test_tempo_receives_otlp_http_on_4318():
    config = load("tempo.yaml")
    http = config["distributor"]["receivers"]["otlp"]["protocols"]["http"]
    assert http["endpoint"].endswith(":4318")
    assert config["server"]["http_listen_port"] == 3200


def test_compose_services_and_their_flags():
    services = load("docker-compose.yml")["services"]
    assert set(services) == {"engine", "prometheus", "tempo", "grafana"}
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    engine = services["engine"]["command"]
    assert engine[0] == "serve" and engine[engine.index("--executor") + 1] == "sim"
    assert engine[engine.index("--otlp-traces-endpoint") + 1] == "http://tempo:4318/v1/traces"
    assert engine[engine.index("--host") + 1] == "0.0.0.0"
    assert services["grafana"]["image"].startswith("grafana/grafana:11.6")


@pytest.mark.parametrize("service", ["engine", "prometheus", "tempo", "grafana"])
def test_compose_references_files_that_exist(service):
    spec = load("docker-compose.yml")["services"][service]
    for volume in spec.get("volumes", []):
        source = volume.split(":")[0]
        if source.startswith("."):
            assert (DIR / source).exists(), f"{service} mounts {source}, which does not exist"
    build = spec.get("build")
    if build:
        context = (DIR / build["context"]).resolve()
        dockerfile = context / build["dockerfile"]
        assert dockerfile.exists()
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (context / source).exists(), f"Dockerfile copies missing {source}"
    for flag in spec.get("command", []):
        if isinstance(flag, str) and flag.startswith(("-config.file=", "--config.file=")):
            target = flag.split("=", 1)[1]
            assert any(v.split(":")[1] == target for v in spec.get("volumes", [])), flag


@pytest.mark.prometheus
def test_promtool_accepts_the_prometheus_config():
    import subprocess

    from tests.support.components import promtool

    result = subprocess.run(
        [promtool(), "check", "config", str(DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
