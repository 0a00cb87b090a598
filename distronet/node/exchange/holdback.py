"""Messages for steps past a replica's window, held (bounded) until the window gets there.

A replica that was paused, or that is downloading the swarm's state, hears its peers'
announcements and manifests for steps ahead of its own window. The exchange refuses to open
rounds for them (a peer must not be able to push a replica forward), but it keeps the newest
few per sender here: they tell the replica it fell behind, and once it has adopted the swarm's
state and its window moves there, they are handed back so its first rounds know the producers
and the leader's manifest that the others already used.

Bounds: at most ``per_source`` steps per sender (the newest win) and ``max_sources`` senders
(a new sender is refused when full), so a flood of signed far-future messages costs a bounded
amount of memory and cannot evict what honest peers sent.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["HoldBack"]

T = TypeVar("T")


class HoldBack(Generic[T]):
    """Items keyed by (sender, step), newest ``per_source`` steps per sender. Not thread-safe."""

    def __init__(self, per_source: int = 8, max_sources: int = 256) -> None:
        if per_source < 1 or max_sources < 1:
            raise ValueError("per_source and max_sources must be >= 1")
        self.per_source, self.max_sources = per_source, max_sources
        self._held: dict[bytes, dict[int, T]] = {}

    def __len__(self) -> int:
        return sum(len(steps) for steps in self._held.values())

    def hold(self, source: bytes, step: int, item: T) -> bool:
        """Keep ``item``; False when it was not kept (sender table full, or older than the
        sender's newest ``per_source`` steps, or that step already held)."""
        steps = self._held.get(source)
        if steps is None:
            if len(self._held) >= self.max_sources:
                return False
            steps = self._held[source] = {}
        if step in steps:
            return False
        steps[step] = item
        for old in sorted(steps)[: -self.per_source]:
            del steps[old]
        return step in steps

    def newest(self) -> dict[bytes, int]:
        """Each sender's newest held step."""
        return {src: max(steps) for src, steps in self._held.items() if steps}

    def take(self, low: int, high: int) -> list[tuple[int, bytes, T]]:
        """Remove and return every item with ``low <= step <= high`` as (step, sender, item), by
        step; items of steps below ``low`` are dropped (they can no longer be used)."""
        out: list[tuple[int, bytes, T]] = []
        for src in list(self._held):
            steps = self._held[src]
            for step in [s for s in steps if s <= high]:
                item = steps.pop(step)
                if step >= low:
                    out.append((step, src, item))
            if not steps:
                del self._held[src]
        out.sort(key=lambda e: (e[0], e[1]))
        return out
