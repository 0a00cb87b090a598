"""Group commit: every write staged during one event-loop tick goes into one transaction.

Handlers change the in-memory state, stage the changed rows with :meth:`GroupCommitter.put`
and then ``await committer.durable()`` (or register a plain callback with
:meth:`GroupCommitter.when_durable`) before they answer: an acknowledged write is always on
disk. While one transaction commits, the next batch fills; it is handed to the store one poll
phase after the previous commit is done, so one fsync carries every request that arrived
meanwhile.

No task and no future sit between the store and the answers: a store with ``commit_cb`` (the
SQLite one) calls :meth:`_done` from the event-loop reader of its writer child's answer, which
answers every waiter of the batch (their callbacks run right there, in order) and schedules
the next commit for right after the next poll phase (so what arrived meanwhile joins it). A
writer task awaiting a future, with waiters resumed through future done-callbacks, takes
three loop iterations from the fsync's end to the answers, and every iteration first runs the
poll phase: a burst of new requests arriving on hundreds of connections (tens of
milliseconds of handling after any stall) would be served before the calls whose commit had
already finished. Stores without ``commit_cb`` (PostgreSQL) are awaited by a task.

Commits are strictly ordered, so an answer that depends on an earlier change (for example a
lease issued after another one expired) is never acknowledged before that change is durable.
A failed commit is fatal: memory and disk disagree, so the coordinator stops (``on_fatal``)
and a restart rebuilds memory from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from distronet.coordinator.store import Batch, Store
from distronet.coordinator.store.base import Row
from distronet.coordinator.trace import TRACE
from distronet.protocol.coordinator_api import ApiError, ApiErrorCode

__all__ = ["GroupCommitter"]

log = logging.getLogger(__name__)


class GroupCommitter:
    """Batches staged rows into ordered transactions on ``store``.

    ``min_interval_s``: a batch is handed to the store no sooner than this after the previous
    one was (0: as soon as the previous commit is done). Under steady load on a fast disk,
    commits otherwise follow each other every few hundred µs carrying one or two calls each,
    and every commit costs ~200 µs of SQLite-thread CPU (statements, WAL write, fsync) plus
    the hand-offs between threads, whatever its size: pacing them makes each carry several
    calls for at most ``min_interval_s`` more latency. A lone write after a quiet spell
    commits at once. Durability is unchanged: every waiter is still answered only after the
    commit holding its rows.
    """

    def __init__(
        self,
        store: Store,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        on_commit: Callable[[int, float], None] | None = None,
        min_interval_s: float = 0.0,
    ) -> None:
        self.store = store
        self.min_interval_s = min_interval_s
        self._on_fatal = on_fatal
        self._on_commit = on_commit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch = Batch()
        self._staged = False  # anything put into _batch (cheaper than len(Batch) per request)
        self._fut: asyncio.Future[None] | None = None  # awaited by durable() for the staged batch
        self._waiters: list[Callable[[BaseException | None], None]] = []  # the staged batch's
        self._callbacks: list[Callable[[], None]] = []
        self._busy = False  # a commit is in flight
        self._kicked = False  # a _begin is scheduled
        self._inflight: asyncio.Future[None] | None = None  # created on demand for the in-flight batch
        self._inflight_waiters: list[Callable[[BaseException | None], None]] = []
        self._inflight_job: tuple[Batch, list[Callable[[], None]], float] | None = None
        self._commit_task: asyncio.Task[None] | None = None  # stores without commit_cb
        self.failed: BaseException | None = None
        self.commits = 0
        self.taken = 0  # batches handed to the store (the in-flight one is number ``taken``)

    def start(self) -> None:
        """Start committing (call inside the running loop); rows staged before now go first."""
        self._loop = asyncio.get_running_loop()
        self._kick()

    def put(self, table: str, row: Row) -> None:
        """Stage one full row; it commits with the current batch. Raises ApiError after a failure."""
        if self.failed is not None:
            raise ApiError(ApiErrorCode.UNAVAILABLE, "storage failed; the coordinator is restarting")
        self._batch.put(table, row)
        self._staged = True
        self._kick()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the current batch is durable (for events that must not precede it)."""
        self._callbacks.append(callback)
        self._kick()

    def _kick(self) -> None:
        """Begin a commit on the next loop iteration (so a whole burst of handled requests shares
        it), unless one is in flight: :meth:`_done` then begins the next at once."""
        if not self._busy and not self._kicked and self._loop is not None and self.failed is None:
            self._kicked = True
            self._loop.call_soon(self._begin)

    # ---------------------------------------------------------------- waiting

    def when_durable(self, callback: Callable[[BaseException | None], None]) -> bool:
        """Call ``callback(None)`` once everything staged so far is committed (``callback(error)``
        if the store fails), from the event loop, in staging order; returns False (and never
        calls it) when nothing needs waiting for. Raises ApiError(UNAVAILABLE) after a failure."""
        if self.failed is not None:
            raise ApiError(ApiErrorCode.UNAVAILABLE, "storage failed; the coordinator is restarting")
        if self._staged or self._callbacks:
            self._waiters.append(callback)
            return True
        if self._busy:  # nothing of ours staged, but the in-flight commit may hold what we read
            self._inflight_waiters.append(callback)
            return True
        return False

    def batch_of_waiter(self) -> int:
        """The number of the batch a waiter registered now waits for (0: none). For the trace."""
        if self._staged or self._callbacks:
            return self.taken + 1
        return self.taken if self._busy else 0

    def durable_future(self) -> asyncio.Future[None] | None:
        """A future done once everything staged so far is committed (its exception: the store's
        failure), or None when nothing needs waiting for. Raises ApiError(UNAVAILABLE) after a
        failure. Never cancel it."""
        if self.failed is not None:
            raise ApiError(ApiErrorCode.UNAVAILABLE, "storage failed; the coordinator is restarting")
        if self._staged or self._callbacks:
            if self._fut is None:
                self._fut = asyncio.get_running_loop().create_future()
            return self._fut
        if self._busy:
            if self._inflight is None:
                self._inflight = asyncio.get_running_loop().create_future()
            return self._inflight
        return None

    async def durable(self) -> None:
        """Wait until everything staged so far is committed. Raises ApiError(UNAVAILABLE) on failure."""
        fut = self.durable_future()
        if fut is None:
            return
        try:
            await asyncio.shield(fut)
        except ApiError:
            raise
        except Exception as e:
            raise ApiError(ApiErrorCode.UNAVAILABLE, f"storage failed: {e}") from e

    # ---------------------------------------------------------------- committing

    def _begin(self) -> None:
        """Hand the staged batch to the store (in the loop; nothing if one is in flight)."""
        self._kicked = False
        if self._busy or self.failed is not None:
            return
        if not (self._staged or self._callbacks or self._waiters or self._fut is not None):
            return
        batch, self._batch, self._staged = self._batch, Batch(), False
        self._inflight, self._fut = self._fut, None
        self._inflight_waiters, self._waiters = self._waiters, []
        callbacks, self._callbacks = self._callbacks, []
        self._busy = True
        self.taken += 1
        t0 = time.perf_counter()
        self._inflight_job = (batch, callbacks, t0)
        submit: Any = getattr(self.store, "commit_cb", None)
        if submit is not None:
            try:
                submit(batch, self._done)
            except BaseException as e:
                self._done(e)
        else:
            self._commit_task = asyncio.get_running_loop().create_task(self._commit_async(batch))

    async def _commit_async(self, batch: Batch) -> None:
        try:
            await self.store.commit(batch)
        except BaseException as e:
            self._done(e)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self._done(None)

    def _done(self, err: BaseException | None) -> None:
        """The in-flight commit ended (in the loop): answer its waiters, then begin the next."""
        job, self._inflight_job = self._inflight_job, None
        if job is None:
            return
        batch, callbacks, t0 = job
        fut, self._inflight = self._inflight, None
        waiters, self._inflight_waiters = self._inflight_waiters, []
        self._busy = False
        self._commit_task = None
        if err is not None:
            self._fail(err, fut, waiters)
            return
        self.commits += 1
        t1 = time.perf_counter()
        if TRACE.on:
            timing = getattr(self.store, "last_timing", (0.0, 0.0, 0.0, 0.0))
            TRACE.commit(self.taken, t0, *timing, t1, len(batch))
        if self._on_commit is not None:
            self._on_commit(len(batch), t1 - t0)
        if fut is not None and not fut.done():
            fut.set_result(None)
        for w in waiters:
            try:
                w(None)
            except Exception:
                log.exception("durability waiter failed")
        for cb in callbacks:
            try:
                cb()
            except Exception:
                log.exception("after-commit callback failed")
        # What arrived meanwhile goes next, after one more poll phase: the requests whose bytes
        # came in while the answers above were written join it (beginning right here, without
        # them, made many one-row commits that held a full fsync slot ahead of a big batch).
        # With ``min_interval_s``, no sooner than that after this batch began (see __init__).
        wait = self.min_interval_s - (t1 - t0)
        if wait > 0 and self.failed is None and self._loop is not None and not self._kicked:
            self._kicked = True
            self._loop.call_later(wait, self._begin)
        else:
            self._kick()

    def _fail(
        self,
        err: BaseException,
        fut: asyncio.Future[None] | None,
        waiters: list[Callable[[BaseException | None], None]],
    ) -> None:
        """A failed commit is fatal: fail every waiter, staged or in flight, and stop."""
        self.failed = err
        log.critical("store commit failed; stopping: %s", err)
        for f in (fut, self._fut):
            if f is not None and not f.done():
                f.set_exception(err)
                f.exception()  # mark retrieved: waiters may be gone
        self._fut = None
        for w in [*waiters, *self._waiters]:
            try:
                w(err)
            except Exception:
                log.exception("durability waiter failed")
        self._waiters = []
        if self._on_fatal is not None:
            self._on_fatal(err)

    async def flush(self) -> None:
        """Commit whatever is staged now and wait for it. Raises ApiError(UNAVAILABLE) on failure."""
        await self.durable()

    async def close(self) -> None:
        """Flush, then stop committing (a commit still in flight is awaited)."""
        if self.failed is None and self._loop is not None:
            await self.flush()
        task, self._commit_task = self._commit_task, None
        if task is not None and not task.done():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loop = None
