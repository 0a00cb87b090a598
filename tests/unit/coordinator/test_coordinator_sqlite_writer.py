"""The SQLite writer in a child process: order, failure, signals and lifetime, with real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distronet.coordinator.store import Batch, StoreError, open_store
from distronet.coordinator.store.sqlite import SqliteStore
from distronet.coordinator.store.sqlite_writer import _checked


def _unit(n: int, token: str) -> tuple[object, ...]:
    return ("r1", n, 1, token, "p", 1.0, 9.0, None, None, 1)


def _batch(*units: int, token: str = "t") -> Batch:
    b = Batch()
    for n in units:
        b.put("units", _unit(n, token))
    return b


async def _open(path: Path) -> SqliteStore:
    store = open_store(f"sqlite:///{path}")
    assert isinstance(store, SqliteStore)
    await store.open()
    return store


def _child_pid(store: SqliteStore) -> int:
    assert store._proc is not None and store._proc.proc is not None
    return store._proc.proc.pid


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


async def test_batches_commit_in_submission_order_with_timing(tmp_path: Path) -> None:
    store = await _open(tmp_path / "w.db")
    seen: list[tuple[int, BaseException | None]] = []
    for i in range(20):  # back to back: the child answers them one by one, in order
        store.commit_cb(_batch(i % 3, token=f"t{i}"), lambda err, i=i: seen.append((i, err)))
    deadline = time.monotonic() + 20
    while len(seen) < 20 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert seen == [(i, None) for i in range(20)]
    start, statements, committed, _cpu = store.last_timing
    assert 0 < start <= statements <= committed
    await store.close()
    with sqlite3.connect(tmp_path / "w.db") as conn:
        rows = conn.execute("SELECT unit, lease_token FROM units ORDER BY unit").fetchall()
    assert rows == [(0, "t18"), (1, "t19"), (2, "t17")]  # the last batch per key won


async def test_close_commits_what_was_sent_and_the_child_exits(tmp_path: Path) -> None:
    store = await _open(tmp_path / "w.db")
    pid = _child_pid(store)
    done: list[BaseException | None] = []
    for i in range(5):
        store.commit_cb(_batch(i), done.append)
    await store.close()  # drains the five, then closes the pipe
    assert done == [None] * 5
    assert _gone(pid)
    with sqlite3.connect(tmp_path / "w.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM units").fetchone()[0] == 5


async def test_a_failed_statement_fails_only_its_batch(tmp_path: Path) -> None:
    store = await _open(tmp_path / "w.db")
    bad = Batch()
    bad.put("nodes", ("r1", "peerA", 1, None, "a", 1.0, 2.0, 0.0, 0, 0, 0, 0.0, 0))  # NULL multiaddrs
    with pytest.raises(StoreError, match="commit failed"):
        await store.commit(bad)
    await store.commit(_batch(1))  # the writer goes on
    snap = await store.load()
    assert [r[1] for r in snap.tables["units"]] == [1] and snap.tables["nodes"] == []
    await store.close()


async def test_a_killed_writer_fails_the_waiting_batch_and_every_later_one(tmp_path: Path) -> None:
    store = await _open(tmp_path / "w.db")
    await store.commit(_batch(1))
    os.kill(_child_pid(store), signal.SIGKILL)
    errors: list[BaseException | None] = []
    try:
        store.commit_cb(_batch(2), errors.append)  # sent before the end of the pipe is seen, or refused
    except StoreError as e:
        errors.append(e)
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    with pytest.raises(StoreError, match="writer process"):
        await store.commit(_batch(3))
    await store.close()
    snap = await open_and_load(tmp_path / "w.db")
    assert [r[1] for r in snap] == [1]  # the acknowledged batch is there; nothing else claimed


async def open_and_load(path: Path) -> list[tuple[object, ...]]:
    store = open_store(f"sqlite:///{path}")
    await store.open()
    snap = await store.load()
    await store.close()
    return snap.tables["units"]


async def test_the_writer_ignores_sigint_and_sigterm(tmp_path: Path) -> None:
    """A Ctrl-C reaches the whole process group: the parent decides when the writer stops."""
    store = await _open(tmp_path / "w.db")
    pid = _child_pid(store)
    os.kill(pid, signal.SIGINT)
    os.kill(pid, signal.SIGTERM)
    await store.commit(_batch(1))
    assert not _gone(pid)
    await store.close()


PARENT = """
import asyncio, sys
from distronet.coordinator.store import open_store

async def main():
    store = open_store(sys.argv[1])
    await store.open()
    print(store._proc.proc.pid, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_the_writer_dies_with_a_sigkilled_parent(tmp_path: Path) -> None:
    """A SIGKILLed coordinator leaves no writer behind to hold the database."""
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, f"sqlite:///{tmp_path / 'w.db'}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as parent:
        try:
            assert parent.stdout is not None
            child = int(parent.stdout.readline())
            assert not _gone(child)
            parent.kill()
            parent.wait(10)
            deadline = time.monotonic() + 10
            while not _gone(child) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert _gone(child)
        finally:
            parent.kill()


def test_frames_are_shape_checked() -> None:
    ok = [["units", [list(_unit(1, "t"))]]]
    assert _checked(ok) == [("units", ok[0][1])]
    for bad in ({"units": []}, [["nope", []]], [["units", [[1, 2]]]], [["units"]], [["units", "x"]]):
        with pytest.raises(StoreError, match="malformed"):
            _checked(bad)


async def test_close_does_not_hang_on_a_stopped_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that stops answering (SIGSTOP) is killed by close; its batch fails, typed."""
    from distronet.coordinator.store import sqlite, sqlite_writer

    monkeypatch.setattr(sqlite, "EXIT_TIMEOUT_S", 0.3)
    monkeypatch.setattr(sqlite_writer, "EXIT_TIMEOUT_S", 0.3)
    store = await _open(tmp_path / "w.db")
    pid = _child_pid(store)
    os.kill(pid, signal.SIGSTOP)
    errors: list[BaseException | None] = []
    store.commit_cb(_batch(1), errors.append)
    t0 = time.monotonic()
    await asyncio.wait_for(store.close(), 10)
    assert time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert _gone(pid)
