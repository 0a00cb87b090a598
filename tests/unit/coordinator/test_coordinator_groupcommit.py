"""The group committer: waiters answered in order once their rows are on disk, one commit in
flight at a time, the next batch handed over in the callback that ends the previous one, and a
store failure failing every waiter and every later write."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from distronet.coordinator.groupcommit import GroupCommitter
from distronet.coordinator.store import Batch, StoreError, open_store
from distronet.coordinator.store.sqlite import SqliteStore
from distronet.protocol.coordinator_api import ApiError


def _join_token(i: int) -> tuple[object, ...]:
    return ("r1", f"hash{i}", 1.0, 9e9)


def _on_disk(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM join_tokens").fetchone()[0])


async def test_waiters_answered_in_order_after_their_rows_are_durable(tmp_path: Path) -> None:
    db = tmp_path / "gc.db"
    store = open_store(f"sqlite:///{db}")
    await store.open()
    committer = GroupCommitter(store)
    committer.start()
    seen: list[tuple[int, int]] = []  # (waiter, rows on disk when it was answered)
    done = asyncio.Event()

    def waiter(i: int) -> Callable[[BaseException | None], None]:
        def cb(err: BaseException | None) -> None:
            assert err is None
            seen.append((i, _on_disk(db)))
            if len(seen) == 30:
                done.set()

        return cb

    assert committer.when_durable(waiter(-1)) is False  # nothing staged, nothing in flight
    for i in range(30):
        committer.put("join_tokens", _join_token(i))
        assert committer.when_durable(waiter(i)) is True
        if i % 7 == 0:
            await asyncio.sleep(0)  # let some batches go while others fill
    await asyncio.wait_for(done.wait(), 10)
    assert [i for i, _ in seen] == list(range(30))
    assert all(rows >= i + 1 for i, rows in seen)  # each waiter's own row (and all before) on disk
    assert 1 <= committer.commits <= 30 and committer.taken == committer.commits
    await committer.close()
    await store.close()
    assert _on_disk(db) == 30


class _BrokenStore(SqliteStore):
    """A real SQLite store whose second commit fails (a full disk, say)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.n = 0

    def commit_cb(self, batch: Batch, done: Callable[[BaseException | None], None]) -> None:
        self.n += 1
        if self.n == 2:
            raise StoreError("disk full")
        super().commit_cb(batch, done)


async def test_a_failed_commit_fails_its_waiters_and_every_later_write(tmp_path: Path) -> None:
    store = _BrokenStore(str(tmp_path / "broken.db"))
    await store.open()
    fatal: list[BaseException] = []
    committer = GroupCommitter(store, on_fatal=fatal.append)
    committer.start()
    committer.put("join_tokens", _join_token(0))
    await committer.durable()  # the first commit works
    errors: list[BaseException | None] = []
    committer.put("join_tokens", _join_token(1))
    assert committer.when_durable(errors.append)
    with pytest.raises(ApiError):
        await committer.durable()
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert fatal and isinstance(committer.failed, StoreError)
    with pytest.raises(ApiError):
        committer.put("join_tokens", _join_token(2))
    with pytest.raises(ApiError):
        committer.when_durable(errors.append)
    await committer.close()
    await store.close()


async def test_rows_staged_before_start_commit_on_start(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'early.db'}")
    await store.open()
    committer = GroupCommitter(store)
    committer.put("join_tokens", _join_token(0))  # before start: staged only
    committer.start()
    await committer.flush()
    assert committer.commits == 1
    snap = await store.load()
    assert len(snap.tables["join_tokens"]) == 1
    await committer.close()
    await store.close()


class _AwaitedStore(SqliteStore):
    """SQLite driven through the async ``commit`` only, as a store without ``commit_cb``
    (PostgreSQL) is."""

    commit_cb = None  # type: ignore[assignment]


async def test_a_store_without_commit_cb_is_awaited_in_order(tmp_path: Path) -> None:
    db = tmp_path / "awaited.db"
    store = _AwaitedStore(str(db))
    await store.open()
    committer = GroupCommitter(store)
    committer.start()
    order: list[int] = []
    for i in range(12):
        committer.put("join_tokens", _join_token(i))
        assert committer.when_durable(lambda err, i=i: order.append(i) if err is None else None)
        if i % 5 == 0:
            await asyncio.sleep(0)
    await committer.flush()
    assert order == list(range(12)) and _on_disk(db) == 12
    await committer.close()
    await store.close()


class _TimedStore(SqliteStore):
    """A real SQLite store that records when each commit was handed to its writer."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.begins: list[float] = []

    def commit_cb(self, batch: Batch, done: Callable[[BaseException | None], None]) -> None:
        self.begins.append(time.perf_counter())
        super().commit_cb(batch, done)


async def test_min_interval_paces_commits_but_a_lone_write_commits_at_once(tmp_path: Path) -> None:
    store = _TimedStore(str(tmp_path / "paced.db"))
    await store.open()
    committer = GroupCommitter(store, min_interval_s=0.1)
    committer.start()
    t0 = time.perf_counter()
    committer.put("join_tokens", _join_token(0))
    await committer.durable()
    assert time.perf_counter() - t0 < 0.09  # after a quiet spell: no pacing delay
    answered: list[int] = []
    for i in range(1, 4):  # three writes while the pace holds the next batch back
        committer.put("join_tokens", _join_token(i))
        assert committer.when_durable(lambda err, i=i: answered.append(i)) is True
        await asyncio.sleep(0.01)
    await committer.durable()
    assert answered == [1, 2, 3]
    assert committer.commits == 2  # the three writes shared one commit
    assert store.begins[1] - store.begins[0] >= 0.095
    await committer.close()
    await store.close()
    assert _on_disk(tmp_path / "paced.db") == 4
