"""No Docker engine runs here, so check what the images and the compose file would run.

Every ENTRYPOINT + command in docker/ must be accepted by our own CLI parsers (the same commands a
test runs outside Docker), ports must agree between Dockerfiles, compose and Prometheus, and every
file the Dockerfiles COPY must exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from distronet.coordinator.cli import build_parser as coordinator_parser
from distronet.node.cli import build_parser as node_parser
from distronet.node.config import config_from_args

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"


def _directive(dockerfile: Path, name: str) -> list[str]:
    for line in dockerfile.read_text().splitlines():
        if line.startswith(name + " "):
            return list(json.loads(line[len(name) + 1 :]))
    raise AssertionError(f"{dockerfile.name} has no {name}")


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _expand(arg: str) -> str:
    # compose's ${VAR:-default} with the default taken
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", arg)


def test_coordinator_entrypoint_parses() -> None:
    argv = _directive(DOCKER / "Dockerfile.coordinator", "ENTRYPOINT")
    assert argv[0] == "distro-coordinator"
    args = coordinator_parser().parse_args(argv[1:])
    assert args.port == 8470 and args.host == "0.0.0.0"
    assert args.db.startswith("sqlite:////data/")


def test_node_entrypoint_plus_compose_command_parses() -> None:
    argv = _directive(DOCKER / "Dockerfile.node", "ENTRYPOINT")
    command = [_expand(a) for a in _compose()["services"]["node"]["command"]]
    assert argv[0] == "distro-node"
    cfg = config_from_args(node_parser().parse_args(argv[1:] + command), environ={})
    assert cfg.run_id == "demo" and cfg.data_dir == "/data"
    assert cfg.coordinator == "http://coordinator:8470"
    assert cfg.net.listen == "/ip4/0.0.0.0/tcp/31337"
    assert cfg.observe.metrics_host == "0.0.0.0" and cfg.observe.metrics_port == 9100


def test_ports_agree_across_files() -> None:
    compose = _compose()
    assert compose["services"]["coordinator"]["ports"] == ["8470:8470"]
    assert "EXPOSE 8470" in (DOCKER / "Dockerfile.coordinator").read_text()
    assert "EXPOSE 31337 9100" in (DOCKER / "Dockerfile.node").read_text()
    prom = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    targets = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert targets["coordinator"]["static_configs"][0]["targets"] == ["coordinator:8470"]
    assert targets["nodes"]["dns_sd_configs"][0]["port"] == 9100


@pytest.mark.parametrize("dockerfile", ["Dockerfile.coordinator", "Dockerfile.node"])
def test_copied_paths_exist(dockerfile: str) -> None:
    for line in (DOCKER / dockerfile).read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"{dockerfile} copies missing {src}"


def test_grafana_dashboard_queries_metrics_the_node_exports() -> None:
    from prometheus_client import generate_latest

    from distronet.node.daemon.metrics import NodeMetrics

    exported = generate_latest(NodeMetrics().registry).decode()
    board = json.loads((DOCKER / "grafana/provisioning/dashboards/distro-node.json").read_text())
    for panel in board["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"distro_node_[a-z_]+", target["expr"]):
                assert f"# TYPE {name} " in exported, f"the dashboard queries {name}, which no node exports"
