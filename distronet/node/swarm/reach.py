"""How this node reaches each connected peer: directly, hole-punched, or through a relay.

p2pd's ``LIST_PEERS`` answers one entry per open connection: the remote peer and the
connection's remote multiaddr. A relayed connection (circuit relay v2) has ``/p2p-circuit`` in
that address; any other is a direct one. p2pd does not say *how* a direct connection came about,
so "hole-punched" is what :class:`ReachBook` can see from outside: a peer that earlier checks
found reachable only through a relay and that now has a direct connection (DCUtR upgraded the
link; the bundled p2pd, go-libp2p 0.32, runs DCUtR when started with ``-autonat``, which
``--nat-traversal`` passes). A peer reached directly from its first check is "direct" even when
a hole punch made that connection (a punch faster than our check period is not told apart), and
a peer whose relayed connection we never saw is never "hole-punched". p2pd's own counter of
punches, ``libp2p_holepunch_outcomes_total``, is on ``--p2pd-metrics-port`` when that is set.

:class:`ReachBook` is pure bookkeeping over successive samples; :func:`sample` asks p2pd.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from distronet.node.swarm.p2p import SwarmHost

__all__ = ["MAX_PEERS", "ReachBook", "ReachCounts", "Route", "is_relayed", "sample"]

MAX_PEERS = 4096  # peers remembered (connections beyond it are counted as seen, not kept)


class Route(enum.Enum):
    """How one peer is reached now."""

    DIRECT = "direct"  # a direct connection (TCP/QUIC), reached so from the start
    HOLE_PUNCHED = "hole_punched"  # direct now, but earlier checks saw it only through a relay
    RELAYED = "relayed"  # only relayed connections (/p2p-circuit)


def is_relayed(maddr: str) -> bool:
    """True for a circuit-relay multiaddr (it carries ``/p2p-circuit``)."""
    return "/p2p-circuit" in maddr


@dataclass(frozen=True)
class ReachCounts:
    """Connected peers by route."""

    direct: int = 0
    hole_punched: int = 0
    relayed: int = 0

    @property
    def total(self) -> int:
        return self.direct + self.hole_punched + self.relayed


class ReachBook:
    """Per peer, the route of its current connections, with the memory that tells a hole punch.

    ``update`` takes one sample (peer id, remote multiaddr per connection) and returns the routes
    of the peers connected now. A peer seen only relayed is remembered as such (up to
    ``MAX_PEERS`` peers) until it connects directly: then it is ``HOLE_PUNCHED`` for as long as
    it stays connected directly. Not thread-safe; one per node.
    """

    def __init__(self, max_peers: int = MAX_PEERS) -> None:
        self.max_peers = max_peers
        self._relayed_before: set[str] = set()  # peers a check found reachable only through a relay
        self._punched: set[str] = set()  # of those, the ones that later connected directly
        self.routes: dict[str, Route] = {}

    def update(self, conns: Iterable[tuple[str, str]]) -> dict[str, Route]:
        """The routes of the peers in ``conns`` (``(peer id, remote multiaddr)`` per connection)."""
        direct: set[str] = set()
        relayed: set[str] = set()
        for peer, addr in conns:
            (relayed if is_relayed(addr) else direct).add(peer)
        routes: dict[str, Route] = {}
        for peer in sorted(direct | relayed)[: self.max_peers]:
            if peer in direct:
                if peer in self._relayed_before:
                    self._punched.add(peer)
                routes[peer] = Route.HOLE_PUNCHED if peer in self._punched else Route.DIRECT
            else:
                routes[peer] = Route.RELAYED
                self._punched.discard(peer)  # back on the relay: a later direct link is a new punch
                if len(self._relayed_before) < self.max_peers:
                    self._relayed_before.add(peer)
        self._punched &= set(routes)  # a punched link that closed is no longer one
        self.routes = routes
        return routes

    def counts(self) -> ReachCounts:
        return count(self.routes)


def count(routes: Mapping[str, Route]) -> ReachCounts:
    """``routes`` tallied by route."""
    vals = list(routes.values())
    return ReachCounts(
        direct=vals.count(Route.DIRECT),
        hole_punched=vals.count(Route.HOLE_PUNCHED),
        relayed=vals.count(Route.RELAYED),
    )


async def sample(host: SwarmHost) -> list[tuple[str, str]]:
    """p2pd's open connections as ``(peer id, remote multiaddr)``, ourselves excluded.

    Raises DaemonError when p2pd does not answer within its call timeout."""
    me = host.peer_id_b58
    return [(p, a) for p, a in await host.connections() if p != me]
