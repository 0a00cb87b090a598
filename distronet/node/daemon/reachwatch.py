"""The node's reach, kept current: routes per peer, and the "reaching nobody" diagnosis.

:class:`ReachWatch` collects the dial outcomes the loops see (bootstrap and relay dials in
``discover``, member re-dials in ``swarm.links``), samples p2pd's connections on every
heartbeat (``swarm.reach``) and, once no peer has been reached for ``after_s`` seconds, runs
``swarm.diagnose`` on what it knows (with AutoNAT's verdict from p2pd's own metrics when
``--p2pd-metrics-port`` is set, ``swarm.p2pd_metrics``) and logs the result as a warning — again only every
``every_s`` seconds (or when the cause changes), never stopping the node. Status and
``/metrics`` carry the routes and the current cause; reaching a peer again clears it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import psutil

from distronet.node.daemon.metrics import NodeMetrics
from distronet.node.daemon.status import NodeStatus
from distronet.node.swarm import p2pd_metrics
from distronet.node.swarm.diagnose import CAUSES, Diagnosis, ReachFacts, diagnose, ip_of
from distronet.node.swarm.reach import ReachBook, Route, count, sample
from distronet.node.swarm.stack import Swarm

__all__ = ["MAX_DIALS", "ReachWatch", "local_ips", "port_of"]

log = logging.getLogger(__name__)
MAX_DIALS = 1024  # peers whose last dial outcome is kept (relays and members each)


def local_ips() -> frozenset[str]:
    """This machine's interface addresses (IPv4 and IPv6, scope suffixes dropped)."""
    out: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name in ("AF_INET", "AF_INET6"):
                out.add(a.address.split("%", 1)[0])
    return frozenset(out)


def port_of(maddr: str) -> int | None:
    """The TCP or UDP port of a multiaddr (``/ip4/0.0.0.0/tcp/4001``), None when it has none or 0."""
    parts = maddr.split("/")
    for i, p in enumerate(parts[:-1]):
        if p in ("tcp", "udp") and parts[i + 1].isdigit() and int(parts[i + 1]) > 0:
            return int(parts[i + 1])
    return None


def _peer_of(maddr: str) -> str:
    return maddr.rsplit("/p2p/", 1)[-1] if "/p2p/" in maddr else ""


class ReachWatch:
    """One node's reach bookkeeping and diagnosis timing. Not thread-safe; the loop owns it."""

    def __init__(
        self,
        after_s: float,
        every_s: float,
        *,
        p2pd_metrics_port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after_s, self.every_s, self.clock = after_s, every_s, clock
        self.p2pd_metrics_port = p2pd_metrics_port  # 0: p2pd serves no metrics (AutoNAT unknown)
        self.book = ReachBook()
        self.relays: dict[str, tuple[str, ...]] = {}
        self.relay_dials: dict[str, bool] = {}
        self.member_dials: dict[str, bool] = {}
        self.unreached_since: float | None = clock()
        self.current: Diagnosis | None = None
        self._logged_at: float | None = None

    # ---------------------------------------------------------------- facts from the loops

    def set_relays(self, addrs: tuple[str, ...]) -> None:
        """The relay and bootstrap peers (full multiaddrs ``.../p2p/<id>``), replacing the last list."""
        by_peer: dict[str, list[str]] = {}
        for a in addrs:
            peer = _peer_of(a)
            if peer and (peer in by_peer or len(by_peer) < MAX_DIALS):
                by_peer.setdefault(peer, []).append(a)
        self.relays = {p: tuple(a[:8]) for p, a in by_peer.items()}

    def dialled(self, maddr_or_peer: str, ok: bool) -> None:
        """Record one dial's outcome (a full multiaddr or a bare peer id)."""
        peer = _peer_of(maddr_or_peer) or maddr_or_peer
        book = self.relay_dials if peer in self.relays else self.member_dials
        if peer in book or len(book) < MAX_DIALS:
            book[peer] = ok

    # ---------------------------------------------------------------- decisions

    def waited(self, reached: bool) -> bool:
        """Whether no peer has been reached for ``after_s`` (reaching one resets the clock)."""
        now = self.clock()
        if reached:
            self.unreached_since = None
            return False
        if self.unreached_since is None:
            self.unreached_since = now
        return now - self.unreached_since >= self.after_s

    def due(self, cause_changed: bool) -> bool:
        """Whether to log the diagnosis now (after :meth:`waited`): never logged yet, or the
        cause changed, or last logged ``every_s`` ago."""
        return self._logged_at is None or cause_changed or self.clock() - self._logged_at >= self.every_s

    # ---------------------------------------------------------------- the heartbeat's check

    async def check(self, swarm: Swarm, status: NodeStatus, metrics: NodeMetrics, listen: str) -> None:
        """Sample p2pd's connections into status and metrics; diagnose when nobody is reached
        (``status.peers == 0``) for ``after_s``. Raises SwarmError when p2pd does not answer."""
        routes = self.book.update(await sample(swarm.host))
        _show_routes(status, metrics, routes)
        if self.p2pd_metrics_port:
            got = await p2pd_metrics.fetch(self.p2pd_metrics_port)
            if got is not None:
                status.reachability, status.hole_punches = got.reachability, got.hole_punches
        reached = status.peers > 0
        if not self.waited(reached):
            if reached and self.current is not None:
                log.info("reach: %d peer(s) in the mesh again; diagnosis %s cleared",
                         status.peers, self.current.cause.value)  # fmt: skip
                self._logged_at = None
            if reached:
                self._set(status, metrics, None)
            return
        found = await swarm.membership.members()
        me = swarm.host.peer_id_b58
        members = {p: tuple(m.maddrs) for p, m in found.items() if p != me}
        own, here = tuple(await swarm.host.maddrs()), local_ips()
        facts = ReachFacts(
            relays=dict(self.relays),
            relay_dials=dict(self.relay_dials),
            members=members,
            member_dials=dict(self.member_dials),
            connected=routes,
            own_addrs=own,
            local_ips=here,
            listen_ports=_listen_ports(listen, own, here),
            reachability=status.reachability,
        )
        d = diagnose(facts)
        changed = self.current is None or self.current.cause is not d.cause
        if self.due(changed):
            log.warning("%s", d.text())
            self._logged_at = self.clock()
        self._set(status, metrics, d)

    def _set(self, status: NodeStatus, metrics: NodeMetrics, d: Diagnosis | None) -> None:
        self.current = d
        status.diagnosis = "" if d is None else d.cause.value
        status.diagnosis_text = "" if d is None else d.text()
        for cause in CAUSES:
            metrics.diagnosis.labels(cause).set(1 if d is not None and d.cause.value == cause else 0)


def _listen_ports(listen: str, own: tuple[str, ...], here: frozenset[str]) -> tuple[int, ...]:
    """The ports p2pd listens on: the configured ones, else (port 0: picked by the system) those
    of our advertised addresses on this machine's interfaces."""
    ports = {p for p in (port_of(m) for m in listen.split(",")) if p}
    if not ports:
        ports = {p for p in (port_of(m) for m in own if ip_of(m) in here) if p}
    return tuple(sorted(ports))


def _show_routes(status: NodeStatus, metrics: NodeMetrics, routes: Mapping[str, Route]) -> None:
    c = count(routes)
    status.reach = {p: r.value for p, r in routes.items()}
    status.reach_direct, status.reach_hole_punched, status.reach_relayed = c.direct, c.hole_punched, c.relayed
    for route, n in zip(Route, (c.direct, c.hole_punched, c.relayed), strict=True):
        metrics.links.labels(route.value).set(n)
