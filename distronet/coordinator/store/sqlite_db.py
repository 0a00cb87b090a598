"""SQLite's side of the store, shared by the parent (open, migrate, load) and the writer child
(every commit, the checkpointer): the connection's pragmas, the padded multi-row upserts, one
transaction per batch.

Rows go in as multi-row upserts (up to 32,766 bound values per statement), not ``executemany``:
one statement per table instead of one per row keeps a large commit (a backlog after a stall)
to a few statements.

Checkpoints (copying the WAL back into the database file, and fsyncing it) run every 0.2 s on
a connection and thread of their own (``PASSIVE``: they never block the writer), not inside
whichever commit crossed SQLite's 1000-page threshold; the writer keeps a 10,000-page
threshold as a backstop should the checkpointer fall behind. Small, frequent checkpoints keep
each one's disk flush short: a commit's fsync queued behind a checkpoint's waits for it, and
at 2,000 calls/s once a second made one or two commits a second take over 20 ms.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distronet.coordinator.store.base import TABLES, StoreError, upsert_sql
from distronet.coordinator.store.migrations import VERSION_TABLE
from distronet.coordinator.trace import TRACE

__all__ = [
    "CHECKPOINT_EVERY_S",
    "Checkpointer",
    "Work",
    "commit_rows",
    "connect",
    "transaction",
    "upserts",
]

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
# Fewer, larger statements mean less per-statement work per commit: a
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


def upserts(table: str, rows: list[Any]) -> Iterator[tuple[str, list[object]]]:
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
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
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
        with transaction(conn):
            for table, rows in work:
                for sql, params in upserts(table, rows):
                    conn.execute(sql, params)
            t1 = time.perf_counter()
    except sqlite3.Error as e:
        raise StoreError(f"SQLite commit failed: {e}") from e
    return t0, t1, time.perf_counter(), time.thread_time() - c0
