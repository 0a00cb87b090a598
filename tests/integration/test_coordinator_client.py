"""The node's coordinator client keeps its reports through an outage and replays them after."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import local_coordinator
from distronet.node.daemon.coordinator_client import (
    CoordinatorClient,
    CoordinatorUnreachable,
    sign_receipt,
)
from distronet.protocol.coordinator_api import CREATE_RUN
from distronet.protocol.identity import Identity


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec() -> dict[str, object]:
    shards = [
        {"id": f"s{i}", "url": f"https://d.example/{i}", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(4)
    ]
    return CREATE_RUN.validate(
        {
            "id": "r1",
            "data": {"manifest": {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards}},
            "credit": {"min_steps": 0},  # completions are trusted: no receipts here
        }
    )


async def _until(cond: Callable[[], bool], deadline_s: float = 15.0) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def test_reports_queue_while_down_and_replay_once_back(tmp_path: Path) -> None:
    port = _free_port()
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token="t")
    a, b = Identity.generate(), Identity.generate()
    client = CoordinatorClient(
        f"http://127.0.0.1:{port}", "r1", a, timeout_s=2, retry_min_s=0.05, retry_max_s=0.2
    )
    async with local_coordinator(cfg, port=port) as lc:
        lc.app.svc.create_run(_spec())
        await client.join()
        async with CoordinatorClient(lc.url, "r1", b) as cb:
            await cb.join()
        (lease,) = await client.lease()
    # coordinator down: answers-now calls raise, reports queue
    try:
        await client.lease()
        raise AssertionError("lease should fail while the coordinator is down")
    except CoordinatorUnreachable:
        pass
    assert await client.complete(lease) is None
    assert await client.heartbeat(10, loss=3.0) is None
    assert await client.heartbeat(11, loss=2.9) is None  # coalesced with the previous one
    assert await client.submit_receipts([sign_receipt(b, "r1", 9, a.peer_id_b58, "ee" * 32)]) is None
    assert client.pending == 3
    async with local_coordinator(cfg, port=port) as lc:
        await _until(lambda: client.pending == 0)
        # the restarted coordinator forgot the client's session: the replay opened a new one by itself
        assert len(lc.app.sessions) == 1
        node = lc.app.svc.runs["r1"].nodes[a.peer_id_b58]
        assert (node.tokens, node.shards, node.steps, node.last_step) == (100, 1, 1, 11)
        assert await client.complete(lease) == {"unit": lease.unit, "credited": False, "tokens": 0}
    await client.close()
    assert client.dropped == 0


async def test_queued_reports_survive_a_daemon_restart(tmp_path: Path) -> None:
    port = _free_port()
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token="t")
    a = Identity.generate()
    url = f"http://127.0.0.1:{port}"
    buf = tmp_path / "reports.jsonl"
    async with local_coordinator(cfg, port=port) as lc:
        lc.app.svc.create_run(_spec())
        async with CoordinatorClient(url, "r1", a) as c:
            await c.join()
            leases = await c.lease()
    async with CoordinatorClient(url, "r1", a, buffer_path=buf, timeout_s=1, retry_max_s=0.2) as c:
        assert await c.complete(leases[0]) is None
        assert c.pending == 1
    assert buf.read_text().count("\n") == 1
    async with local_coordinator(cfg, port=port) as lc:
        async with CoordinatorClient(url, "r1", a, buffer_path=buf, retry_min_s=0.05) as c:
            assert c.pending == 1
            c.resume()
            await _until(lambda: c.pending == 0)
        assert lc.app.svc.runs["r1"].nodes[a.peer_id_b58].shards == 1
    assert buf.read_text() == ""


async def test_hot_calls_keep_the_hand_written_path(tmp_path: Path) -> None:
    """join/session travel on connections aiohttp serves; heartbeat, lease, renew and complete
    keep connections of their own, so the coordinator answers them on its hot path."""
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token="t")
    async with local_coordinator(cfg) as lc:
        lc.app.svc.create_run(_spec())
        async with CoordinatorClient(lc.url, "r1", Identity.generate()) as client:
            await client.join()
            handed = lc.site.handed_over
            assert handed >= 1  # the join (not a hot route) went to aiohttp
            (lease,) = await client.lease()
            await client.renew(lease)
            assert await client.heartbeat(3, loss=2.5) is not None
            assert (await client.complete(lease) or {}).get("credited") is True
            await client.get_run()  # not hot: back on the connection aiohttp already serves
        assert lc.site.hot_calls == 4
        assert lc.site.handed_over == handed  # the hot calls' connection was never handed over
