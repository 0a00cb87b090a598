"""Prometheus metrics of one coordinator (own registry, so several can live in one process)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from distronet.coordinator.service import Coordinator

__all__ = ["Metrics"]


class _StateCollector(Collector):
    """Reads gauges and counters off the live service at scrape time (no hot-path cost)."""

    def __init__(self, svc: Coordinator) -> None:
        self.svc = svc

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        svc = self.svc
        now = svc.clock()
        for name, value in svc.counters.items():
            c = CounterMetricFamily(f"distro_coordinator_{name}", f"Total {name.replace('_', ' ')}.")
            c.add_metric([], value)
            yield c
        live = GaugeMetricFamily(
            "distro_coordinator_peers_live", "Peers heard from within the timeout.", labels=["run"]
        )
        units = GaugeMetricFamily(
            "distro_coordinator_units", "Shard units by state.", labels=["run", "state"]
        )
        step = GaugeMetricFamily(
            "distro_coordinator_step", "Highest step reported in the run.", labels=["run"]
        )
        for run in svc.runs.values():
            live.add_metric([run.id], len(run.live_nodes(now)))
            done, leased = run.book.done, run.book.leased
            units.add_metric([run.id, "done"], done)
            units.add_metric([run.id, "leased"], leased)
            units.add_metric([run.id, "free"], run.book.n_units - done - leased)
            step.add_metric([run.id], run.max_step)
        yield live
        yield units
        yield step
        sse = GaugeMetricFamily("distro_coordinator_sse_subscribers", "Open event streams.")
        sse.add_metric([], svc.events.subscribers)
        yield sse


class Metrics:
    """Request counters/latency, commit batch sizes/latency, and the service's state."""

    def __init__(self, svc: Coordinator) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "distro_coordinator_requests", "HTTP requests by route and status.", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "distro_coordinator_request_seconds", "Request handling time by route.", ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0), registry=self.registry,
        )  # fmt: skip
        self.batch = Histogram(
            "distro_coordinator_commit_rows", "Rows per group commit.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=self.registry,
        )  # fmt: skip
        self.commit = Histogram(
            "distro_coordinator_commit_seconds", "Time per group commit.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5), registry=self.registry,
        )  # fmt: skip
        self.registry.register(_StateCollector(svc))
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one request (label children cached: this runs on every request)."""
        key = (route, status)
        pair = self._children.get(key)
        if pair is None:
            pair = self._children[key] = (
                self.requests.labels(route, str(status)),
                self.latency.labels(route),
            )
        pair[0].inc()
        pair[1].observe(seconds)

    def on_commit(self, rows: int, seconds: float) -> None:
        self.batch.observe(rows)
        self.commit.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
