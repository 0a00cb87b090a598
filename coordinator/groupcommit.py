"""Group commit: every write staged during one event-loop tick goes into one transaction.

Handlers change the in-memory state, stage the changed rows with :meth:`GroupCommitter.put`
and then ``await committer.durable()`` before they answer: an acknowledged write is always on
disk. While one transaction commits, the next batch fills; the writer task takes it as soon as
the previous commit returns, so one fsync carries every request that arrived meanwhile.

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

from distronet.coordinator.store import Batch, Store
from distronet.coordinator.store.base import Row
from distronet.coordinator.trace import TRACE
from distronet.protocol.coordinator_api import ApiError, ApiErrorCode

__all__ = ["GroupCommitter"]

log = logging.getLogger(__name__)


class GroupCommitter:
    """Batches staged rows into ordered transactions on ``store``."""

    def __init__(
        self,
        store: Store,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        on_commit: Callable[[int, float], None] | None = None,
    ) -> None:
        self.store = store
        self._on_fatal = on_fatal
        self._on_commit = on_commit
        self._batch = Batch()
        self._staged = False  # anything put into _batch (cheaper than len(Batch) per request)
        self._fut: asyncio.Future[None] | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._inflight: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failed: BaseException | None = None
        self.commits = 0
        self.taken = 0  # batches the writer has taken (the in-flight one is number ``taken``)

    def start(self) -> None:
        """Start the writer task (call inside the running loop)."""
        self._task = asyncio.create_task(self._writer(), name="group-commit")

    def put(self, table: str, row: Row) -> None:
        """Stage one full row; it commits with the current batch. Raises ApiError after a failure."""
        if self.failed is not None:
            raise ApiError(ApiErrorCode.UNAVAILABLE, "storage failed; the coordinator is restarting")
        self._batch.put(table, row)
        self._staged = True
        self._wake.set()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the current batch is durable (for events that must not precede it)."""
        self._callbacks.append(callback)
        self._wake.set()

    def durable_future(self) -> asyncio.Future[None] | None:
        """A future done once everything staged so far is committed (its exception: the store's
        failure), or None when nothing needs waiting for. Raises ApiError(UNAVAILABLE) after a
        failure. For callers that wait with a done-callback instead of a task; never cancel it."""
        if self.failed is not None:
            raise ApiError(ApiErrorCode.UNAVAILABLE, "storage failed; the coordinator is restarting")
        if not self._staged and not self._callbacks:
            # Nothing of ours is staged, but an earlier in-flight commit may hold what we read.
            return self._inflight
        if self._fut is None:
            self._fut = asyncio.get_running_loop().create_future()
        return self._fut

    def batch_of(self, fut: asyncio.Future[None] | None) -> int:
        """The number of the batch whose commit ``fut`` (from :meth:`durable_future`) waits for
        (0: none). For the trace."""
        if fut is None:
            return 0
        return self.taken if fut is self._inflight else self.taken + 1

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

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._batch, self._staged = self._batch, Batch(), False
            fut, self._fut = self._fut, None
            callbacks, self._callbacks = self._callbacks, []
            if fut is None:
                fut = asyncio.get_running_loop().create_future()
            self._inflight = fut
            self.taken += 1
            t0 = time.perf_counter()
            try:
                await self.store.commit(batch)
            except BaseException as e:
                self.failed = e
                if not fut.done():
                    fut.set_exception(e)
                    fut.exception()  # mark retrieved: waiters may be gone
                log.critical("store commit failed; stopping: %s", e)
                if self._on_fatal is not None:
                    self._on_fatal(e)
                if isinstance(e, asyncio.CancelledError):
                    raise
                return
            finally:
                self._inflight = None
            self.commits += 1
            t1 = time.perf_counter()
            if TRACE.on:
                TRACE.commit(
                    self.taken, t0, *getattr(self.store, "last_timing", (0.0, 0.0, 0.0, 0.0)), t1, len(batch)
                )
            if self._on_commit is not None:
                self._on_commit(len(batch), t1 - t0)
            if not fut.done():
                fut.set_result(None)
            for cb in callbacks:
                try:
                    cb()
                except Exception:
                    log.exception("after-commit callback failed")

    async def flush(self) -> None:
        """Commit whatever is staged now and wait for it."""
        if self._staged or self._callbacks:
            await self.durable()
        elif self._inflight is not None:
            await asyncio.shield(self._inflight)

    async def close(self) -> None:
        """Flush, then stop the writer task."""
        if self.failed is None and self._task is not None and not self._task.done():
            await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
