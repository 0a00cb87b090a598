"""Run a pure function over ``0..n-1`` on the caller's thread plus helpers, never waiting long on one.

:func:`map_in_order` is how a round's frames are opened on a few threads (``open_frames``).
Items are claimed one at a time from a shared counter (not striped in advance), so a helper that
gets no CPU (another thread spinning on its core, e.g. torch's OpenMP workers for a few ms after
every parallel region) holds back at most the one item it has claimed. When nothing is left to
claim, the caller waits for an item a helper still holds only as long as the helper would
need at half the caller's pace (twice the caller's own mean time per item, counted from when the
helper claimed it: a helper sharing its core with one spinning thread still delivers), then
computes the item itself: ``fn`` is pure (its result depends on its argument alone), so
whichever copy finishes first is kept and the other is dropped. Worst case (helpers never run)
the cost is the serial loop's plus about two items per helper; with a free core it is about
halved.

Results are returned in index order and are the same for any number of helpers. An exception
raised by ``fn`` on the caller's thread propagates; one raised on a helper is dropped and the
caller computes that item itself (and meets the exception there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["map_in_order"]

T = TypeVar("T")
_PATIENCE = 2.0  # how many of the caller's own item times it gives a helper's item (module doc)

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()


def _pool(helpers: int) -> ThreadPoolExecutor:
    """A process-wide pool of at least ``helpers`` threads (grown, never shrunk)."""
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or helpers > _POOL_SIZE:
            old = _POOL
            _POOL = ThreadPoolExecutor(max_workers=helpers, thread_name_prefix="open-frames")
            _POOL_SIZE = helpers
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


class _Job(Generic[T]):
    """One call's shared state: the next unclaimed item, results, and whether the caller is done."""

    def __init__(self, fn: Callable[[int], T], n: int) -> None:
        self.fn, self.n = fn, n
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.next = 0
        self.done: list[bool] = [False] * n
        self.out: list[T | None] = [None] * n
        self.claimed_at: list[float] = [0.0] * n
        self.closed = False

    def claim(self) -> int:
        """The next unclaimed item, or -1 when none is left (or the caller has finished)."""
        with self.lock:
            if self.closed or self.next >= self.n:
                return -1
            i = self.next
            self.next += 1
            self.claimed_at[i] = time.perf_counter()
            return i

    def put(self, i: int, value: T) -> None:
        with self.lock:
            if not self.done[i]:
                self.out[i], self.done[i] = value, True
                self.changed.notify_all()

    def helper(self) -> None:
        while (i := self.claim()) >= 0:
            try:
                value = self.fn(i)
            except Exception:  # the caller recomputes item i and meets the error itself
                return
            self.put(i, value)

    def finish(self) -> list[T]:
        """The caller's part: claim and compute until none is left, then compute what helpers
        still hold; returns every result in order."""
        t0, mine = time.perf_counter(), 0
        while (i := self.claim()) >= 0:
            self.put(i, self.fn(i))
            mine += 1
        patience = _PATIENCE * (time.perf_counter() - t0) / mine if mine else 0.0
        with self.lock:
            self.closed = True
            missing = [i for i in range(self.n) if not self.done[i]]
        for i in missing:
            with self.lock:
                until = self.claimed_at[i] + patience
                while not self.done[i] and (left := until - time.perf_counter()) > 0:
                    self.changed.wait(timeout=left)
                if self.done[i]:
                    continue
            self.put(i, self.fn(i))
        return [x for x in self.out]  # type: ignore[misc]  # every slot is filled


def map_in_order(fn: Callable[[int], T], n: int, workers: int) -> list[T]:
    """``[fn(i) for i in range(n)]`` on the caller's thread and up to ``workers - 1`` helpers.

    ``fn`` must be pure and thread-safe (module doc). ``workers <= 1`` or ``n <= 1`` runs inline.
    The caller never blocks on a helper: items a helper has not finished when the caller runs
    out of work are computed again by the caller. Cost: one lock per item plus, per call, one
    task handed to each helper.
    """
    w = max(1, min(n, workers))
    if w == 1:
        return [fn(i) for i in range(n)]
    job = _Job(fn, n)
    pool = _pool(w - 1)
    for _ in range(w - 1):
        pool.submit(job.helper)
    return job.finish()
