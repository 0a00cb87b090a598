"""The store contract, run against SQLite and (when reachable) PostgreSQL alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from distronet.coordinator.store import Batch, Store, StoreError, open_store
from distronet.coordinator.store.migrations import LATEST


def _node(peer: str, tokens: int) -> tuple[object, ...]:
    return ("r1", peer, 1, "[]", "agent", 1.0, 2.0, 3.5, tokens, 1, 0, 0.0, 0)


def _unit(n: int, state: int, token: str | None) -> tuple[object, ...]:
    return ("r1", n, state, token, "p" if token else None, 1.0, 9.0, None, None, 1)


async def test_schema_is_migrated_to_the_latest_version(store: Store, store_url: str) -> None:
    assert await store.schema_version() == LATEST
    await store.close()
    again = open_store(store_url)  # reopening applies nothing twice
    await again.open()
    assert await again.schema_version() == LATEST
    await again.close()


async def test_commit_then_load_round_trips_every_table(store: Store) -> None:
    b = Batch()
    b.put("runs", ("r1", '{"spec": {}}', "open", 12.5))
    b.put("units", _unit(0, 1, "tok0"))
    b.put("nodes", _node("peerA", 100))
    b.put("join_tokens", ("r1", "h" * 64, 3, 99.0))
    b.put("receipts", ("r1", "peerA", 7, "peerB", "cd" * 32, 5.0))
    await store.commit(b)
    snap = await store.load()
    assert snap.tables["runs"] == [("r1", '{"spec": {}}', "open", 12.5)]
    assert snap.tables["units"] == [_unit(0, 1, "tok0")]
    assert snap.tables["nodes"] == [_node("peerA", 100)]
    assert snap.tables["join_tokens"] == [("r1", "h" * 64, 3, 99.0)]
    assert snap.tables["receipts"] == [("r1", "peerA", 7, "peerB", "cd" * 32, 5.0)]


async def test_latest_row_per_key_wins_within_and_across_batches(store: Store) -> None:
    b = Batch()
    b.put("nodes", _node("peerA", 1))
    b.put("nodes", _node("peerA", 2))
    assert len(b) == 1
    await store.commit(b)
    b = Batch()
    b.put("nodes", _node("peerA", 3))
    b.put("units", _unit(4, 2, "t"))
    await store.commit(b)
    b = Batch()
    b.put("units", _unit(4, 0, None))
    await store.commit(b)
    snap = await store.load()
    assert [r[8] for r in snap.tables["nodes"]] == [3]
    assert snap.tables["units"] == [_unit(4, 0, None)]


async def test_receipts_are_insert_once(store: Store) -> None:
    for acceptor in ("peerB", "peerC"):
        b = Batch()
        b.put("receipts", ("r1", "peerA", 7, acceptor, "cd" * 32, 5.0))
        await store.commit(b)
    snap = await store.load()
    assert [r[3] for r in snap.tables["receipts"]] == ["peerB"]


async def test_a_failed_batch_leaves_nothing_behind(store: Store) -> None:
    b = Batch()
    b.put("runs", ("r1", "{}", "open", 1.0))
    b.put("nodes", ("r1", "peerA", 1, None, "a", 1.0, 2.0, 0.0, 0, 0, 0, 0.0, 0))  # NULL multiaddrs: refused
    with pytest.raises(StoreError):
        await store.commit(b)
    snap = await store.load()
    assert snap.tables["runs"] == [] and snap.tables["nodes"] == []


def test_open_store_rejects_unknown_urls() -> None:
    with pytest.raises(StoreError, match="unknown database URL"):
        open_store("mysql://x")
    with pytest.raises(StoreError):
        open_store("sqlite://relative-with-two-slashes.db")


async def test_sqlite_file_is_wal_and_upgrades_an_old_schema(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)  # a database left at version 1 by an older coordinator
    from distronet.coordinator.store.migrations import MIGRATIONS, VERSION_TABLE

    conn.execute(VERSION_TABLE)
    for stmt in MIGRATIONS[0][1]:
        conn.execute(stmt)
    conn.execute("INSERT INTO schema_migrations VALUES (1, 0)")
    conn.commit()
    conn.close()
    s = open_store(f"sqlite:///{path}")
    await s.open()
    assert await s.schema_version() == LATEST
    await s.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert "units_by_state" in names
    conn.close()


async def test_sqlite_upserts_padded_to_few_statement_sizes_write_exactly_the_batch(tmp_path: Path) -> None:
    from distronet.coordinator.store.sqlite_db import _padded, upserts

    assert len({_padded(n) for n in range(1, 3277)}) < 60
    assert all(n <= _padded(n) <= n * 1.25 + 1 for n in range(1, 5000))
    store = open_store(f"sqlite:///{tmp_path / 'pad.db'}")
    await store.open()
    for n in (9, 17, 138, 3300):  # odd sizes: padded with a repeat of the last row
        b = Batch()
        for i in range(n):
            b.put("units", _unit(i, 1, f"t{n}"))
            b.put("receipts", ("r1", "p", i, "a", f"h{n}", 1.0))  # insert-once rows: padded too
        if n < 3276:
            [(_sql, params)] = upserts("units", b.ordered()[0][1])
            assert len(params) == _padded(n) * 10
        await store.commit(b)
    await store.close()
    with sqlite3.connect(tmp_path / "pad.db") as conn:
        units = conn.execute("SELECT unit, lease_token FROM units ORDER BY unit").fetchall()
        receipts = conn.execute("SELECT step, payload_sha256 FROM receipts ORDER BY step").fetchall()
    assert units == [(i, "t3300") for i in range(3300)]
    assert [s for s, _ in receipts] == list(range(3300))
    firsts = [receipts[i][1] for i in (5, 12, 100, 200)]  # the first batch to insert a key wins
    assert firsts == ["h9", "h17", "h138", "h3300"]
