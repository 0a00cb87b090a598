"""The embedded SQLite store: one file, WAL journal, every call on one dedicated thread.

Durability: ``synchronous=FULL`` (default) fsyncs the WAL at every commit, so an acknowledged
write survives a power cut; ``NORMAL`` survives a killed process but not a power cut, and is
cheaper. The group committer makes one commit carry many requests, which pays for the fsync.

Rows go in as multi-row upserts (up to 32,766 bound values per statement), not ``executemany``:
the sqlite3 module releases the GIL around every statement step, and each time it wants the GIL
back it may wait a whole switch interval for the busy event-loop thread; one step per table
instead of one per row keeps a commit from stretching to tens of milliseconds under load.

Checkpoints (copying the WAL back into the database file, and fsyncing it) run every 0.2 s on
a connection and thread of their own (``PASSIVE``: they never block the writer), not inside
whichever commit crossed SQLite's 1000-page threshold; the writer keeps a 10,000-page
threshold as a backstop should the checkpointer fall behind. Small, frequent checkpoints keep
each one's disk flush short: a commit's fsync queued behind a checkpoint's waits for it, and
at 2,000 calls/s once a second made one or two commits a second take over 20 ms.

``writer="process"`` moves the commits and the checkpointer into a child process
(:mod:`.sqlite_writer`), where they never wait for the event loop's GIL; opening, migrating and
loading stay here. `distro-coordinator serve` uses it (``--sqlite-writer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from distronet.coordinator.store.base import TABLES, Batch, Snapshot, Store, StoreError, upsert_sql
from distronet.coordinator.store.migrations import MIGRATIONS, VERSION_TABLE
from distronet.coordinator.store.sqlite_writer import EXIT_TIMEOUT_S, WriterProcess
from distronet.coordinator.trace import TRACE

__all__ = ["CHECKPOINT_EVERY_S", "Checkpointer", "SqliteStore", "commit_rows", "connect"]

T = TypeVar("T")
Work = list[tuple[str, list[Any]]]  # (table, rows) in commit order; rows are tuples or lists
log = logging.getLogger(__name__)
CHECKPOINT_EVERY_S = 0.2
# Prepared statements kept by the writer connection (sqlite3's default: 128). A multi-row upsert's
# text depends on its row count, and a loaded coordinator's commits carried 50-130 distinct
# totals per 10 s (two tables each): with 128 slots they kept evicting each other, and every
# miss re-prepares (SQLite thread CPU per commit 799 -> 464 µs with 512 slots: 3,000 commits of
# 1-120 random rows per table, synchronous=OFF). Memory grows with the statements' row counts.
STATEMENT_CACHE = 512
# Bound values per statement: SQLite's SQLITE_MAX_VARIABLE_NUMBER (999 before 3.32, 32766 since).
# Fewer, larger statements mean fewer GIL hand-backs per commit (each statement's prepare and step
# release the GIL, and taking it back can wait a switch interval for the busy event loop): a
# backlog of ~400 rows after a stall commits in four statements (BEGIN, units, nodes, COMMIT)
# instead of eight or more.
_MAX_VALUES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999


@functools.lru_cache(maxsize=1024)
def _upsert_rows_sql(table: str, rows: int) -> str:
    """``upsert_sql(table)`` with ``rows`` tuples of placeholders after VALUES."""
    one = upsert_sql(table, "?")
    head, _, tail = one.partition(" VALUES ")
    marks, _, rest = tail.partition(") ")
    return f"{head} VALUES {', '.join([marks + ')'] * rows)} {rest}"


def _padded(n: int) -> int:
    """The statement size used for ``n`` rows: the smallest of 1, 2, 3, 4, 5, 6, 7, 8, 10, 12,
    14, 16, 20, 24, 28, 32, ... (four sizes per doubling) that holds them."""
    if n <= 8:
        return n
    step = 1 << (n.bit_length() - 3)  # a quarter of the power of two at or below n
    return -(-n // step) * step


def _upserts(table: str, rows: list[Any]) -> Iterator[tuple[str, list[object]]]:
    """(SQL, flat parameters) statements that upsert ``rows`` (a batch holds one row per key).

    A statement's row count is padded up to a few fixed sizes (at most a quarter more rows) by
    repeating the last row, which upserts the same values twice (a no-op): statement texts then
    repeat and stay prepared, where a backlog of an odd size otherwise compiled a new statement of
    hundreds of placeholders in the middle of the commit it delayed.
    """
    per = max(1, _MAX_VALUES // len(TABLES[table][0]))
    for i in range(0, len(rows), per):
        chunk = rows[i : i + per]
        size = min(per, _padded(len(chunk)))
        params = [v for row in chunk for v in row]
        if size > len(chunk):
            params.extend(chunk[-1] * (size - len(chunk)))
        yield _upsert_rows_sql(table, size), params


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception (the connection is in
    autocommit mode, so transactions are explicit)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class Checkpointer:
    """``PRAGMA wal_checkpoint(PASSIVE)`` every ``interval_s`` from its own connection and thread."""

    def __init__(self, path: str, synchronous: str, interval_s: float) -> None:
        self.path, self.synchronous, self.interval_s = path, synchronous, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sqlite-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _loop(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as e:  # the writer's backstop threshold still bounds the WAL
            log.warning("SQLite checkpointer not started: %s", e)
            return
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    t0 = time.perf_counter()
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    if TRACE.on:
                        TRACE.checkpoint(t0, time.perf_counter() - t0)
                except sqlite3.Error as e:
                    log.warning("SQLite checkpoint failed (retried in %.1f s): %s", self.interval_s, e)
        finally:
            conn.close()


def connect(path: str, synchronous: str) -> sqlite3.Connection:
    """The writer's connection: WAL, ``synchronous``, the schema-version table present, the
    checkpoint backstop set (see the module docstring). Raises StoreError."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, cached_statements=STATEMENT_CACHE
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("PRAGMA wal_autocheckpoint=10000")  # backstop; Checkpointer does the work
        conn.execute(VERSION_TABLE)
    except (sqlite3.Error, OSError) as e:
        raise StoreError(f"cannot open SQLite database {path!r}: {e}") from e
    return conn


