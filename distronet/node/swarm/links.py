"""Gossip links that never formed: members we are connected to but that are missing from a topic.

In shaped netns runs, two nodes that dial each other at the same moment sometimes end up with a
libp2p connection but without each other in the run's pubsub topic (the subscription exchange
rode a connection that was closed): one side then never hears the other's announcements. A
second dial over an existing connection changes nothing, so :func:`repair_links` closes that
connection and dials the member again, which reruns pubsub's hello on a fresh connection.

:class:`LinkWatch` decides, as a pure function of what one check saw, whom to re-dial: a member
missing from the topic for ``grace`` checks in a row (a peer that just connected has not
announced its subscriptions yet), each at most once per ``every_s`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from hivemind.p2p import PeerID

from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.stack import Swarm

__all__ = ["LinkWatch", "repair_links"]

log = logging.getLogger(__name__)


class LinkWatch:
    """Which members to re-dial, from one check's view. Not thread-safe; one per node."""

    def __init__(self, *, grace: int = 2, every_s: float = 30.0) -> None:
        self.grace, self.every_s = max(1, grace), every_s
        self._missing: dict[str, int] = {}  # peer -> consecutive checks it was missing from the topic
        self._dialled: dict[str, float] = {}  # peer -> when we last re-dialled it
        self.redials = 0

    def due(self, members: Collection[str], in_topic: Collection[str], now: float) -> list[str]:
        """The members (base58 ids, ourselves excluded by the caller) to re-dial now: missing
        from ``in_topic`` for ``grace`` checks in a row and not re-dialled in ``every_s``."""
        missing = {p for p in members if p not in in_topic}
        self._missing = {p: self._missing.get(p, 0) + 1 for p in missing}
        out = [
            p
            for p in sorted(missing)
            if self._missing[p] >= self.grace and now - self._dialled.get(p, -float("inf")) >= self.every_s
        ]
        for p in out:
            self._dialled[p] = now
        return out


async def repair_links(
    swarm: Swarm,
    watch: LinkWatch,
    topics: Sequence[str],
    on_dial: Callable[[str, bool], None] | None = None,
) -> list[str]:
    """One check: members (DHT records) not in every one of ``topics``' peer lists are re-dialled
    (a connected one is disconnected first; one reached only through a relay is left as it is,
    the relay re-dialled instead when it is missing too). Returns the peers found due. Raises SwarmError
    when p2pd or the DHT does not answer; a failed dial is logged and skipped. ``on_dial(peer,
    ok)`` hears each re-dialled member's outcome (any of its addresses answered or none)."""
    me = swarm.host.peer_id_b58
    found = await swarm.membership.members()
    members: Mapping[str, Sequence[str]] = {p: m.maddrs for p, m in found.items() if p != me and m.maddrs}
    in_topic: set[str] | None = None
    for topic in topics:
        peers = {p.to_base58() for p in await swarm.gossip.topic_peers(topic)}
        in_topic = peers if in_topic is None else in_topic & peers
    in_topic = in_topic or set()
    if in_topic & swarm.host.relay_ids:  # gossipsub skips relayed connections; the relay forwards
        in_topic |= await swarm.host.relayed_peers()
    due = watch.due(members, in_topic, time.monotonic())
    if not due:
        return []
    connected = {p.to_base58() for p in await swarm.host.connected_peers()}
    # members reached only through a relay get the run's gossip from the relay: while a connected
    # relay is missing from our topics, re-dial it too (its subscriptions come with a new connection);
    # such a member is left connected: its addresses are behind its router, so a dial of them
    # fails, and the relayed connection dropped was its only path (a NAT chaos test's node never
    # meshed again after this watchdog, early in a loaded run, cut its relayed peers)
    relayed: set[str] = set()
    if connected & swarm.host.relay_ids:
        with contextlib.suppress(SwarmError):
            relayed = set(await swarm.host.relayed_peers())
    for relay in swarm.host.config.relays:
        rid = relay.rsplit("/p2p/", 1)[-1]
        if rid in connected and rid not in in_topic:
            log.warning("relay %s is connected but not in our gossip topics; re-dialling", rid)
            with contextlib.suppress(SwarmError):
                await swarm.host.disconnect(PeerID.from_base58(rid))
                await swarm.host.connect(relay)
    for peer in due:
        if peer in relayed:
            log.info("peer %s is reached through a relay: left connected (gossip comes via the relay)", peer)
            continue
        was = peer in connected
        log.warning("peer %s is a member but not in our gossip topics (%s); re-dialling", peer,
                    "connected" if was else "not connected")  # fmt: skip
        if was:
            with contextlib.suppress(SwarmError):
                await swarm.host.disconnect(PeerID.from_base58(peer))
        ok = False
        for addr in members[peer]:
            full = addr if "/p2p/" in addr else f"{addr}/p2p/{peer}"
            try:
                await swarm.host.connect(full)
                ok = True
                break
            except SwarmError as e:
                log.info("re-dial of %s at %s failed: %s", peer, addr, e)
        if on_dial is not None:
            on_dial(peer, ok)
        watch.redials += 1
    return due
