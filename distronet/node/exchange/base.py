"""The Exchange interface: the optimizer's only view of the network.

The optimizer never knows about sockets, gossip or streams. Each step it hands the exchange one
sealed packet (real bytes, exactly as they travel) and later asks for the round's accepted set.

Contract every implementation keeps (the in-memory one in ``memory.py``, the libp2p swarm later):

* ``publish(step, frame)`` queues this peer's packet for ``step``. It never blocks on peers. A
  second publish for the same step is a programming error (``ExchangeError``). A dead peer's
  publish raises ``PeerDead``.
* ``collect(step) -> Round`` returns the **accepted set** of step ``step``: the packets that
  count, keyed by peer id (raw libp2p peer-id bytes), iterated in ascending peer-id order. Which
  peers count is decided **deterministically and identically on every replica** (a round
  manifest: the peer ids whose packets arrived by the round's deadline, each with the sha256 of
  the one frame that counts). A replica that lacks a frame named in the manifest pulls it (from
  the producer or any peer that has it) before returning; duplicates of the same (peer, step)
  are dropped; a frame whose hash differs from the manifest's is ignored and re-pulled. So every
  replica gets byte-identical frames for the same manifest. The manifest may include the
  caller's own packet or not (its packet may have been lost or late): callers must check.
  ``collect`` blocks until the round is decided (its deadline passed) and raises
  ``RoundUnavailable`` for a step that is gone (older than the retention window) or never opened.
* Frames are returned as received; verifying signatures and decoding is the caller's job (it is
  deterministic, so every replica rejects the same frames).
* ``stats`` counts bytes as on the wire: ``bytes_up`` is what this peer uploaded (one copy of
  each packet it produced, plus copies it served to pullers), ``bytes_down`` what it received.

Errors::

    DistroError
    └── ExchangeError           misuse or failure of an exchange
        ├── PeerDead            this peer has left or died; it can neither publish nor collect
        └── RoundUnavailable    the round asked for is not (or no longer) available
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Mapping

from distronet.protocol.errors import DistroError

__all__ = [
    "Exchange",
    "ExchangeError",
    "ExchangeStats",
    "Forwarding",
    "PeerDead",
    "Round",
    "RoundUnavailable",
]


class ExchangeError(DistroError):
    """Misuse or failure of an exchange (e.g. publishing twice for one step)."""


class PeerDead(ExchangeError):
    """This peer has left the run or died; it can neither publish nor collect."""


class RoundUnavailable(ExchangeError):
    """The round asked for was never opened or is older than the retention window."""


@dataclasses.dataclass(frozen=True)
class Round(Mapping[bytes, bytes]):
    """The accepted set of one step: peer id -> frame, in ascending peer-id order.

    Identical (same keys, same bytes) on every replica that collects the same step.
    """

    step: int
    frames: Mapping[bytes, bytes]

    def __post_init__(self) -> None:
        ordered = dict(sorted(self.frames.items()))
        object.__setattr__(self, "frames", ordered)

    @property
    def manifest(self) -> tuple[bytes, ...]:
        """The accepted peer ids, ascending."""
        return tuple(self.frames)

    def __getitem__(self, peer_id: bytes) -> bytes:
        return self.frames[peer_id]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.frames)

    def __len__(self) -> int:
        return len(self.frames)


@dataclasses.dataclass
class ExchangeStats:
    """Counters of one peer's exchange, bytes as on the wire. Mutable; owned by the exchange."""

    bytes_up: int = 0
    bytes_down: int = 0
    packets_up: int = 0
    packets_down: int = 0
    duplicates_dropped: int = 0
    late_dropped: int = 0
    repulled: int = 0
    bytes_up_by_step: dict[int, int] = dataclasses.field(default_factory=dict)

    def count_up(self, step: int, n: int) -> None:
        """Record ``n`` bytes uploaded for ``step``."""
        self.bytes_up += n
        self.packets_up += 1
        self.bytes_up_by_step[step] = self.bytes_up_by_step.get(step, 0) + n

    def count_down(self, n: int) -> None:
        """Record ``n`` bytes received."""
        self.bytes_down += n
        self.packets_down += 1


class Exchange(abc.ABC):
    """One peer's handle on the run's packet exchange. See the module docstring for the contract."""

    @property
    @abc.abstractmethod
    def peer_id(self) -> bytes:
        """This peer's id (raw libp2p peer-id bytes)."""

    @property
    @abc.abstractmethod
    def stats(self) -> ExchangeStats:
        """Wire counters of this peer."""

    @abc.abstractmethod
    def publish(self, step: int, frame: bytes) -> None:
        """Queue this peer's sealed packet for ``step``.

        Raises ``PeerDead`` if this peer is gone, ``ExchangeError`` on a second publish for ``step``.
        """

    @abc.abstractmethod
    def collect(self, step: int) -> Round:
        """The accepted set of ``step`` (blocks until decided); identical on every replica.

        Raises ``PeerDead`` if this peer is gone, ``RoundUnavailable`` for an unknown or expired step.
        """

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Leave the run; later calls raise ``PeerDead``."""


class Forwarding(Exchange):
    """An exchange that hands every call to ``inner``; wrappers (fault injection, recording,
    counting) subclass it and override only the calls they change."""

    def __init__(self, inner: Exchange) -> None:
        self.inner = inner

    @property
    def peer_id(self) -> bytes:
        return self.inner.peer_id

    @property
    def stats(self) -> ExchangeStats:
        return self.inner.stats

    def publish(self, step: int, frame: bytes) -> None:
        self.inner.publish(step, frame)

    def collect(self, step: int) -> Round:
        return self.inner.collect(step)

    def close(self) -> None:
        self.inner.close()
