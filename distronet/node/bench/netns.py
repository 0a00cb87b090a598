"""Shaped links for real node processes: network namespaces, veth pairs, one bridge, ``tc``.

Layout (``ShapedNet``, prefix ``P``, subnet ``S`` = e.g. ``10.77.0``)::

    root namespace:  bridge P-br (S.1/24) ── veth Ph<i> (host side of node i)
    namespace P-n<i>:                         veth Pv<i> (S.<10+i>/24), lo

Node ↔ node traffic crosses the bridge, so every byte node ``i`` sends crosses ``Pv<i>`` →
``Ph<i>`` and every byte it receives the reverse: the host side's ``rx_bytes`` is the node's
upload, its ``tx_bytes`` its download. Shaping: the egress of ``Pv<i>`` (inside the namespace)
is the upload link, the egress of ``Ph<i>`` the download link, each a ``tbf`` at the link rate
(plus ``netem`` delay when the kernel has it; many container kernels do not, and then the link
has no added delay — ``ShapedNet.delay_applied`` says which).

Everything needs root and the ``ip`` and ``tc`` tools (:func:`missing_requirements`). Names
start with the prefix so :meth:`ShapedNet.remove_leftovers` can clear a crashed run's.

Errors::

    DistroError
    └── NetnsError   a command of ``ip``/``tc`` failed; the message holds its stderr
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Protocol, Self

from distronet.node.swarm.budget import parse_rate
from distronet.protocol.errors import DistroError

__all__ = [
    "CountedNet",
    "LinkShape",
    "NamespaceNet",
    "NetnsError",
    "ShapedNet",
    "VethSampler",
    "WindowPeak",
    "max_window_bytes",
    "missing_requirements",
]


class NetnsError(DistroError):
    """An ``ip``/``tc`` command failed (the message says which and why)."""


@dataclasses.dataclass(frozen=True)
class LinkShape:
    """One node's access link: ``up``/``down`` as tc rates (``10mbit``), ``delay_ms`` one way
    on each direction (applied only where the kernel has ``netem``)."""

    up: str = "10mbit"
    down: str = "50mbit"
    delay_ms: float = 20.0

    def __post_init__(self) -> None:
        parse_rate(self.up), parse_rate(self.down)
        if self.delay_ms < 0:
            raise NetnsError(f"delay_ms must be >= 0, got {self.delay_ms}")


def missing_requirements() -> str | None:
    """Why shaped links cannot be built here (not root, no ``ip``/``tc``), or None when they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the `{tool}` command (iproute2)"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _tc_bits(rate: str) -> str:
    """A rate for tc, in bit/s (tc's own unit words differ from ours)."""
    return f"{round(parse_rate(rate) * 8)}bit"


class CountedNet(Protocol):
    """What a sampler and a swarm need of a built net (``ShapedNet``, ``netns_nat.NatNet``)."""

    @property
    def n(self) -> int: ...

    @property
    def host_ip(self) -> str: ...

    def node_ip(self, i: int) -> str: ...

    def exec_prefix(self, i: int) -> list[str]: ...

    def counters(self, i: int) -> tuple[int, int]: ...


