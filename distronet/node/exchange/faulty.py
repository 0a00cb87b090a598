"""Seeded faults for the in-memory exchange: drop, delay, late, duplicate, reorder, peer death.

Two pieces, both going through the ordinary ``MemoryHub`` / ``MemoryExchange`` code path:

* ``FaultyLinks(plan)`` is a ``Links`` model for the hub. Each transfer (an upload to the round
  manifest, or a delivery to a receiver) is independently lost (``p_drop``), late
  (``p_late``: arrives after the deadline), duplicated (``p_duplicate``) and delayed by a random
  fraction of the deadline (``max_delay``; random delays reorder arrivals). A lost or late upload
  leaves its producer out of the round on every replica; a lost or late delivery is re-pulled.
* ``FaultyExchange(inner, die_at_step=X)`` wraps any ``Exchange``: from step ``X`` on, the peer is
  dead (it leaves the run and its calls raise ``PeerDead``).

Fates are a pure function of ``(seed, kind, step, src, dst)``, so a run replays exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random

from distronet.node.exchange.base import Exchange, Forwarding, PeerDead, Round
from distronet.protocol.errors import ConfigError

__all__ = ["FaultPlan", "FaultyExchange", "FaultyLinks"]


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """Per-transfer fault probabilities (each in [0, 1]) and the seed."""

    seed: int = 0
    p_drop: float = 0.0
    p_late: float = 0.0
    p_duplicate: float = 0.0
    max_delay: float = 0.0  # uniform delay in [0, max_delay] deadlines; must stay <= 1.0
    uploads: bool = True  # apply faults to uploads (changes the accepted set)
    deliveries: bool = True  # apply faults to deliveries (re-pulls, duplicates, reorder)

    def __post_init__(self) -> None:
        for name in ("p_drop", "p_late", "p_duplicate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"FaultPlan.{name} must be in [0, 1], got {v}")
        if not 0.0 <= self.max_delay <= 1.0:
            raise ConfigError(f"FaultPlan.max_delay must be in [0, 1], got {self.max_delay}")


class FaultyLinks:
    """A seeded ``Links`` model applying a ``FaultPlan``. Counts what it did in ``counts``."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.counts = {"drop": 0, "late": 0, "duplicate": 0}

    def _rng(self, kind: str, step: int, src: bytes, dst: bytes | None) -> random.Random:
        h = hashlib.sha256(
            b"|".join([str(self.plan.seed).encode(), kind.encode(), str(step).encode(), src, dst or b""])
        ).digest()
        return random.Random(int.from_bytes(h[:8], "big"))

    def fate(self, kind: str, step: int, src: bytes, dst: bytes | None) -> list[float]:
        p = self.plan
        if (kind == "up" and not p.uploads) or (kind == "down" and not p.deliveries):
            return [0.0]
        rng = self._rng(kind, step, src, dst)
        if rng.random() < p.p_drop:
            self.counts["drop"] += 1
            return []
        copies = 2 if rng.random() < p.p_duplicate else 1
        if copies == 2:
            self.counts["duplicate"] += 1
        out = []
        for _ in range(copies):
            if rng.random() < p.p_late:
                self.counts["late"] += 1
                out.append(1.0 + 1.0 + rng.random())
            else:
                out.append(rng.random() * p.max_delay)
        return out


class FaultyExchange(Forwarding):
    """Wraps an exchange; the peer dies at ``die_at_step`` (leaves the run, then raises ``PeerDead``)."""

    def __init__(self, inner: Exchange, *, die_at_step: int | None = None) -> None:
        super().__init__(inner)
        self._die_at = die_at_step
        self._dead = False

    @property
    def dead(self) -> bool:
        """Whether this peer has died."""
        return self._dead

    def _check(self, step: int) -> None:
        if not self._dead and self._die_at is not None and step >= self._die_at:
            self._dead = True
            self.inner.close()
        if self._dead:
            raise PeerDead(f"peer {self.peer_id.hex()[:16]} died at step {self._die_at}")

    def publish(self, step: int, frame: bytes) -> None:
        self._check(step)
        self.inner.publish(step, frame)

    def collect(self, step: int) -> Round:
        self._check(step)
        return self.inner.collect(step)

    def close(self) -> None:
        self._dead = True
        self.inner.close()
