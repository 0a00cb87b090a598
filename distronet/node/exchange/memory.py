"""The in-memory exchange: N peers of one process share a ``MemoryHub``.

The hub plays the network and the round manifest. Time is virtual: each transfer gets an
arrival delay (in round-deadline units) from the hub's ``Links`` model; the default
``PerfectLinks`` delivers every transfer once, at delay 0. ``faulty.FaultyLinks`` drops, delays,
duplicates and reorders transfers, seeded, through this same code path.

A round's life (step ``t``):

1. Each live peer ``publish(t, frame)``: the upload to the hub gets a delay from the links; an
   upload lost or arriving after the deadline (``delay > 1.0``) does not count.
2. The round is decided at the first ``collect(t)`` by any peer (or ``hub.close_round(t)``). In a
   single-threaded simulation that is the deadline: drive every peer's publish for ``t`` first.
   The manifest is ``{peer id: sha256(frame)}`` of the uploads that arrived in time; a later
   publish for ``t`` is counted late and ignored.
3. On close the hub delivers each accepted frame to every other live peer through the links
   (possibly lost, late, duplicated or out of order). ``collect(t)`` reads the caller's inbox,
   keeps the first frame per peer whose hash matches the manifest, and re-pulls any other
   manifest frame from the hub. So all replicas get byte-identical accepted sets.

Cost: O(N) copies of references per round; frames are never copied.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Protocol

from distronet.node.exchange.base import (
    Exchange,
    ExchangeError,
    ExchangeStats,
    PeerDead,
    Round,
    RoundUnavailable,
)

__all__ = ["Links", "MemoryExchange", "MemoryHub", "PerfectLinks"]

DEADLINE = 1.0  # arrival delays are in units of the round deadline


class Links(Protocol):
    """Decides the fate of one transfer: the arrival delay of each copy that arrives.

    ``kind`` is ``"up"`` (producer -> round manifest) or ``"down"`` (manifest -> receiver).
    An empty list means lost; two entries mean duplicated; a delay above 1.0 means late.
    """

    def fate(self, kind: str, step: int, src: bytes, dst: bytes | None) -> list[float]: ...


class PerfectLinks:
    """Every transfer arrives once, immediately."""

    def fate(self, kind: str, step: int, src: bytes, dst: bytes | None) -> list[float]:
        return [0.0]


@dataclasses.dataclass
class _RoundState:
    uploads: dict[bytes, tuple[float, bytes]] = dataclasses.field(default_factory=dict)
    manifest: dict[bytes, bytes] | None = None  # peer id -> sha256 of the frame that counts
    frames: dict[bytes, bytes] = dataclasses.field(default_factory=dict)


class MemoryHub:
    """The shared network and round manifest of an in-process swarm.

    ``retention`` rounds are kept; collecting an older step raises ``RoundUnavailable``.
    """

    def __init__(self, links: Links | None = None, *, retention: int = 8) -> None:
        if retention < 1:
            raise ExchangeError(f"retention must be >= 1, got {retention}")
        self.links: Links = links if links is not None else PerfectLinks()
        self.retention = retention
        self._rounds: dict[int, _RoundState] = {}
        self._live: dict[bytes, MemoryExchange] = {}
        self._newest = -1
        self.late_uploads = 0

    def join(self, peer_id: bytes) -> MemoryExchange:
        """A new peer's exchange. Raises ``ExchangeError`` if the id is already live."""
        if peer_id in self._live:
            raise ExchangeError(f"peer {peer_id.hex()[:16]} already joined")
        ex = MemoryExchange(self, peer_id)
        self._live[peer_id] = ex
        return ex

    def leave(self, peer_id: bytes) -> None:
        """Remove a peer: it stops receiving; its packets already in a manifest still count."""
        self._live.pop(peer_id, None)

    @property
    def live_peers(self) -> tuple[bytes, ...]:
        """Ids of the live peers, ascending."""
        return tuple(sorted(self._live))

    def _round(self, step: int) -> _RoundState:
        if step < self._newest - self.retention + 1 and step not in self._rounds:
            raise RoundUnavailable(f"step {step} is older than the retention window")
        state = self._rounds.get(step)
        if state is None:
            state = self._rounds[step] = _RoundState()
            if step > self._newest:
                self._newest = step
                for old in [s for s in self._rounds if s <= step - self.retention]:
                    del self._rounds[old]
        return state

    def upload(self, step: int, src: bytes, frame: bytes) -> None:
        """A producer's upload for ``step`` (goes through the links)."""
        state = self._round(step)
        if state.manifest is not None:
            self.late_uploads += 1
            return
        for delay in self.links.fate("up", step, src, None):
            if delay > DEADLINE:
                self.late_uploads += 1
                continue
            prev = state.uploads.get(src)
            if prev is None or delay < prev[0]:
                state.uploads[src] = (delay, frame)

    def close_round(self, step: int) -> dict[bytes, bytes]:
        """Decide round ``step`` (idempotent) and deliver its frames; returns the manifest."""
        state = self._round(step)
        if state.manifest is None:
            state.frames = {pid: fr for pid, (_, fr) in sorted(state.uploads.items())}
            state.manifest = {pid: hashlib.sha256(fr).digest() for pid, fr in state.frames.items()}
            for dst_id, dst in sorted(self._live.items()):
                for src_id, fr in state.frames.items():
                    if src_id == dst_id:
                        continue
                    for delay in self.links.fate("down", step, src_id, dst_id):
                        dst._deliver(step, delay, src_id, fr)
        return state.manifest

    def pull(self, step: int, src: bytes) -> bytes:
        """The accepted frame of ``src`` for ``step`` (a re-pull from any holder)."""
        return self._round(step).frames[src]