def commit_rows(conn: sqlite3.Connection, work: Work) -> tuple[float, float, float, float]:
    """Upsert ``work`` ((table, rows) in commit order) in one transaction. Returns (start,
    statements done, COMMIT done) as ``perf_counter`` times and the thread CPU seconds spent.
    Raises StoreError (the transaction is rolled back)."""
    t0 = t1 = time.perf_counter()
    c0 = time.thread_time()
    try:
        with _transaction(conn):
            for table, rows in work:
                for sql, params in _upserts(table, rows):
                    conn.execute(sql, params)
            t1 = time.perf_counter()
    except sqlite3.Error as e:
        raise StoreError(f"SQLite commit failed: {e}") from e
    return t0, t1, time.perf_counter(), time.thread_time() - c0


class SqliteStore(Store):
    """SQLite in WAL mode. ``synchronous`` is ``"FULL"`` or ``"NORMAL"``; ``writer`` is
    ``"thread"`` (commits on a thread of this process) or ``"process"`` (commits and checkpoints
    in a child process, :mod:`.sqlite_writer`: they then never wait for this process's GIL;
    `distro-coordinator serve` uses it). Opening, migrating and loading run here either way."""

    url_scheme = "sqlite"

    def __init__(self, path: str, *, synchronous: str = "FULL", writer: str = "thread") -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise StoreError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        if writer not in ("thread", "process"):
            raise StoreError(f"the SQLite writer must be 'thread' or 'process', not {writer!r}")
        self.path = path
        self.synchronous = synchronous.upper()
        self.writer = writer
        self._conn: sqlite3.Connection | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        self._checkpointer: Checkpointer | None = None
        self._proc: WriterProcess | None = None
        # The last commit's thread start, statements done, COMMIT done (perf_counter), thread CPU s.
        self.last_timing = (0.0, 0.0, 0.0, 0.0)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def open(self) -> None:
        await self._run(self._open)
        if self.writer == "process":
            proc = WriterProcess(self.path, self.synchronous)
            proc.spawn()
            await self._run(proc.wait_ready)
            self._proc = proc
            return
        self._checkpointer = Checkpointer(self.path, self.synchronous, CHECKPOINT_EVERY_S)
        self._checkpointer.start()

    def _open(self) -> None:
        conn = connect(self.path, self.synchronous)
        try:
            current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()[0]
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                with _transaction(conn):
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
        work = batch.ordered()
        if not work:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if not fut.done():
                fut.set_result(None) if err is None else fut.set_exception(err)

        self._submit(work, done)
        await fut

    def commit_cb(self, batch: Batch, done: Callable[[BaseException | None], None]) -> None:
        """Commit ``batch``, then ``done(None)`` (or ``done(error)``) in the calling event loop:
        from the writer process's answer (a loop reader), or through one
        ``call_soon_threadsafe`` from the store's thread; no executor future, no task. Call
        from the loop; commits and the other calls run in submission order."""
        work = batch.ordered()
        if work:
            self._submit(work, done)
        else:
            asyncio.get_running_loop().call_soon(done, None)

    def _submit(self, work: Work, done: Callable[[BaseException | None], None]) -> None:
        """Hand ``work`` to the writer (process or thread); ``done`` runs in this loop after."""
        if self._proc is not None:
            self._proc.submit(work, done, self._timed)
            return
        loop = asyncio.get_running_loop()

        def job() -> None:
            err: BaseException | None = None
            try:
                self._commit(work)
            except BaseException as e:
                err = e
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
                loop.call_soon_threadsafe(done, err)

        self._pool.submit(job)

    def _timed(self, timing: tuple[float, float, float, float]) -> None:
        self.last_timing = timing

    def _commit(self, work: Work) -> None:
        """One transaction on the store's thread (the thread writer)."""
        self.last_timing = commit_rows(self._c(), work)

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
        if self._checkpointer is not None:
            checkpointer, self._checkpointer = self._checkpointer, None
            await asyncio.get_running_loop().run_in_executor(None, checkpointer.stop)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._run(conn.close)
        self._pool.shutdown(wait=True)
