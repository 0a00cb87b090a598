"""The embedded SQLite store: one file, WAL journal, every commit in a writer child process.

Durability: ``synchronous=FULL`` (default) fsyncs the WAL at every commit, so an acknowledged
write survives a power cut; ``NORMAL`` survives a killed process but not a power cut, and is
cheaper. The group committer makes one commit carry many requests, which pays for the fsync.

One writer path: every commit, and the checkpointer, run in a child process
(:mod:`.sqlite_writer`), where they never wait for the event loop's GIL (on a thread of this
process, each statement gave the GIL back and waited to take it from the busy loop: commits
stretched to 20-57 ms under load). Opening and migrating the schema (before the child starts),
loading, and closing run here on one executor thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from distronet.coordinator.store.base import TABLES, Batch, Snapshot, Store, StoreError
from distronet.coordinator.store.migrations import MIGRATIONS
from distronet.coordinator.store.sqlite_db import connect, transaction
from distronet.coordinator.store.sqlite_writer import EXIT_TIMEOUT_S, WriterProcess

__all__ = ["SqliteStore"]

T = TypeVar("T")


class SqliteStore(Store):
    """SQLite in WAL mode, ``synchronous`` ``"FULL"`` or ``"NORMAL"``; commits in the writer
    child (see the module)."""

    url_scheme = "sqlite"

    def __init__(self, path: str, *, synchronous: str = "FULL") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise StoreError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self.path = path
        self.synchronous = synchronous.upper()
        self._conn: sqlite3.Connection | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._proc: WriterProcess | None = None
        # The last commit's thread start, statements done, COMMIT done (perf_counter), thread CPU s.
        self.last_timing = (0.0, 0.0, 0.0, 0.0)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def open(self) -> None:
        await self._run(self._open)
        proc = WriterProcess(self.path, self.synchronous)
        proc.spawn()
        await self._run(proc.wait_ready)
        self._proc = proc

    def _open(self) -> None:
        conn = connect(self.path, self.synchronous)
        try:
            current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                with transaction(conn):
                    for stmt in statements:
                        conn.execute(stmt)
                    conn.execute("INSERT INTO schema_migrations VALUES (?, ?)", (version, time.time()))
        except sqlite3.Error as e:
            conn.close()
            raise StoreError(f"cannot migrate SQLite database {self.path!r}: {e}") from e
        self._conn = conn

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError("store is not open")
        return self._conn

    async def commit(self, batch: Batch) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_result(None) if err is None else fut.set_exception(err)

        self._send(batch, done)
        await fut

    def commit_cb(self, batch: Batch, done: Callable[[BaseException | None], None]) -> None:
        """Commit ``batch``, then ``done(None)`` (or ``done(error)``) in the calling event loop,
        from the writer child's answer (a loop reader; no executor future, no task). Call from
        the loop; commits run in submission order. Raises StoreError when the store is not open
        or the child is gone."""
        self._send(batch, done)

    def _send(self, batch: Batch, done: Callable[[BaseException | None], None]) -> None:
        work = batch.ordered()
        if not work:
            asyncio.get_running_loop().call_soon(done, None)
            return
        if self._proc is None:
            raise StoreError("store is not open")
        self._proc.submit(work, done, self._timed)

    def _timed(self, timing: tuple[float, float, float, float]) -> None:
        self.last_timing = timing

    async def load(self) -> Snapshot:
        return await self._run(self._load)

    def _load(self) -> Snapshot:
        conn = self._c()
        snap = Snapshot()
        for table, (cols, npk) in TABLES.items():
            order = ", ".join(cols[:npk])
            snap.tables[table] = [
                tuple(r) for r in conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {order}")
            ]
        return snap

    async def schema_version(self) -> int:
        return await self._run(
            lambda: int(self._c().execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0])
        )

    async def close(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            with contextlib.suppress(asyncio.TimeoutError):  # a hung child is killed by close()
                await asyncio.wait_for(proc.drain(), EXIT_TIMEOUT_S)
            proc.detach()
            await self._run(proc.close)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._run(conn.close)
        self._pool.shutdown(wait=True)
