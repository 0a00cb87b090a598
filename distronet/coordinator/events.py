"""Run events for the dashboard: an in-memory ring per run, fanned out to SSE subscribers.

Event types: ``peer_joined``, ``peer_left``, ``peer_evicted``, ``step_progress``, ``loss``,
``shard_completed``, ``shard_unverified``, ``lease_expired``, ``run_created``. Each event has a
per-coordinator sequence number (the SSE ``id:``), so a dashboard that reconnects with ``Last-Event-ID`` gets
what it missed while the ring still holds it. A subscriber too slow to drain its queue is cut
off (its stream ends; it reconnects and resumes) instead of holding memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "EventBus"]


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    run_id: str
    type: str
    time: float
    data: dict[str, Any]

    def sse(self) -> bytes:
        """The event as one SSE frame."""
        payload = json.dumps({"run_id": self.run_id, "time": self.time, **self.data}, separators=(",", ":"))
        return f"id: {self.seq}\nevent: {self.type}\ndata: {payload}\n\n".encode()


class EventBus:
    """Per-run rings of the last ``ring`` events and the live subscriber queues."""

    def __init__(self, ring: int = 2048, queue: int = 4096) -> None:
        self._ring_size = ring
        self._queue_size = queue
        self._rings: dict[str, deque[Event]] = {}
        self._subs: dict[str, set[asyncio.Queue[Event | None]]] = {}
        self.seq = 0

    def publish(self, run_id: str, type_: str, **data: Any) -> Event:
        self.seq += 1
        ev = Event(self.seq, run_id, type_, time.time(), data)
        ring = self._rings.get(run_id)
        if ring is None:
            ring = self._rings[run_id] = deque(maxlen=self._ring_size)
        ring.append(ev)
        for q in list(self._subs.get(run_id, ())):
            try:
                q.put_nowait(ev)
            except asyncio.QueueFull:
                self._subs[run_id].discard(q)
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)  # ends the slow stream; the dashboard resumes by Last-Event-ID
        return ev

    def recent(self, run_id: str, after: int = 0) -> list[Event]:
        """Ring events of ``run_id`` with ``seq > after``."""
        return [e for e in self._rings.get(run_id, ()) if e.seq > after]

    def subscribe(self, run_id: str) -> asyncio.Queue[Event | None]:
        q: asyncio.Queue[Event | None] = asyncio.Queue(self._queue_size)
        self._subs.setdefault(run_id, set()).add(q)
        return q

    def unsubscribe(self, run_id: str, q: asyncio.Queue[Event | None]) -> None:
        self._subs.get(run_id, set()).discard(q)

    def close_all(self) -> None:
        """End every subscriber's stream (shutdown)."""
        for subs in self._subs.values():
            for q in subs:
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(None)
            subs.clear()

    @property
    def subscribers(self) -> int:
        return sum(len(s) for s in self._subs.values())
