"""Why a node reaches nobody, and what to do about it: a pure function of what the node knows.

:func:`diagnose` takes :class:`ReachFacts` (the relay and bootstrap dials, the run's members
from the DHT and our dials to them, our own advertised addresses next to this machine's
interface addresses, AutoNAT's verdict when p2pd's metrics give it) and names one
:class:`Cause`, checked in this order:

``no_relay``
    Relays or bootstrap peers are known, every dial to them failed and nothing is connected:
    outbound connections to them are dropped (a firewall, a proxy) or they are down.
``alone``
    Nobody else is in the run's DHT: there is no peer to reach yet.
``firewall``
    This machine has a public address (an interface address, no NAT in between), yet peers
    do not connect: AutoNAT's dial-backs fail, or every known peer is behind NAT (so it is we
    who must be dialled) and none came in. Something drops the listen port.
``symmetric_nat``
    This node is behind NAT and so is every known peer, none offers a dialable address or a
    relayed one, and no dial to them worked: no mapping to aim at, no hole to punch (what a
    symmetric, address- and port-dependent NAT leaves), and no relay in between.
``unreachable``
    Peers are known and some offer addresses, but every dial failed (the fallback).

"Public" is a globally routable IP (``ipaddress`` ``is_global``); private, shared (CGNAT)
and loopback ranges are not. Each :class:`Diagnosis` carries a message that names the cause
with the facts behind it, and the remedy.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from distronet.node.swarm.reach import Route, is_relayed

__all__ = ["CAUSES", "Cause", "Diagnosis", "ReachFacts", "diagnose", "ip_of", "is_public"]

MAX_NAMED = 3  # addresses named in a message (the rest are counted)


class Cause(enum.Enum):
    NO_RELAY = "no_relay"
    ALONE = "alone"
    FIREWALL = "firewall"
    SYMMETRIC_NAT = "symmetric_nat"
    UNREACHABLE = "unreachable"


CAUSES: tuple[str, ...] = tuple(c.value for c in Cause)


@dataclass(frozen=True)
class ReachFacts:
    """What the node knows about its reach (base58 peer ids, multiaddr strings).

    ``relays``: relay and bootstrap peers -> their addresses; ``relay_dials``: of those, the
    last dial's outcome (absent: not tried). ``members``: the run's other members from the DHT
    -> the addresses they advertise; ``member_dials``: our last dial to each (absent: not
    tried). ``connected``: peers with an open connection now. ``own_addrs``: what p2pd
    advertises for us (interface addresses, observed ones, relay ones); ``local_ips``: this
    machine's interface addresses; ``listen_ports``: the TCP/UDP ports p2pd listens on.
    ``reachability``: AutoNAT's ``public`` / ``private`` / ``unknown``.
    """

    relays: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    relay_dials: Mapping[str, bool] = field(default_factory=dict)
    members: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    member_dials: Mapping[str, bool] = field(default_factory=dict)
    connected: Mapping[str, Route] = field(default_factory=dict)
    own_addrs: tuple[str, ...] = ()
    local_ips: frozenset[str] = frozenset()
    listen_ports: tuple[int, ...] = ()
    reachability: str = "unknown"


@dataclass(frozen=True)
class Diagnosis:
    cause: Cause
    message: str  # the cause, with the facts behind it
    remedy: str  # what the owner can do

    def text(self) -> str:
        return f"reaching no peer: {self.message}. What to do: {self.remedy}"


def ip_of(maddr: str) -> str | None:
    """The IP of an ``/ip4/...`` or ``/ip6/...`` multiaddr (its first component), else None."""
    parts = maddr.split("/")
    if len(parts) >= 3 and parts[1] in ("ip4", "ip6"):
        return parts[2]
    return None


def is_public(ip: str) -> bool:
    """True for a globally routable address; False for private, CGNAT, loopback or malformed."""
    try:
        return ipaddress.ip_address(ip).is_global
    except ValueError:
        return False


def _dialable(addrs: tuple[str, ...]) -> bool:
    """Whether a peer's addresses offer a way in from outside its network: a public direct
    address or a relayed one."""
    return any(is_relayed(a) or is_public(ip_of(a) or "") for a in addrs)


def _named(addrs: list[str]) -> str:
    shown = ", ".join(addrs[:MAX_NAMED])
    return shown + (f" and {len(addrs) - MAX_NAMED} more" if len(addrs) > MAX_NAMED else "")


def _ports(f: ReachFacts) -> str:
    return "/".join(str(p) for p in f.listen_ports) if f.listen_ports else "(the --listen port)"


def diagnose(f: ReachFacts) -> Diagnosis:
    """The cause of reaching nobody (the module docstring's order) and its remedy. Call it when
    no peer is reached; it does not check that itself. Pure; never raises."""
    tried = {r: ok for r, ok in f.relay_dials.items() if r in f.relays}
    if f.relays and tried and not any(tried.values()) and not f.connected:
        addrs = [a for r in sorted(tried) for a in f.relays[r][:1]] or sorted(tried)
        return Diagnosis(
            Cause.NO_RELAY,
            f"no relay reachable: every dial to the run's {len(tried)} relay/bootstrap peer(s) failed "
            f"({_named(addrs)}), and without one a node behind NAT has no way to its peers",
            "check that this machine may open outbound TCP connections to those addresses (a "
            "firewall, a proxy or a filtering router may drop them) and that they are up; the "
            "run's operator can add relays on public addresses (distro-node relay)",
        )
    others = {p: a for p, a in f.members.items() if p not in f.relays}
    if not others:
        return Diagnosis(
            Cause.ALONE,
            "no other node found in the run's DHT"
            + (f" ({len(f.connected)} connection(s), to relay/bootstrap peers only)" if f.connected else ""),
            "wait for other volunteers to join; if the dashboard shows live peers, check that "
            "this node reaches the run's bootstrap peers (--coordinator's join answer)",
        )
    public_here = sorted(ip for ip in f.local_ips if is_public(ip))
    peers_natted = not any(_dialable(a) for a in others.values())
    if public_here and (f.reachability == "private" or (peers_natted and f.reachability != "public")):
        why = (
            "AutoNAT's dial-backs to it fail"
            if f.reachability == "private"
            else f"all {len(others)} known peer(s) are behind NAT, so they must dial us, and none did"
        )
        return Diagnosis(
            Cause.FIREWALL,
            f"this machine has the public address {_named(public_here)} but peers cannot connect "
            f"to it: {why}; a firewall drops the listen port {_ports(f)}",
            f"allow inbound TCP and UDP on port {_ports(f)} (host firewall such as nftables or "
            "ufw, the cloud provider's security group); a fixed port is set with --listen "
            "/ip4/0.0.0.0/tcp/PORT",
        )
    dialled_ok = any(f.member_dials.get(p) for p in others)
    if not public_here and peers_natted and not dialled_ok and f.reachability != "public":
        return Diagnosis(
            Cause.SYMMETRIC_NAT,
            f"this node is behind NAT and so is every known peer ({len(others)}): none offers a "
            "public or relayed address and no dial reached one (a symmetric NAT, which gives "
            "every connection its own port, leaves nothing to dial and no hole to punch)",
            "run a relay on a public address for the run (distro-node relay), or forward a port "
            "to this machine on its router (or enable UPnP there) and give it with --listen",
        )
    failed = sorted(p for p in others if f.member_dials.get(p) is False)
    return Diagnosis(
        Cause.UNREACHABLE,
        f"{len(others)} peer(s) known, {len(failed)} dialled without success"
        + (f" ({_named(failed)})" if failed else ""),
        "check this machine's outbound connections and firewall; a relay on a public address "
        "(distro-node relay) carries traffic between nodes that cannot dial each other",
    )
