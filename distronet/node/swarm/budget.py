"""Token-bucket bandwidth limiters for a node's upload and download budgets.

The owner sets rates (``--up 10mbit --down 100mbit``) for *everything* the node puts on its
link. Every payload byte the node sends or receives first passes :meth:`TokenBucket.acquire`.
Over any window of ``T`` seconds a bucket grants at most ``burst + rate * T`` bytes, so the
long-run rate never exceeds the budget and a burst is bounded by ``burst`` (default: 0.1 s worth
of rate, at least 16 KiB). Callers that must decide *before* sending ask
:meth:`TokenBucket.affordable` / :meth:`TokenBucket.can_afford` ("can I move N payload bytes by
the deadline?") and pull a subset or lower k instead of exceeding it.

Bytes on the wire (``WireModel``, what :meth:`Bandwidth.from_rates` builds by default): a
payload byte costs ``1 + overhead`` bytes on the link (TCP/IP/Ethernet headers per segment,
noise and yamux framing); receiving ``n`` bytes makes the TCP stack send about ``ack * n`` bytes
of acknowledgements the other way (and sending makes acknowledgements come back), which
:class:`Bandwidth` debits from the other direction's bucket; and ``reserve`` bytes/s of each
budget are left to traffic that is not metered byte by byte (gossip announcements and
manifests, DHT records, libp2p keep-alives, the coordinator's HTTP calls). Metered traffic
refills at ``rate - reserve``; ``total_bytes`` counts the wire estimate of metered traffic.

Errors::

    DistroError
    ├── ConfigError          a rate string that does not parse ("10 parsecs")
    └── BudgetError
        └── BudgetExceeded   acquire(n, timeout=...) could not be granted within the timeout
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from distronet.protocol.errors import ConfigError, DistroError

__all__ = [
    "EXACT",
    "Bandwidth",
    "BudgetError",
    "BudgetExceeded",
    "Reservations",
    "TokenBucket",
    "WireModel",
    "format_rate",
    "parse_rate",
]

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

MIN_BURST = 16 * 1024
DEFAULT_BURST_S = 0.1


class BudgetError(DistroError):
    """Root of the bandwidth-budget errors."""


class BudgetExceeded(BudgetError):
    """A transfer could not be granted by its deadline; nothing was consumed."""

    def __init__(self, name: str, nbytes: int, timeout: float, affordable: int) -> None:
        self.nbytes, self.timeout, self.affordable = nbytes, timeout, affordable
        super().__init__(
            f"{name or 'budget'}: {nbytes} bytes do not fit in {timeout:.3f} s "
            f"(at most {affordable} bytes would); pull fewer payloads or lower k"
        )


_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "ki": 1024.0, "mi": 1024.0**2, "gi": 1024.0**3}


def parse_rate(text: str) -> float:
    """Parse an owner-given rate into bytes per second.

    Bits: ``10mbit``, ``100Mbit/s``, ``10mbps``, ``500kbit``, ``1gbit``, ``8bit``.
    Bytes: ``2MB/s``, ``2MBps``, ``512KiB/s``, ``1GB``, ``100B/s``, or a bare number (bytes/s).
    ``unlimited`` / ``inf`` give ``math.inf``. Decimal prefixes are powers of 1000, ``Ki/Mi/Gi`` of 1024.

    Raises:
        ConfigError: on anything else, on zero, or on a negative or non-finite number.
    """
    if not isinstance(text, str):
        raise ConfigError(f"rate must be a string like '10mbit', got {type(text).__name__}")
    if text.strip().lower() in ("unlimited", "inf", "none"):
        return math.inf
    m = _RATE_RE.match(text)
    if m is None:
        raise ConfigError(f"cannot parse rate {text!r}; write e.g. '10mbit', '100mbit' or '2MB/s'")
    number, unit = float(m.group(1)), m.group(2)
    unit = unit[:-2] if unit.endswith("/s") else unit
    if unit.lower().endswith("bps"):  # 10mbps, 10Mbps: bits; 2MBps: bytes
        is_bits, prefix = unit[-3] == "b", unit[:-3]
    elif unit.lower().endswith("bit"):
        is_bits, prefix = True, unit[:-3]
    elif unit.endswith("B"):
        is_bits, prefix = False, unit[:-1]
    elif unit == "":
        is_bits, prefix = False, ""
    else:
        raise ConfigError(f"unknown rate unit in {text!r}; use bit, kbit, mbit, gbit, B/s, KB/s, MB/s, MiB/s")
    scale = _PREFIX.get(prefix.lower())
    if scale is None:
        raise ConfigError(f"unknown unit prefix {prefix!r} in rate {text!r}")
    rate = number * scale / (8.0 if is_bits else 1.0)
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"rate must be positive and finite, got {text!r}")
    return rate


def format_rate(bytes_per_s: float) -> str:
    """Human form of a rate in bits per second, e.g. ``10.0 Mbit/s``."""
    if math.isinf(bytes_per_s):
        return "unlimited"
    bits = bytes_per_s * 8
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.1f} {unit}"
    return f"{bits:.0f} bit/s"


@dataclass(frozen=True)
class WireModel:
    """How payload bytes become bytes on the link (module docstring). ``reserve`` is a share of
    the budget, at least ``reserve_floor`` bytes/s, left for unmetered control traffic.

    Defaults, measured on veth links (tests/chaos/test_node_shaped_links.py): 1448-byte TCP
    segments carry 66 bytes of Ethernet/IP/TCP headers (4.6 %) plus noise and yamux framing;
    Linux acknowledges about every second segment (66 / 2896 = 2.3 %); a 4-node swarm's gossip,
    DHT and coordinator calls take about 3-4 KB/s per node.
    """

    overhead: float = 0.06
    ack: float = 0.025
    reserve: float = 0.08
    reserve_floor: float = 6_000.0

    def __post_init__(self) -> None:
        if not (0 <= self.overhead < 1 and 0 <= self.ack < 1 and 0 <= self.reserve < 0.5):
            raise ConfigError(f"wire model out of range: {self}")
        if not (self.reserve_floor >= 0 and math.isfinite(self.reserve_floor)):
            raise ConfigError(f"reserve_floor must be >= 0 and finite, got {self.reserve_floor}")

    def reserve_for(self, rate: float) -> float:
        """Bytes/s of ``rate`` kept for control traffic (never more than half the budget)."""
        if math.isinf(rate):
            return 0.0
        return min(0.5 * rate, max(self.reserve * rate, self.reserve_floor))


EXACT = WireModel(overhead=0.0, ack=0.0, reserve=0.0, reserve_floor=0.0)
"""Count payload bytes as they are, reserve nothing (unit tests, in-memory transports)."""


class TokenBucket:
    """One direction's limiter over a budget of ``rate`` bytes/s on the wire.

    Metered traffic refills at ``rate - reserve`` bytes/s, at most ``burst`` banked; a payload
    byte costs ``1 + overhead`` tokens (``acquire``/``record``), a raw wire byte one token
    (``record_wire``). Grants are FIFO (one waiter at a time). A request larger than ``burst``
    is granted in slices, so it waits instead of overshooting. ``total_bytes`` counts the wire
    bytes granted. Not thread-safe: use from one event loop.
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        name: str = "",
        overhead: float = 0.0,
        reserve: float = 0.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not rate > 0:
            raise ConfigError(f"{name or 'bucket'}: rate must be positive, got {rate}")
        if not (0 <= reserve < rate or math.isinf(rate)) or not 0 <= overhead < 1:
            raise ConfigError(f"{name or 'bucket'}: need 0 <= reserve < rate and 0 <= overhead < 1")
        metered = rate if math.isinf(rate) else rate - reserve
        if burst is None:
            burst = MIN_BURST if math.isinf(rate) else max(MIN_BURST, metered * DEFAULT_BURST_S)
        if not (burst > 0 and math.isfinite(burst)):
            raise ConfigError(f"{name or 'bucket'}: burst must be positive and finite, got {burst}")
        self.rate, self.burst, self.name = float(rate), float(burst), name
        self.metered_rate, self.overhead, self.reserve = float(metered), float(overhead), float(reserve)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst
        self._last = clock()
        self._queued = 0.0  # tokens requested by acquirers not yet granted
        self._lock = asyncio.Lock()
        self.total_bytes = 0

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate)

    def wire(self, nbytes: int) -> int:
        """Wire bytes (tokens) that ``nbytes`` of payload cost."""
        return nbytes if not self.overhead else math.ceil(nbytes * (1.0 + self.overhead))

    def _refill(self) -> None:
        now = self._clock()
        if not self.unlimited:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.metered_rate)
        self._last = now

    def affordable(self, within_s: float) -> int:
        """Payload bytes that could be granted within ``within_s`` seconds, after queued requests."""
        if self.unlimited:
            return 2**62
        self._refill()
        tokens = self._tokens - self._queued + self.metered_rate * max(0.0, within_s)
        return max(0, math.floor(tokens / (1.0 + self.overhead)))

    def can_afford(self, nbytes: int, within_s: float) -> bool:
        """Whether ``nbytes`` more payload bytes could pass within ``within_s`` seconds (O(1))."""
        return nbytes <= self.affordable(within_s)

    async def acquire(self, nbytes: int, *, timeout: float | None = None) -> None:
        """Wait until ``nbytes`` of payload may be sent/received, then count their wire bytes.

        Raises:
            ValueError: ``nbytes`` negative.
            BudgetExceeded: ``timeout`` given and the bytes cannot be granted within it (checked
                up front; nothing is consumed).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        cost = self.wire(nbytes)
        if self.unlimited:
            self.total_bytes += cost
            return
        if timeout is not None and not self.can_afford(nbytes, timeout):
            raise BudgetExceeded(self.name, nbytes, timeout, self.affordable(timeout))
        remaining = cost
        self._queued += cost
        try:
            async with self._lock:
                while remaining > 0:
                    piece = min(remaining, int(self.burst))
                    self._refill()
                    if self._tokens > piece - 1:  # 1-byte slack: float time steps can stall
                        self._tokens -= piece
                        self._queued -= piece
                        remaining -= piece
                        self.total_bytes += piece
                    else:
                        await self._sleep((piece - self._tokens) / self.metered_rate)
        finally:
            self._queued -= remaining

    def record(self, nbytes: int) -> None:
        """Count payload bytes that passed without waiting (e.g. a protocol header) and debit them."""
        self.record_wire(self.wire(nbytes))

    def record_wire(self, nbytes: int) -> None:
        """Count and debit raw wire bytes that passed without waiting (e.g. TCP acknowledgements)."""
        self.total_bytes += nbytes
        if not self.unlimited:
            self._refill()
            self._tokens -= nbytes


@dataclass(frozen=True)
class Bandwidth:
    """A node's two budgets. Build with :meth:`from_rates` from the owner's strings.

    ``send``/``receive`` are how payload moves: they wait on their own direction's bucket and
    debit the acknowledgements the transfer causes from the other one.
    """

    up: TokenBucket
    down: TokenBucket
    ack: float = 0.0

    @classmethod
    def from_rates(
        cls,
        up: str,
        down: str,
        *,
        wire: WireModel | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> Bandwidth:
        """``Bandwidth.from_rates("10mbit", "100mbit")`` with the default ``WireModel`` (pass
        ``wire=EXACT`` to count payload bytes only). Raises ConfigError on a bad rate."""
        w = WireModel() if wire is None else wire

        def bucket(rate: float, name: str) -> TokenBucket:
            return TokenBucket(
                rate, name=name, overhead=w.overhead, reserve=w.reserve_for(rate), clock=clock, sleep=sleep
            )

        return cls(up=bucket(parse_rate(up), "upload"), down=bucket(parse_rate(down), "download"), ack=w.ack)

    @classmethod
    def unlimited(cls) -> Bandwidth:
        return cls(up=TokenBucket(math.inf, name="upload"), down=TokenBucket(math.inf, name="download"))

    def _acks(self, nbytes: int) -> int:
        return math.ceil(nbytes * self.ack) if self.ack else 0

    async def send(self, nbytes: int) -> None:
        """Wait for upload budget for ``nbytes`` of payload; debit their acknowledgements downstream."""
        await self.up.acquire(nbytes)
        self.down.record_wire(self._acks(nbytes))

    async def receive(self, nbytes: int) -> None:
        """Wait for download budget for ``nbytes`` of payload; debit their acknowledgements upstream."""
        await self.down.acquire(nbytes)
        self.up.record_wire(self._acks(nbytes))

    def sent(self, nbytes: int) -> None:
        """``nbytes`` of payload already went out (a header): count and debit, no wait."""
        self.up.record(nbytes)
        self.down.record_wire(self._acks(nbytes))

    def received(self, nbytes: int) -> None:
        """``nbytes`` of payload already came in (a header): count and debit, no wait."""
        self.down.record(nbytes)
        self.up.record_wire(self._acks(nbytes))


class Reservations:
    """Download budget held for announced frames, against the bytes still to come from each.

    An announcement only *claims* a size. :meth:`admit` holds at most one fair share for it
    (the budget affordable by the deadline divided by ``shares``, at least ``floor`` bytes, never
    more than the claim) and admits it only when the bucket can carry everything held plus that;
    :meth:`arrived` takes bytes that really came off their frame's hold (the bucket has debited
    them); :meth:`release` drops the rest when the pull ends. So a false size holds one share,
    and only until its pull fails, and honest frames are not skipped for it. O(1) each.
    """

    def __init__(self, *, floor: int) -> None:
        self.floor = floor
        self._held: dict[Hashable, int] = {}
        self.held = 0  # bytes held, summed over admitted frames

    def admit(
        self, bucket: TokenBucket, key: Hashable, claimed: int, within_s: float, *, shares: int
    ) -> bool:
        """Hold ``bucket``'s budget for ``claimed`` bytes of ``key`` if it fits by ``within_s``."""
        if key in self._held:
            return False
        share = max(self.floor, bucket.affordable(within_s) // max(1, shares))
        hold = min(max(0, claimed), share)
        if not bucket.can_afford(self.held + hold, within_s):
            return False
        self._held[key] = hold
        self.held += hold
        return True

    def arrived(self, key: Hashable, nbytes: int) -> None:
        """``nbytes`` of ``key``'s frame came in: they no longer need holding."""
        hold = self._held.get(key)
        if hold is not None:
            take = min(hold, max(0, nbytes))
            self._held[key] = hold - take
            self.held -= take

    def release(self, key: Hashable) -> None:
        """``key``'s pull ended (done or failed): free what it still held."""
        self.held -= self._held.pop(key, 0)
