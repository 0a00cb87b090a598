"""Homes behind NAT routers for real node processes: namespaces, veths, bridges, nftables, ``tc``.

Layout (``NatNet``, prefix ``P``, public network ``W`` = e.g. ``192.0.0.128/27``, LAN base
``L`` = e.g. ``10.78``)::

    root namespace     bridge P-pub (W[1])              ← the coordinator listens here
    ├── P-p<i>         public node i: eth0 W[2+i]        (on the bridge, no NAT)
    └── P-r<h>         home h's router: wan W[-2-h]      (on the bridge)
        │              bridge lan (L.<10+h>.1/24), nftables masquerade wan-ward, forward filter
        └── P-h<h>n<j> node j of home h: eth0 L.<10+h>.<10+j>/24, default route via the router

The public side needs addresses libp2p counts as public: go-libp2p builds ``/p2p-circuit``
addresses only from a relay's public addresses and drops private (RFC 1918) ones. The default
``W`` is in 192.0.0.0/24 (IETF protocol assignments, never routed on the internet) past the
/26 that multiaddr's ``IsPublicAddr`` calls unroutable, so it counts as public and shadows no
host anyone could reach. Nets built at the same time need disjoint ones: the tests and
``bench nat`` take 192.0.0.64/27, .128/27 and .192/27; .96/27 and .224/27 are free.

Nothing has a default route out of the machine: a router knows only its LAN and ``W``, the root
namespace's forwarding is left as it is, so a packet for another home's LAN gets "no route" at
once and nothing leaves to the outside.

The NAT kinds (:class:`NatKind`):

- ``eim``: the common home router. ``masquerade`` keeps a connection's source port where it is
  free, so one LAN address:port maps to one WAN port whatever the destination
  (endpoint-independent mapping); conntrack admits only replies to what went out
  (address- and port-dependent filtering: a "port-restricted cone").
- ``symmetric``: the carrier-grade kind. ``masquerade random,fully-random`` picks a fresh WAN port
  for every new connection, so the port a peer sees depends on the destination
  (address- and port-dependent mapping); the same filtering.

Neither router forwards a port or answers UPnP, so no one outside a home can open a connection
into it; nodes of one home reach each other on their LAN.

Every node's access link is shaped as in :class:`~distronet.node.bench.netns.ShapedNet`
(``tbf`` up on the node's ``eth0``, down on the other end; ``netem`` delay where the kernel has
it). Counters (:meth:`NatNet.counters`) are read on the node's own ``eth0`` through
``/proc/<pid>/net/dev`` of a holder process (``sleep``) kept in each namespace, so
:class:`~distronet.node.bench.netns.VethSampler` samples a ``NatNet`` like a ``ShapedNet``.

Node indices are flat: public nodes ``0 .. public-1``, then home 0's nodes, then home 1's, ...
Needs root, ``ip``, ``tc`` and ``nft`` (:func:`missing_nat_requirements`). Names start with the
prefix so :meth:`NatNet.remove_leftovers` clears a crashed run's. Errors: ``NetnsError``.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import shutil
import subprocess
from collections.abc import Sequence

from distronet.node.bench.netns import (
    LinkShape,
    NamespaceNet,
    NetnsError,
    _run,
    _tc_bits,
    missing_requirements,
)
from distronet.node.swarm.budget import parse_rate

__all__ = ["Home", "NatKind", "NatNet", "NatNode", "missing_nat_requirements"]


class NatKind(enum.Enum):
    """How a home router maps its LAN onto its one WAN address (module doc)."""

    EIM = "eim"
    SYMMETRIC = "symmetric"


@dataclasses.dataclass(frozen=True)
class Home:
    """One home: its router's NAT kind and how many nodes sit behind it (1..50)."""

    kind: NatKind
    nodes: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 50:
            raise NetnsError(f"a home holds 1..50 nodes, got {self.nodes}")


@dataclasses.dataclass(frozen=True)
class NatNode:
    """One node's place: its index, namespace, address, home (None: public) and NAT kind."""

    index: int
    ns: str
    ip: str
    home: int | None
    kind: NatKind | None

    @property
    def public(self) -> bool:
        return self.home is None


def missing_nat_requirements() -> str | None:
    """Why NAT homes cannot be built here (not root, no ``ip``/``tc``/``nft``), or None."""
    why = missing_requirements()
    if why is None and shutil.which("nft") is None:
        why = "needs the `nft` command (nftables)"
    return why


def _nat_rules(kind: NatKind) -> str:
    """The router's nftables ruleset for ``kind``: masquerade out of ``wan``, and a forward
    filter that lets the LAN out and only replies (conntrack) back in."""
    flags = " random,fully-random" if kind is NatKind.SYMMETRIC else ""
    return (
        "table ip homenat {\n"
        "  chain postrouting { type nat hook postrouting priority 100; policy accept;\n"
        f'    oifname "wan" masquerade{flags}\n'
        "  }\n"
        "  chain forward { type filter hook forward priority 0; policy drop;\n"
        '    iifname "lan" oifname "wan" accept\n'
        '    iifname "lan" oifname "lan" accept\n'
        "    ct state established,related accept\n"
        "  }\n"
        "}\n"
    )


