"""The coordinator's operations with a driven clock: liveness, uptime, expiry, restore."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from distronet.coordinator.events import EventBus
from distronet.coordinator.groupcommit import GroupCommitter
from distronet.coordinator.runs import ACTIVE, GONE
from distronet.coordinator.service import Coordinator
from distronet.coordinator.store import Store, open_store
from distronet.protocol.coordinator_api import CREATE_RUN, ApiError, ApiErrorCode, join_message
from distronet.protocol.identity import Identity


class Clock:
    def __init__(self) -> None:
        self.t = 5_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[Coordinator, Clock, Store, EventBus]]:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    await store.open()
    committer = GroupCommitter(store)
    committer.start()
    clock, bus = Clock(), EventBus()
    yield Coordinator(committer, bus, clock=clock), clock, store, bus
    await committer.close()
    await store.close()


def _join(svc: Coordinator, run: Any, ident: Identity, **extra: Any) -> dict[str, Any]:
    ch, _ = svc.challenge(run, ident.peer_id_b58)
    sig = base64.b64encode(ident.sign(join_message(run.id, ident.peer_id_b58, ch))).decode()
    req = {
        "peer_id": ident.peer_id_b58,
        "challenge": ch,
        "signature": sig,
        "multiaddrs": [],
        "agent": "t",
        **extra,
    }
    return svc.join(run, req)


async def test_silent_nodes_go_and_come_back_uptime_counts_only_while_live(
    env: tuple[Coordinator, Clock, Store, EventBus], spec_factory: Callable[..., dict[str, Any]]
) -> None:
    svc, clock, _, bus = env
    run, _ = svc.create_run(CREATE_RUN.validate(spec_factory() | {"node_timeout_s": 30.0}))
    me = Identity.generate()
    _join(svc, run, me)
    node = run.nodes[me.peer_id_b58]
    for _ in range(4):
        clock.t += 10
        svc.node_for(run, me.peer_id_b58)
    assert node.uptime_s == pytest.approx(40.0)
    clock.t += 31
    svc.sweep()
    await svc.committer.durable()
    assert node.state == GONE
    assert [e.type for e in bus.recent(run.id)][-1] == "peer_left"
    clock.t += 1000
    svc.node_for(run, me.peer_id_b58)  # back: no uptime for the silence
    assert node.state == ACTIVE and node.uptime_s == pytest.approx(40.0)


async def test_leases_of_a_dead_node_are_reissued_after_expiry(
    env: tuple[Coordinator, Clock, Store, EventBus], spec_factory: Callable[..., dict[str, Any]]
) -> None:
    svc, clock, _, _ = env
    run, _ = svc.create_run(CREATE_RUN.validate(spec_factory(shards=1)))
    a, b = Identity.generate(), Identity.generate()
    _join(svc, run, a)
    _join(svc, run, b)
    (la,) = svc.lease(run, svc.node_for(run, a.peer_id_b58), 1)["leases"]
    assert svc.lease(run, svc.node_for(run, b.peer_id_b58), 1)["leases"] == []
    clock.t += run.book.ttl + 1
    (lb,) = svc.lease(run, svc.node_for(run, b.peer_id_b58), 1)["leases"]
    assert lb["unit"] == la["unit"] and lb["lease_token"] != la["lease_token"]
    with pytest.raises(ApiError) as e:
        svc.complete(run, svc.node_for(run, a.peer_id_b58), la["unit"], la["lease_token"])
    assert e.value.code is ApiErrorCode.LEASE_LOST
    assert svc.complete(run, svc.node_for(run, b.peer_id_b58), lb["unit"], lb["lease_token"])["credited"]
    assert svc.lease(run, svc.node_for(run, b.peer_id_b58), 0)["exhausted"] is True


async def test_join_tokens_expire_and_evicted_peers_stay_out(
    env: tuple[Coordinator, Clock, Store, EventBus], spec_factory: Callable[..., dict[str, Any]]
) -> None:
    svc, clock, _, _ = env
    run, _ = svc.create_run(CREATE_RUN.validate(spec_factory() | {"admission": {"policy": "token"}}))
    (tok,) = svc.create_join_tokens(run, 1, 5, expires_in=60)
    a, b = Identity.generate(), Identity.generate()
    _join(svc, run, a, join_token=tok)
    svc.evict(run, a.peer_id_b58, "test")
    with pytest.raises(ApiError) as e:
        _join(svc, run, a, join_token=tok)
    assert e.value.code is ApiErrorCode.EVICTED
    clock.t += 61
    with pytest.raises(ApiError) as e:
        _join(svc, run, b, join_token=tok)
    assert e.value.code is ApiErrorCode.BAD_JOIN_TOKEN


async def test_restart_restores_ledger_tokens_and_credited_steps(
    env: tuple[Coordinator, Clock, Store, EventBus], spec_factory: Callable[..., dict[str, Any]]
) -> None:
    from distronet.node.daemon.coordinator_client import sign_receipt

    svc, clock, store, _ = env
    run, _ = svc.create_run(CREATE_RUN.validate(spec_factory() | {"admission": {"policy": "token"}}))
    (tok,) = svc.create_join_tokens(run, 1, 3, expires_in=600)
    a, b = Identity.generate(), Identity.generate()
    _join(svc, run, a, join_token=tok)
    _join(svc, run, b, join_token=tok)
    node_b = svc.node_for(run, b.peer_id_b58)
    receipt = sign_receipt(b, run.id, 3, a.peer_id_b58, "aa" * 32)
    assert svc.receipts(run, node_b, [receipt])["accepted"] == 1
    await svc.committer.durable()

    again = Coordinator(GroupCommitter(store), EventBus(), clock=clock)
    again.restore(await store.load())
    r2 = again.runs[run.id]
    assert r2.nodes[a.peer_id_b58].steps == 1
    assert again.receipts(r2, r2.nodes[b.peer_id_b58], [receipt]) == {
        "accepted": 0,
        "duplicate": 1,
        "rejected": [],
    }
    assert r2.tokens[r2.hash_token(tok)][0] == 1  # one use left of three


async def test_many_acceptors_of_one_packet_cost_one_verify(
    env: tuple[Coordinator, Clock, Store, EventBus],
    spec_factory: Callable[..., dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from distronet.coordinator import service as service_mod
    from distronet.node.daemon.coordinator_client import sign_receipt

    svc, _, _, _ = env
    run, _ = svc.create_run(CREATE_RUN.validate(spec_factory()))
    producer, *acceptors = [Identity.generate() for _ in range(6)]
    for ident in (producer, *acceptors):
        _join(svc, run, ident)
    calls = []
    real = service_mod.identity.verify
    monkeypatch.setattr(service_mod.identity, "verify", lambda *a: calls.append(1) or real(*a))
    receipts = [sign_receipt(a, run.id, 4, producer.peer_id_b58, "bb" * 32) for a in acceptors]
    out = svc.receipts(run, svc.node_for(run, acceptors[0].peer_id_b58), receipts)
    assert out == {"accepted": 1, "duplicate": 4, "rejected": []}
    assert len(calls) == 1 and run.nodes[producer.peer_id_b58].steps == 1
