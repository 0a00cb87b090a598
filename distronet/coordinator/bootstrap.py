"""Bootstrap peers spread over networks (docs/protocol.md §11): a newcomer's list takes one peer
per /16 (IPv4) or /48 (IPv6) network first, then one per further IP address, then the rest, each
round in random order, so Sybils crowded on one network cannot fill it."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Sequence

from distronet.coordinator.runs import NodeRecord

__all__ = ["network_of", "spread"]


def network_of(multiaddrs: list[str]) -> tuple[str, str]:
    """``(network, address)`` of a peer's first IP multiaddr: its /16 (IPv4) or /48 (IPv6);
    a peer with only DNS or other addresses is its own network (its first multiaddr)."""
    for m in multiaddrs:
        parts = m.split("/")
        if len(parts) < 3 or parts[1] not in ("ip4", "ip6"):
            continue
        try:
            ip = ipaddress.ip_address(parts[2])
        except ValueError:
            continue
        bits = 16 if ip.version == 4 else 48
        net = ipaddress.ip_network(f"{ip}/{bits}", strict=False)
        return str(net), str(ip)
    key = multiaddrs[0] if multiaddrs else ""
    return key, key


def spread(nodes: Sequence[NodeRecord], limit: int, rng: random.Random) -> list[NodeRecord]:
    """Up to ``limit`` of ``nodes`` in the module doc's order (shuffled with ``rng`` first)."""
    live = list(nodes)
    rng.shuffle(live)
    nets: set[str] = set()
    ips: set[str] = set()
    first: list[NodeRecord] = []
    second: list[NodeRecord] = []
    rest: list[NodeRecord] = []
    for n in live:
        net, ip = network_of(n.multiaddrs)
        if net not in nets:
            nets.add(net)
            ips.add(ip)
            first.append(n)
        elif ip not in ips:
            ips.add(ip)
            second.append(n)
        else:
            rest.append(n)
    return (first + second + rest)[:limit]