class NatNet(NamespaceNet):
    """``public`` nodes on a public bridge and ``homes`` behind NAT routers. A context manager.

    ``prefix`` (≤ 5 characters, letters/digits) names everything; ``public_net`` is the public
    segment (module doc; two nets built at once need different ones); ``lan_base`` the first two
    octets of the home LANs (home ``h``: ``<lan_base>.<10 + h>.0/24``). Cost: about 20
    ``ip``/``tc``/``nft`` calls per node and router to build; removing is one per namespace.
    """

    def __init__(
        self,
        public: int,
        homes: Sequence[Home],
        link: LinkShape,
        *,
        prefix: str = "dnn",
        public_net: str = "192.0.0.128/27",
        lan_base: str = "10.78",
    ) -> None:
        if not (prefix.isalnum() and 1 <= len(prefix) <= 5):
            raise NetnsError(f"prefix must be 1..5 letters or digits, got {prefix!r}")
        if not 0 <= public <= 50 or not 0 <= len(homes) <= 20:
            raise NetnsError(f"0..50 public nodes and 0..20 homes, got {public} and {len(homes)}")
        octets = lan_base.split(".")
        if len(octets) != 2 or not all(o.isdigit() and int(o) < 256 for o in octets):
            raise NetnsError(f"lan_base must be two octets like 10.78, got {lan_base!r}")
        try:
            self.public_net = ipaddress.IPv4Network(public_net)
        except ValueError as e:
            raise NetnsError(f"public_net must be an IPv4 network like 192.0.0.128/27: {e}") from None
        if public + len(homes) + 4 > self.public_net.num_addresses:
            raise NetnsError(f"{public_net} has no room for {public} public nodes and {len(homes)} routers")
        self.link, self.prefix, self.lan_base = link, prefix, lan_base
        self.homes = tuple(homes)
        self.bridge = f"{prefix}-pub"
        self.delay_applied = False
        self.nodes: list[NatNode] = [
            NatNode(i, f"{prefix}-p{i}", str(self.public_net[2 + i]), None, None) for i in range(public)
        ]
        for h, home in enumerate(self.homes):
            for j in range(home.nodes):
                self.nodes.append(
                    NatNode(len(self.nodes), f"{prefix}-h{h}n{j}", f"{self.lan(h)}.{10 + j}", h, home.kind)
                )
        self._holders: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ names and addresses

    @property
    def n(self) -> int:
        return len(self.nodes)

    @property
    def host_ip(self) -> str:
        """The root namespace's address on the public bridge (where a coordinator listens)."""
        return str(self.public_net[1])

    def lan(self, h: int) -> str:
        """Home ``h``'s LAN, three octets."""
        return f"{self.lan_base}.{10 + h}"

    def router_ns(self, h: int) -> str:
        return f"{self.prefix}-r{h}"

    def router_wan_ip(self, h: int) -> str:
        """The one public address home ``h`` shows the world."""
        return str(self.public_net[-2 - h])

    def node_ip(self, i: int) -> str:
        return self.nodes[i].ip

    def ns(self, i: int) -> str:
        return self.nodes[i].ns

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command line to run it inside node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[i].ns]

    def indices(self, *, home: int | None = None, public: bool = False) -> list[int]:
        """The node indices of home ``home`` (or the public ones with ``public=True``)."""
        if public:
            return [x.index for x in self.nodes if x.public]
        return [x.index for x in self.nodes if x.home == home and home is not None]

    def seen_as(self, i: int) -> str:
        """The address peers outside node ``i``'s home see it come from."""
        home = self.nodes[i].home
        return self.nodes[i].ip if home is None else self.router_wan_ip(home)

    # ------------------------------------------------------------------ build / remove

    def _our_namespaces(self) -> list[str]:
        names = _run("ip", "netns", "list", check=False).stdout.split()
        return [x for x in names if x.startswith(f"{self.prefix}-")]

    def remove_leftovers(self) -> None:
        """Delete every namespace and link named with this prefix (a crashed run's included)."""
        for proc in self._holders.values():
            proc.kill()
            proc.wait(5)
        self._holders.clear()
        for name in self._our_namespaces():
            _run("ip", "netns", "delete", name, check=False)
        for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                dev = parts[1].strip().split("@")[0]
                if dev == self.bridge or (
                    dev.startswith(self.prefix + "x") and dev[len(self.prefix) + 1 :].isdigit()
                ):
                    _run("ip", "link", "delete", dev, check=False)

    def _netem_works(self) -> bool:
        probe = f"{self.prefix}probe"
        _run("ip", "link", "add", probe, "type", "dummy", check=False)
        try:
            add = ("tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms")
            return _run(*add, check=False).returncode == 0
        finally:
            _run("ip", "link", "delete", probe, check=False)

    def _shape(self, ns: str, dev: str, rate: str) -> None:
        """tbf at ``rate`` on ``dev``'s egress in namespace ``ns`` ("" = root), behind netem delay
        where available (as ``ShapedNet`` does)."""
        inside = ["ip", "netns", "exec", ns] if ns else []
        burst = max(16 * 1024, int(parse_rate(rate) / 100))  # 10 ms of rate, at least 16 KiB
        tbf = ["tbf", "rate", _tc_bits(rate), "burst", str(burst), "latency", "400ms"]
        if self.delay_applied:
            _run(*inside, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                 "delay", f"{self.link.delay_ms}ms", "limit", "10000")  # fmt: skip
            _run(*inside, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
        else:
            _run(*inside, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)

    def _add_ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        _run("ip", "-n", name, "link", "set", "lo", "up")
        # a holder keeps a process in the namespace, whose /proc/<pid>/net/dev we read
        self._holders[name] = subprocess.Popen(
            ["ip", "netns", "exec", name, "sleep", "86400"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _build_router(self, h: int) -> None:
        r, wan_root = self.router_ns(h), f"{self.prefix}x{h}"
        self._add_ns(r)
        _run("ip", "link", "add", wan_root, "type", "veth", "peer", "name", "wan", "netns", r)
        _run("ip", "link", "set", wan_root, "master", self.bridge)
        _run("ip", "link", "set", wan_root, "up")
        _run(
            "ip", "-n", r, "addr", "add", f"{self.router_wan_ip(h)}/{self.public_net.prefixlen}", "dev", "wan"
        )
        _run("ip", "-n", r, "link", "set", "wan", "up")
        _run("ip", "-n", r, "link", "add", "lan", "type", "bridge")
        _run("ip", "-n", r, "addr", "add", f"{self.lan(h)}.1/24", "dev", "lan")
        _run("ip", "-n", r, "link", "set", "lan", "up")
        _run("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        proc = subprocess.run(
            ["ip", "netns", "exec", r, "nft", "-f", "-"],
            input=_nat_rules(self.homes[h].kind), capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        if proc.returncode != 0:
            raise NetnsError(f"nft in {r} failed ({proc.returncode}): {proc.stderr.strip()}")

    def _build_node(self, node: NatNode) -> None:
        self._add_ns(node.ns)
        if node.home is None:
            outer_ns, outer = "", f"{self.prefix}x{100 + node.index}"
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", node.ns)
            _run("ip", "link", "set", outer, "master", self.bridge)
            _run("ip", "link", "set", outer, "up")
        else:
            outer_ns, outer = self.router_ns(node.home), f"n{node.index}"
            _run("ip", "-n", outer_ns, "link", "add", outer, "type", "veth", "peer", "name", "eth0",
                 "netns", node.ns)  # fmt: skip
            _run("ip", "-n", outer_ns, "link", "set", outer, "master", "lan")
            _run("ip", "-n", outer_ns, "link", "set", outer, "up")
        plen = 24 if node.home is not None else self.public_net.prefixlen
        _run("ip", "-n", node.ns, "addr", "add", f"{node.ip}/{plen}", "dev", "eth0")
        _run("ip", "-n", node.ns, "link", "set", "eth0", "up")
        if node.home is not None:
            _run("ip", "-n", node.ns, "route", "add", "default", "via", f"{self.lan(node.home)}.1")
        self._shape(node.ns, "eth0", self.link.up)
        self._shape(outer_ns, outer, self.link.down)

    def setup(self) -> None:
        """Build the bridge, routers, namespaces, veths, NAT rules and shaping. Raises NetnsError."""
        self.remove_leftovers()
        self.delay_applied = self.link.delay_ms > 0 and self._netem_works()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host_ip}/{self.public_net.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for h in range(len(self.homes)):
            self._build_router(h)
        for node in self.nodes:
            self._build_node(node)

    # ------------------------------------------------------------------ counters

    def counters(self, i: int) -> tuple[int, int]:
        """Node ``i``'s (upload, download) bytes so far, as counted on its ``eth0``.

        Raises OSError when the namespace's holder is gone (the net was torn down)."""
        holder = self._holders.get(self.nodes[i].ns)
        if holder is None or holder.poll() is not None:
            raise OSError(f"no holder process in {self.nodes[i].ns}")
        with open(f"/proc/{holder.pid}/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == "eth0":
                    fields = rest.split()
                    return int(fields[8]), int(fields[0])  # tx (upload), rx (download)
        raise OSError(f"no eth0 in {self.nodes[i].ns}")
