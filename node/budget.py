"""Token-bucket bandwidth limiters for a node's upload and download budgets.

The owner sets rates (``--up 10mbit --down 100mbit``); every payload byte the node sends or
receives first passes :meth:`TokenBucket.acquire`. Over any window of ``T`` seconds a bucket
grants at most ``burst + rate * T`` bytes, so the long-run rate never exceeds the budget and a
burst is bounded by ``burst`` (default: 0.1 s worth of rate, at least 16 KiB). Callers that must
decide *before* sending ask :meth:`TokenBucket.affordable` / :meth:`TokenBucket.can_afford`
("can I move N bytes by the deadline?") and pull a subset or lower k instead of exceeding it.

Errors::

    DistroError
    ├── ConfigError          a rate string that does not parse ("10 parsecs")
    └── BudgetError
        └── BudgetExceeded   acquire(n, timeout=...) could not be granted within the timeout

Byte counts are bytes as on the wire as far as this process sees them (payload plus our own
framing); libp2p's noise/yamux framing adds well under 1 % on top and is not counted.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from distronet.protocol.errors import ConfigError, DistroError

__all__ = [
    "Bandwidth",
    "BudgetError",
    "BudgetExceeded",
    "TokenBucket",
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


class TokenBucket:
    """One direction's limiter: ``rate`` bytes/s refilled continuously, at most ``burst`` banked.

    Grants are FIFO (one waiter at a time). A request larger than ``burst`` is granted in
    ``burst``-sized slices, so it waits instead of overshooting. ``total_bytes`` counts what was
    granted. Not thread-safe: use from one event loop.
    """

    def __init__(
        self,
        rate: float,
        *,
        burst: float | None = None,
        name: str = "",
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not rate > 0:
            raise ConfigError(f"{name or 'bucket'}: rate must be positive, got {rate}")
        if burst is None:
            burst = MIN_BURST if math.isinf(rate) else max(MIN_BURST, rate * DEFAULT_BURST_S)
        if not (burst > 0 and math.isfinite(burst)):
            raise ConfigError(f"{name or 'bucket'}: burst must be positive and finite, got {burst}")
        self.rate, self.burst, self.name = float(rate), float(burst), name
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst
        self._last = clock()
        self._queued = 0  # bytes requested by acquirers not yet granted
        self._lock = asyncio.Lock()
        self.total_bytes = 0

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate)

    def _refill(self) -> None:
        now = self._clock()
        if not self.unlimited:
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now

    def affordable(self, within_s: float) -> int:
        """Bytes that could be granted within ``within_s`` seconds, after queued requests."""
        if self.unlimited:
            return 2**62
        self._refill()
        return max(0, math.floor(self._tokens - self._queued + self.rate * max(0.0, within_s)))

    def can_afford(self, nbytes: int, within_s: float) -> bool:
        """Whether ``nbytes`` more could pass within ``within_s`` seconds (cost: O(1))."""
        return nbytes <= self.affordable(within_s)

    async def acquire(self, nbytes: int, *, timeout: float | None = None) -> None:
        """Wait until ``nbytes`` may be sent/received, then count them.

        Raises:
            ValueError: ``nbytes`` negative.
            BudgetExceeded: ``timeout`` given and the bytes cannot be granted within it (checked
                up front; nothing is consumed).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if self.unlimited:
            self.total_bytes += nbytes
            return
        if timeout is not None and not self.can_afford(nbytes, timeout):
            raise BudgetExceeded(self.name, nbytes, timeout, self.affordable(timeout))
        remaining = nbytes
        self._queued += nbytes
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
                        await self._sleep((piece - self._tokens) / self.rate)
        finally:
            self._queued -= remaining

    def record(self, nbytes: int) -> None:
        """Count bytes that passed without waiting (e.g. a protocol header) and debit them."""
        self.total_bytes += nbytes
        if not self.unlimited:
            self._refill()
            self._tokens -= nbytes


@dataclass(frozen=True)
class Bandwidth:
    """A node's two budgets. Build with :meth:`from_rates` from the owner's strings."""

    up: TokenBucket
    down: TokenBucket

    @classmethod
    def from_rates(
        cls, up: str, down: str, *, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep
    ) -> Bandwidth:
        """``Bandwidth.from_rates("10mbit", "100mbit")``. Raises ConfigError on a bad rate."""
        return cls(
            up=TokenBucket(parse_rate(up), name="upload", clock=clock, sleep=sleep),
            down=TokenBucket(parse_rate(down), name="download", clock=clock, sleep=sleep),
        )

    @classmethod
    def unlimited(cls) -> Bandwidth:
        return cls(up=TokenBucket(math.inf, name="upload"), down=TokenBucket(math.inf, name="download"))
