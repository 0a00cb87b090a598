"""Verified credit end to end (docs/decisions/verified-credit.md): a real coordinator on
loopback with a real SQLite file and the node's real client. A lease completion alone earns
nothing; receipts from other members for the node's steps, received during the lease, do; a
claimed step cannot move the run; eviction takes credit back; bootstrap resists a crowd of
Sybils on one network."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import LocalCoordinator, local_coordinator
from distronet.node.daemon.coordinator_client import CoordinatorClient, sign_receipt
from distronet.protocol.identity import Identity

TOKEN = "credit-operator-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHA = "cd" * 32


def spec(shards: int = 6, **credit: Any) -> dict[str, Any]:
    rows = [
        {"id": f"s{i}", "url": f"https://data.example/{i}", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(shards)
    ]
    manifest = {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": rows}
    return {"id": "r1", "data": {"manifest": manifest}, "credit": credit}


@pytest.fixture
async def lc(tmp_path: Path) -> AsyncIterator[LocalCoordinator]:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    async with local_coordinator(cfg) as lc:
        yield lc


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _create(http: aiohttp.ClientSession, lc: LocalCoordinator, body: dict[str, Any]) -> None:
    async with http.post(lc.url + "/api/v1/runs", json=body, headers=AUTH) as r:
        assert r.status == 201, await r.text()


async def _get(http: aiohttp.ClientSession, lc: LocalCoordinator, path: str) -> Any:
    async with http.get(lc.url + "/api/v1/runs/r1" + path) as r:
        assert r.status == 200
        return await r.json()


async def _ledger(http: aiohttp.ClientSession, lc: LocalCoordinator, who: Identity) -> dict[str, Any]:
    board = (await _get(http, lc, "/leaderboard?limit=100"))["leaderboard"]
    return next(x for x in board if x["peer_id"] == who.peer_id_b58)


@contextlib.asynccontextmanager
async def _members(lc: LocalCoordinator, n: int) -> AsyncIterator[list[tuple[Identity, CoordinatorClient]]]:
    ids = [Identity.generate() for _ in range(n)]
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for i, me in enumerate(ids):
            c = await stack.enter_async_context(CoordinatorClient(lc.url, "r1", me))
            await c.join(multiaddrs=[f"/ip4/10.{i}.0.1/tcp/4001"])
            out.append((me, c))
        yield out


async def test_completing_leases_without_training_earns_nothing(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec(min_steps=2, min_acceptors=2))
    async with _members(lc, 1) as [(a, ca)]:
        done = []
        for _ in range(6):  # lease and complete every unit at once, fetching nothing
            (lease,) = await ca.lease(4)
            got = await ca.complete(lease)
            assert got == {"unit": lease.unit, "credited": False, "tokens": 0}
            done.append(lease.unit)
        assert len(set(done)) == 1  # the unverified unit went back first in line, every time
        state = await _get(http, lc, f"/leases/{done[0]}")
        assert state["state"] == "free" and state["completed_by"] is None
    mine = await _ledger(http, lc, a)
    assert (mine["tokens"], mine["shards"], mine["tokens_per_s"]) == (0, 0, 0)
    progress = (await _get(http, lc, ""))["progress"]
    assert progress["done"] == 0


async def test_receipts_from_other_members_during_the_lease_earn_it(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec(min_steps=2, min_acceptors=2))
    async with _members(lc, 3) as [(a, ca), (b, cb), (c, _cc)]:
        early = [sign_receipt(b, "r1", 1, a.peer_id_b58, SHA), sign_receipt(c, "r1", 2, a.peer_id_b58, SHA)]
        assert (await cb.submit_receipts(early) or {})["accepted"] == 2
        (lease,) = await ca.lease(1)
        # receipts from before the lease do not back it
        assert (await ca.complete(lease) or {})["credited"] is False
        (lease,) = await ca.lease(1)
        one = [sign_receipt(b, "r1", 3, a.peer_id_b58, SHA), sign_receipt(b, "r1", 4, a.peer_id_b58, SHA)]
        await cb.submit_receipts(one)  # two steps, one acceptor: min_acceptors is 2
        assert (await ca.complete(lease) or {})["credited"] is False
        (lease,) = await ca.lease(1)
        both = [sign_receipt(b, "r1", 5, a.peer_id_b58, SHA), sign_receipt(c, "r1", 6, a.peer_id_b58, SHA)]
        assert (await cb.submit_receipts(both) or {})["accepted"] == 2
        assert await ca.complete(lease) == {"unit": lease.unit, "credited": True, "tokens": 100}
        # the receipts backed that unit: the next one needs new verified work
        (lease,) = await ca.lease(1)
        assert (await ca.complete(lease) or {})["credited"] is False
    mine = await _ledger(http, lc, a)
    assert (mine["tokens"], mine["shards"]) == (100, 1)
    assert 0 < mine["tokens_per_s"] <= 100 / 5.0  # credited tokens over at least a heartbeat interval


async def test_a_claimed_step_does_not_move_the_run(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec(step_slack=8, max_step_rate=0))
    async with _members(lc, 2) as [(a, ca), (b, cb)]:
        got = await ca.heartbeat(2**53, loss=1.0)
        assert got is not None and got["step"] <= 8
        assert (await _get(http, lc, ""))["progress"]["step"] <= 8
        assert (await _ledger(http, lc, a))["last_step"] <= 8
        # the receipt window still works: a receipt for a near step is accepted, a far one is not
        out = await cb.submit_receipts(
            [sign_receipt(b, "r1", 20, a.peer_id_b58, SHA), sign_receipt(b, "r1", 5000, a.peer_id_b58, SHA)]
        )
        assert out is not None and out["accepted"] == 1 and out["rejected"][0]["code"] == "future_step"
        got = await ca.heartbeat(2**53)
        assert got is not None and got["step"] == 28  # receipt-backed step 20 plus the slack


async def test_eviction_takes_credit_back(lc: LocalCoordinator, http: aiohttp.ClientSession) -> None:
    await _create(http, lc, spec(min_steps=1, min_acceptors=1))
    async with _members(lc, 3) as [(a, ca), (b, cb), (_c, cc)]:
        (lease,) = await ca.lease(1)
        await cb.submit_receipts([sign_receipt(b, "r1", 1, a.peer_id_b58, SHA)])
        assert (await ca.complete(lease) or {})["credited"] is True
        (lease,) = await ca.lease(1)
        await cb.submit_receipts([sign_receipt(b, "r1", 2, a.peer_id_b58, SHA)])
        # b is caught cheating: evicted, its receipts no longer back a's lease
        async with http.post(
            lc.url + f"/api/v1/runs/r1/nodes/{b.peer_id_b58}/evict", json={"reason": "proof"}, headers=AUTH
        ) as r:
            assert r.status == 200
        assert (await ca.complete(lease) or {})["credited"] is False
        async with http.post(
            lc.url + f"/api/v1/runs/r1/nodes/{a.peer_id_b58}/evict", json={"reason": "proof"}, headers=AUTH
        ) as r:
            assert r.status == 200
        mine = await _ledger(http, lc, a)
        assert (mine["tokens"], mine["shards"], mine["steps_acknowledged"], mine["state"]) == (
            0, 0, 0, "evicted",
        )  # fmt: skip
        listed = {p["peer_id"] for p in (await cc.join()).bootstrap_peers}
        assert a.peer_id_b58 not in listed and b.peer_id_b58 not in listed


async def test_sybils_on_one_network_cannot_fill_bootstrap(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec())
    async with contextlib.AsyncExitStack() as stack:

        async def join(addr: str) -> tuple[str, CoordinatorClient]:
            me = Identity.generate()
            c = await stack.enter_async_context(CoordinatorClient(lc.url, "r1", me))
            await c.join(multiaddrs=[addr])
            return me.peer_id_b58, c

        addrs = (
            "/ip4/192.0.2.7/tcp/4001",
            "/ip6/2001:db8:1::5/tcp/4001",
            "/ip4/198.51.100.3/udp/4001/quic-v1",
        )
        honest = [(await join(addr))[0] for addr in addrs]
        for i in range(17):  # joined last: the most recently seen
            await join(f"/ip4/10.66.{i}.{i + 1}/tcp/4001")
        _, newcomer = await join("/ip4/203.0.113.9/tcp/4001")
        for _ in range(20):
            listed = [p["peer_id"] for p in (await newcomer.join()).bootstrap_peers]
            assert len(listed) == 16 and set(honest) <= set(listed), listed
