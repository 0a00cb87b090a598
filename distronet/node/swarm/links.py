"""Gossip links that never formed: members we are connected to but that are missing from a topic.

In shaped netns runs, two nodes that dial each other at the same moment sometimes end up with a
libp2p connection but without each other in the run's pubsub topic (the subscription exchange
rode a connection that was closed): one side then never hears the other's announcements. A
second dial over an existing connection changes nothing, so :func:`repair_links` closes that
connection and dials the member again, which reruns pubsub's hello on a fresh connection.

:class:`LinkWatch` decides, as a pure function of what one check saw, whom to re-dial: a member
missing from the topic for ``grace`` checks in a row (a peer that just connected has not
announced its subscriptions yet), each at most once per ``every_s`` seconds.

A member on our own LAN that we reach only through a relay (the dial over the circuit won the
race; go-libp2p upgrades a relayed connection only towards public addresses) is moved to a
direct connection once: :func:`lan_upgrades` picks it, and :func:`repair_links` closes the
relayed connection and dials the member's LAN address (the circuit again when that fails).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from collections.abc import Collection, Mapping, Sequence

from hivemind.p2p import PeerID

from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.stack import Swarm

__all__ = ["LinkWatch", "lan_upgrades", "repair_links"]

log = logging.getLogger(__name__)


class LinkWatch:
    """Which members to re-dial, from one check's view. Not thread-safe; one per node."""

    def __init__(self, *, grace: int = 2, every_s: float = 30.0) -> None:
        self.grace, self.every_s = max(1, grace), every_s
        self._missing: dict[str, int] = {}  # peer -> consecutive checks it was missing from the topic
        self._dialled: dict[str, float] = {}  # peer -> when we last re-dialled it
        self.redials = 0
        self.upgraded: set[str] = set()  # members we tried to move off a relay (once each)

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


def _private_v4(maddr: str) -> ipaddress.IPv4Address | None:
    parts = maddr.split("/")
    if len(parts) < 3 or parts[1] != "ip4" or "/p2p-circuit" in maddr:
        return None
    try:
        ip = ipaddress.IPv4Address(parts[2])
    except ValueError:
        return None
    return ip if ip.is_private and not ip.is_loopback else None


def lan_upgrades(
    members: Mapping[str, Sequence[str]],
    relayed: Collection[str],
    ours: Sequence[str],
    tried: Collection[str],
) -> dict[str, str]:
    """Relayed-only members (not yet ``tried``) with a private IPv4 address in the /24 of one of
    ``ours`` (our own addresses): peer → that address. A pure function."""
    nets = {ipaddress.IPv4Network(f"{ip}/24", strict=False) for m in ours if (ip := _private_v4(m))}
    out: dict[str, str] = {}
    for peer in sorted(relayed):
        if peer in tried or peer not in members:
            continue
        for m in members[peer]:
            ip = _private_v4(m)
            if ip is not None and any(ip in n for n in nets):
                out[peer] = m
                break
    return out


async def _upgrade(swarm: Swarm, peer: str, lan: str, addrs: Sequence[str]) -> None:
    """Close the relayed connection to ``peer`` and dial ``lan``; the other ``addrs`` (its
    circuit) when that fails. A failed dial is logged."""
    with contextlib.suppress(SwarmError):
        await swarm.host.disconnect(PeerID.from_base58(peer))
    for addr in (lan, *[a for a in addrs if a != lan]):
        full = addr if "/p2p/" in addr else f"{addr}/p2p/{peer}"
        try:
            await swarm.host.connect(full)
            log.info("peer %s on our LAN: moved off the relay to %s", peer, addr)
            return
        except SwarmError as e:
            log.info("dial of %s at %s failed: %s", peer, addr, e)


async def repair_links(swarm: Swarm, watch: LinkWatch, topics: Sequence[str]) -> list[str]:
    """One check: members (DHT records) not in every one of ``topics``' peer lists are re-dialled
    (a connected one is disconnected first). Returns the peers re-dialled. Raises SwarmError
    when p2pd or the DHT does not answer; a failed dial is logged and skipped."""
    me = swarm.host.peer_id_b58
    found = await swarm.membership.members()
    members: Mapping[str, Sequence[str]] = {p: m.maddrs for p, m in found.items() if p != me and m.maddrs}
    in_topic: set[str] | None = None
    for topic in topics:
        peers = {p.to_base58() for p in await swarm.gossip.topic_peers(topic)}
        in_topic = peers if in_topic is None else in_topic & peers
    in_topic = in_topic or set()
    if swarm.host.relay_ids:
        relayed = await swarm.host.relayed_peers()
        if in_topic & swarm.host.relay_ids:  # gossipsub skips relayed connections; the relay forwards
            in_topic |= relayed
        if relayed - watch.upgraded:
            moves = lan_upgrades(members, relayed, await swarm.host.maddrs(), watch.upgraded)
            for peer, lan in moves.items():
                watch.upgraded.add(peer)
                await _upgrade(swarm, peer, lan, members[peer])
    due = watch.due(members, in_topic, time.monotonic())
    if not due:
        return []
    connected = {p.to_base58() for p in await swarm.host.connected_peers()}
    for peer in due:
        was = peer in connected
        log.warning("peer %s is a member but not in our gossip topics (%s); re-dialling", peer,
                    "connected" if was else "not connected")  # fmt: skip
        if was:
            with contextlib.suppress(SwarmError):
                await swarm.host.disconnect(PeerID.from_base58(peer))
        for addr in members[peer]:
            full = addr if "/p2p/" in addr else f"{addr}/p2p/{peer}"
            try:
                await swarm.host.connect(full)
                break
            except SwarmError as e:
                log.info("re-dial of %s at %s failed: %s", peer, addr, e)
        watch.redials += 1
    return due
