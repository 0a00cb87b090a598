"""Prometheus metrics of one coordinator (own registry, so several can live in one process)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
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


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class _RequestCollector(Collector):
    """Requests by (route, status) and latency by route, counted in plain lists on the hot path
    (a prometheus_client child costs a lock and several calls per observation)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int], list[int]] = {}
        # route -> [count per bucket (non-cumulative, +Inf last), sum of seconds]
        self.latency: dict[str, tuple[list[int], list[float]]] = {}

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        req = CounterMetricFamily(
            "distro_coordinator_requests", "HTTP requests by route and status.", labels=["route", "status"]
        )
        for (route, status), n in sorted(self.counts.items()):
            req.add_metric([route, str(status)], n[0])
        yield req
        lat = HistogramMetricFamily(
            "distro_coordinator_request_seconds", "Request handling time by route.", labels=["route"]
        )
        for route, (counts, total) in sorted(self.latency.items()):
            cum, buckets = 0, []
            for le, hits in zip((*(str(b) for b in LATENCY_BUCKETS), "+Inf"), counts, strict=True):
                cum += hits
                buckets.append((le, cum))
            lat.add_metric([route], buckets, total[0])
        yield lat


class Metrics:
    """Request counters/latency, commit batch sizes/latency, and the service's state."""

    def __init__(self, svc: Coordinator) -> None:
        self.registry = CollectorRegistry()
        self._requests = _RequestCollector()
        self.registry.register(self._requests)
        self.batch = Histogram(
            "distro_coordinator_commit_rows", "Rows per group commit.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000), registry=self.registry,
        )  # fmt: skip
        self.commit = Histogram(
            "distro_coordinator_commit_seconds", "Time per group commit.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5), registry=self.registry,
        )  # fmt: skip
        self.registry.register(_StateCollector(svc))

    def observe(self, route: str, status: int, seconds: float) -> None:
        """Count one request (runs on every request: two dict lookups and a bisect)."""
        r = self._requests
        n = r.counts.get((route, status))
        if n is None:
            n = r.counts[(route, status)] = [0]
        n[0] += 1
        lat = r.latency.get(route)
        if lat is None:
            lat = r.latency[route] = ([0] * (len(LATENCY_BUCKETS) + 1), [0.0])
        lat[0][bisect_left(LATENCY_BUCKETS, seconds)] += 1
        lat[1][0] += seconds

    def on_commit(self, rows: int, seconds: float) -> None:
        self.batch.observe(rows)
        self.commit.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