class MemoryExchange(Exchange):
    """One peer's handle on a ``MemoryHub``. Create with ``hub.join(peer_id)``."""

    def __init__(self, hub: MemoryHub, peer_id: bytes) -> None:
        self._hub = hub
        self._peer_id = peer_id
        self._stats = ExchangeStats()
        self._inbox: dict[int, list[tuple[float, bytes, bytes]]] = {}
        self._own: dict[int, bytes] = {}
        self._closed = False

    @property
    def peer_id(self) -> bytes:
        return self._peer_id

    @property
    def stats(self) -> ExchangeStats:
        return self._stats

    def _deliver(self, step: int, delay: float, src: bytes, frame: bytes) -> None:
        self._inbox.setdefault(step, []).append((delay, src, frame))

    def publish(self, step: int, frame: bytes) -> None:
        if self._closed:
            raise PeerDead(f"peer {self._peer_id.hex()[:16]} has left")
        if step in self._own:
            raise ExchangeError(f"step {step} already published by this peer")
        self._own[step] = frame
        for old in [s for s in self._own if s <= step - self._hub.retention]:
            del self._own[old]
        self._stats.count_up(step, len(frame))
        self._hub.upload(step, self._peer_id, frame)

    def collect(self, step: int) -> Round:
        if self._closed:
            raise PeerDead(f"peer {self._peer_id.hex()[:16]} has left")
        manifest = self._hub.close_round(step)
        got: dict[bytes, bytes] = {}
        own = self._own.get(step)
        if own is not None and self._peer_id in manifest:
            got[self._peer_id] = own
        # arrival order: what a receiver sees first wins among identical copies
        for delay, src, frame in sorted(self._inbox.pop(step, []), key=lambda e: e[0]):
            self._stats.count_down(len(frame))
            if delay > DEADLINE:
                self._stats.late_dropped += 1
                continue
            if src in got:
                self._stats.duplicates_dropped += 1
                continue
            if hashlib.sha256(frame).digest() == manifest.get(src):
                got[src] = frame
        for src in manifest:
            if src not in got:
                frame = self._hub.pull(step, src)
                self._stats.repulled += 1
                self._stats.count_down(len(frame))
                got[src] = frame
        for old in [s for s in self._inbox if s <= step - self._hub.retention]:
            del self._inbox[old]
        return Round(step, got)

    def close(self) -> None:
        self._closed = True
        self._hub.leave(self._peer_id)
