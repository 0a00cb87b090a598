"""Prometheus ``/metrics`` of one node (ARCHITECTURE.md §8), on its own registry.

Names (all prefixed ``distro_node_``): ``steps_total``, ``step_seconds{phase=compute|exchange}``
(histogram), ``bytes_total{direction=up|down}`` (as on the wire), ``budget_bytes_per_second
{direction}``, ``budget_utilisation{direction}`` (rate over the last step / budget), ``peers_live``,
``packets_total{result=accepted|rejected, reason}``, ``loss``, ``step``, ``drift_checks_total
{result=equal|differs}``, ``info{peer_id, run_id, digest}``, ``device_info{device}``,
``peer_links{route=direct|hole_punched|relayed}`` (connected peers by how they are reached),
``reach_diagnosis{cause}`` (1 for the current cause of reaching no peer: no_relay, alone,
firewall, symmetric_nat, unreachable; all 0 while a peer is reached). p2pd's own
libp2p metrics are on ``--p2pd-metrics-port``.
"""

from __future__ import annotations

import math
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    start_http_server,
)

from distronet.protocol.coordinator_api import REACH_CAUSES

__all__ = ["NodeMetrics"]


class NodeMetrics:
    """The node's metric families. ``serve(host, port)`` starts the HTTP endpoint; ``close()`` stops it."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "distro_node_"
        self.steps = Counter(p + "steps", "training steps finished", registry=r)
        self.step_seconds = Histogram(
            p + "step_seconds", "time of one step by phase", ["phase"], registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )  # fmt: skip
        self.bytes = Counter(p + "bytes", "payload bytes as on the wire", ["direction"], registry=r)
        self.budget = Gauge(p + "budget_bytes_per_second", "bandwidth budget", ["direction"], registry=r)
        self.utilisation = Gauge(
            p + "budget_utilisation", "rate over the last step / budget", ["direction"], registry=r
        )
        self.peers = Gauge(p + "peers_live", "peers in this node's gossip mesh", registry=r)
        self.packets = Counter(p + "packets", "packets of peers by outcome", ["result", "reason"], registry=r)
        self.loss = Gauge(p + "loss", "training loss of the last step", registry=r)
        self.step = Gauge(p + "step", "the last finished step", registry=r)
        self.drift = Counter(p + "drift_checks", "parameter-hash checks", ["result"], registry=r)
        self.info = Gauge(p + "info", "constant 1, labelled", ["peer_id", "run_id", "digest"], registry=r)
        self.device = Gauge(
            p + "device_info", "constant 1, labelled with the compute backend", ["device"], registry=r
        )
        self.links = Gauge(p + "peer_links", "connected peers by how they are reached", ["route"], registry=r)
        self.diagnosis = Gauge(
            p + "reach_diagnosis", "1 for the cause of reaching no peer, 0 for the others", ["cause"],
            registry=r,
        )  # fmt: skip
        for route in ("direct", "hole_punched", "relayed"):
            self.links.labels(route).set(0)
        for cause in REACH_CAUSES:
            self.diagnosis.labels(cause).set(0)
        GCCollector(registry=r)  # python_gc_*: a node runs no full collection over its start (join)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        self._server: WSGIServer | None = None

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread. Raises OSError if the port is taken."""
        self._server, _ = start_http_server(port, host, self.registry)

    def set_budget(self, up: float, down: float) -> None:
        for direction, rate in (("up", up), ("down", down)):
            self.budget.labels(direction).set(rate if math.isfinite(rate) else -1.0)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