class NamespaceNet:
    """What a network built of namespaces has in common: :meth:`setup` builds it,
    :meth:`remove_leftovers` removes everything under its prefix (a crashed run's too), and as a
    context manager it is built on entry (removed again when building fails) and removed on exit."""

    def setup(self) -> None:
        raise NotImplementedError

    def remove_leftovers(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        """Remove everything :meth:`setup` built (namespaces take their veths and qdiscs along)."""
        self.remove_leftovers()

    def __enter__(self) -> Self:
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()


class ShapedNet(NamespaceNet):
    """``n`` namespaces on one bridge with shaped veth links. Use as a context manager.

    ``prefix`` (≤ 6 characters, letters/digits) names everything; ``subnet`` is the first three
    octets of a private /24 that nothing else on the machine uses. Cost: about 15 ``ip``/``tc``
    calls per node to build, the same to remove.
    """

    def __init__(self, n: int, link: LinkShape, *, prefix: str = "dn", subnet: str = "10.77.0") -> None:
        if not (prefix.isalnum() and 1 <= len(prefix) <= 6):
            raise NetnsError(f"prefix must be 1..6 letters or digits, got {prefix!r}")
        if not 1 <= n <= 200:
            raise NetnsError(f"n must be in 1..200, got {n}")
        self.n, self.link, self.prefix, self.subnet = n, link, prefix, subnet
        self.bridge = f"{prefix}-br"
        self.delay_applied = False

    @property
    def host_ip(self) -> str:
        """The root namespace's address on the bridge (where a coordinator listens)."""
        return f"{self.subnet}.1"

    def node_ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def ns(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def host_veth(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ns_veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command line to run it inside node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.ns(i)]

    # ------------------------------------------------------------------ build / remove

    def remove_leftovers(self) -> None:
        """Delete every namespace and link named with this prefix (a crashed run's included)."""
        names = _run("ip", "netns", "list", check=False).stdout.split()
        for name in names:
            if name.startswith(f"{self.prefix}-n"):
                _run("ip", "netns", "delete", name, check=False)
        for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                dev = parts[1].strip().split("@")[0]
                if dev == self.bridge or (
                    dev.startswith(f"{self.prefix}h") and dev[len(self.prefix) + 1 :].isdigit()
                ):
                    _run("ip", "link", "delete", dev, check=False)

    def _netem_works(self) -> bool:
        probe = f"{self.prefix}probe"
        _run("ip", "link", "add", probe, "type", "dummy", check=False)
        try:
            return (
                _run(
                    "tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False
                ).returncode
                == 0
            )
        finally:
            _run("ip", "link", "delete", probe, check=False)

    def _shape(self, ns: Sequence[str], dev: str, rate: str) -> None:
        """tbf at ``rate`` on ``dev``'s egress, behind netem delay where available."""
        rate_bits = parse_rate(rate) * 8
        burst = max(16 * 1024, int(rate_bits / 8 / 100))  # 10 ms of rate, at least 16 KiB
        tbf = ["tbf", "rate", _tc_bits(rate), "burst", str(burst), "latency", "400ms"]
        if self.delay_applied:
            _run(*ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                 "delay", f"{self.link.delay_ms}ms", "limit", "10000")  # fmt: skip
            _run(*ns, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
        else:
            _run(*ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf)

    def setup(self) -> None:
        """Build the bridge, namespaces, veths, addresses and shaping. Raises NetnsError."""
        self.remove_leftovers()
        self.delay_applied = self.link.delay_ms > 0 and self._netem_works()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, h, v = self.ns(i), self.host_veth(i), self.ns_veth(i)
            inside = ["ip", "netns", "exec", ns]
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", h, "type", "veth", "peer", "name", v)
            _run("ip", "link", "set", v, "netns", ns)
            _run("ip", "link", "set", h, "master", self.bridge)
            _run("ip", "link", "set", h, "up")
            _run(*inside, "ip", "addr", "add", f"{self.node_ip(i)}/24", "dev", v)
            _run(*inside, "ip", "link", "set", v, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            self._shape(inside, v, self.link.up)
            self._shape([], h, self.link.down)

    # ------------------------------------------------------------------ counters

    def counters(self, i: int) -> tuple[int, int]:
        """Node ``i``'s (upload, download) bytes so far, as counted on its veth."""
        base = f"/sys/class/net/{self.host_veth(i)}/statistics/"
        with open(base + "rx_bytes") as rx, open(base + "tx_bytes") as tx:
            return int(rx.read()), int(tx.read())


@dataclasses.dataclass(frozen=True)
class WindowPeak:
    """The busiest window of one direction of one node: bytes, its span, start (s since sampling began)."""

    nbytes: int
    span_s: float
    start_s: float


def max_window_bytes(samples: Sequence[tuple[float, int]], window_s: float) -> WindowPeak:
    """The most bytes between two samples at most ``window_s`` apart (a sliding window over
    cumulative counters ``(time, bytes)``, time ascending). O(len(samples)) with two pointers."""
    best = WindowPeak(0, 0.0, 0.0)
    j = 0
    for i in range(len(samples)):
        j = max(j, i)
        while j + 1 < len(samples) and samples[j + 1][0] - samples[i][0] <= window_s + 1e-9:
            j += 1
        got = samples[j][1] - samples[i][1]
        if got > best.nbytes:
            best = WindowPeak(got, samples[j][0] - samples[i][0], samples[i][0] - samples[0][0])
    return best


class VethSampler:
    """Samples every node's veth counters every ``interval_s`` in a background thread.

    ``up[i]`` / ``down[i]`` are lists of ``(monotonic time, cumulative bytes)``. Use as a
    context manager (the thread stops on exit).
    """

    def __init__(self, net: CountedNet, interval_s: float = 0.5) -> None:
        self.net, self.interval_s = net, interval_s
        self.up: list[list[tuple[float, int]]] = [[] for _ in range(net.n)]
        self.down: list[list[tuple[float, int]]] = [[] for _ in range(net.n)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="veth-sampler", daemon=True)

    def sample(self) -> None:
        now = time.monotonic()
        for i in range(self.net.n):
            try:
                up, down = self.net.counters(i)
            except OSError:
                continue
            self.up[i].append((now, up))
            self.down[i].append((now, down))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> VethSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.sample()

    def peak(self, i: int, direction: str, window_s: float = 10.0) -> WindowPeak:
        """Node ``i``'s busiest ``window_s`` window in ``direction`` (``up`` or ``down``)."""
        return max_window_bytes(self.up[i] if direction == "up" else self.down[i], window_s)
