"""Shard leases: BOINC's rules (never lost, never credited twice), unit by unit and at scale."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from distronet.coordinator.events import EventBus
from distronet.coordinator.groupcommit import GroupCommitter
from distronet.coordinator.leases import DONE, FREE, LEASED, LeaseBook
from distronet.coordinator.runs import NodeRecord
from distronet.coordinator.service import Coordinator
from distronet.coordinator.store import open_store
from distronet.protocol.coordinator_api import CREATE_RUN, ApiError, ApiErrorCode


def test_issue_renew_complete_and_repeat() -> None:
    book = LeaseBook(3, ttl=10.0)
    u = book.issue("a", now=0.0)
    assert u is not None and u.unit == 0 and u.state == LEASED and u.expires_at == 10.0
    assert book.renew(0, u.token or "", "a", now=5.0).expires_at == 15.0
    done, credited = book.complete(0, u.token or "", "a", now=6.0)
    assert credited and done.state == DONE and done.completed_by == "a"
    again, credited = book.complete(0, u.token or "", "a", now=7.0)
    assert not credited and again is done
    assert book.done == 1 and book.leased == 0 and book.held_by("a") == 0


def test_expired_lease_goes_back_first_in_line_and_old_token_is_lost() -> None:
    book = LeaseBook(5, ttl=10.0)
    first = book.issue("a", 0.0)
    assert first is not None
    old = first.token or ""
    book.issue("a", 1.0)
    assert [u.unit for u in book.expire_due(10.5)] == [0]
    again = book.issue("b", 11.0)
    assert again is not None and again.unit == 0 and again.issues == 2
    with pytest.raises(ApiError) as e:
        book.complete(0, old, "a", 12.0)
    assert e.value.code is ApiErrorCode.LEASE_LOST
    with pytest.raises(ApiError):
        book.renew(0, old, "a", 12.0)


def test_a_renewed_lease_does_not_expire_at_its_old_deadline() -> None:
    book = LeaseBook(2, ttl=10.0)
    u = book.issue("a", 0.0)
    assert u is not None
    book.renew(0, u.token or "", "a", 8.0)
    assert book.expire_due(12.0) == []
    assert [x.unit for x in book.expire_due(18.0)] == [0]


def test_release_returns_every_lease_of_a_holder() -> None:
    book = LeaseBook(4, ttl=10.0)
    for _ in range(3):
        book.issue("a", 0.0)
    book.issue("b", 0.0)
    assert sorted(u.unit for u in book.release("a")) == [0, 1, 2]
    assert book.held_by("a") == 0 and book.leased == 1
    assert [book.issue("c", 1.0).unit for _ in range(3)] == [2, 1, 0]  # type: ignore[union-attr]
    assert book.issue("c", 1.0) is None


def test_restore_rebuilds_queues() -> None:
    book = LeaseBook(6, ttl=10.0)
    units = [book.issue(h, 0.0) for h in "abc"]
    assert all(u is not None for u in units)
    book.complete(1, units[1].token or "", "b", 1.0)  # type: ignore[union-attr]
    book.release("c")
    copy = LeaseBook(6, ttl=10.0)
    copy.restore([_clone(u) for u in book.units.values()])
    assert (copy.done, copy.leased, copy.held_by("a")) == (1, 1, 1)
    issued = [copy.issue("d", 2.0) for _ in range(4)]
    assert sorted(u.unit for u in issued if u is not None) == [2, 3, 4, 5]


def _clone(u: Any) -> Any:
    from distronet.coordinator.leases import Unit

    return Unit(u.unit, u.state, u.token, u.holder, u.leased_at, u.expires_at, u.completed_by, u.completed_at)


def test_faster_nodes_are_allowed_more_leases(spec_factory: Callable[..., dict[str, Any]]) -> None:
    from distronet.coordinator.runs import RunState

    run = RunState(
        CREATE_RUN.validate(spec_factory(shards=50)), shard_root=None, created_at=0.0, state="open"
    )
    fast = NodeRecord("fast", 1, [], "", 0.0, 0.0, speed=400.0)
    mid = NodeRecord("mid", 1, [], "", 0.0, 0.0, speed=100.0)
    slow = NodeRecord("slow", 1, [], "", 0.0, 0.0, speed=25.0)
    new = NodeRecord("new", 1, [], "", 0.0, 0.0)
    run.nodes.update({n.peer: n for n in (fast, mid, slow, new)})
    assert run.allowance(fast, 1.0) > run.allowance(mid, 1.0) > run.allowance(slow, 1.0) == 1
    assert run.allowance(new, 1.0) == 1
    assert run.allowance(fast, 1.0) <= run.max_leases


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.slow
async def test_200_nodes_10000_events_every_shard_done_exactly_once(
    tmp_path: Path, spec_factory: Callable[..., dict[str, Any]]
) -> None:
    """200 simulated nodes lease, renew, complete, repeat completions, die and come back as
    zombies holding stale tokens, in random order, against one coordinator on a real SQLite file
    (group commits of 1-40 operations). Then: every shard is DONE exactly once, credited to
    exactly one node, the ledgers add up, and the SQLite file tells the same story."""
    rng = random.Random(20261129)
    clock = _Clock()
    store = open_store(f"sqlite:///{tmp_path / 'prop.db'}", synchronous="NORMAL")
    await store.open()
    committer = GroupCommitter(store)
    committer.start()
    svc = Coordinator(committer, EventBus(), clock=clock)
    n_shards = 1500
    run, _ = svc.create_run(CREATE_RUN.validate(spec_factory(shards=n_shards, lease_ttl_s=30.0)))
    peers = [f"peer{i:03d}" for i in range(200)]
    for p in peers:
        run.nodes[p] = NodeRecord(p, 1, [], "", clock.t, clock.t)
    held: dict[str, list[tuple[int, str]]] = {p: [] for p in peers}
    dead: set[str] = set()
    credits: dict[int, list[str]] = {}
    events = 0
    while events < 10_000 or run.book.remaining > 0:
        assert events < 200_000, "the run did not finish"
        for _ in range(rng.randint(1, 40)):
            events += 1
            p = rng.choice(peers)
            r = rng.random()
            if p in dead:
                if r < 0.3:  # a zombie comes back: tries its stale leases first
                    dead.discard(p)
                    for unit, token in held[p]:
                        _try(lambda u=unit, t=token: _complete(svc, run, p, u, t, credits))  # noqa: B023
                    held[p] = []
                continue
            node = svc.node_for(run, p)
            if r < 0.03:
                dead.add(p)  # dies holding its leases
            elif r < 0.45 or not held[p]:
                got = svc.lease(run, node, rng.randint(1, 4))["leases"]
                held[p] += [(x["unit"], x["lease_token"]) for x in got]
            elif r < 0.60:
                unit, token = rng.choice(held[p])
                if not _try(lambda u=unit, t=token: svc.renew(run, node, u, t)):  # noqa: B023
                    held[p].remove((unit, token))
            else:
                unit, token = held[p].pop(rng.randrange(len(held[p])))
                _complete(svc, run, p, unit, token, credits)
                if rng.random() < 0.2:  # a retried report: never credited again
                    _complete(svc, run, p, unit, token, credits)
        clock.t += rng.uniform(0.0, 3.0)
        if rng.random() < 0.3:
            svc.sweep()
        await committer.durable()
    await committer.close()

    assert sorted(credits) == list(range(n_shards)), "a shard was lost"
    assert all(len(v) == 1 for v in credits.values()), "a shard was credited twice"
    assert run.book.done == n_shards and run.book.leased == 0
    assert sum(n.shards for n in run.nodes.values()) == n_shards
    assert sum(n.tokens for n in run.nodes.values()) == 100 * n_shards
    assert sum(u.issues for u in run.book.units.values()) > n_shards  # leases really were reissued

    again = Coordinator(GroupCommitter(store), EventBus(), clock=clock)
    again.restore(await store.load())
    r2 = again.runs[run.id]
    assert all(r2.book.units[n].state == DONE for n in range(n_shards))
    assert {n: [r2.book.units[n].completed_by] for n in range(n_shards)} == credits
    assert {p: n.tokens for p, n in r2.nodes.items()} == {p: n.tokens for p, n in run.nodes.items()}
    await store.close()
    assert FREE not in {u.state for u in r2.book.units.values()}


def _try(fn: Callable[[], object]) -> bool:
    try:
        fn()
    except ApiError as e:
        assert e.code in (ApiErrorCode.LEASE_LOST, ApiErrorCode.CONFLICT), e
        return False
    return True


def _complete(
    svc: Coordinator, run: Any, peer: str, unit: int, token: str, credits: dict[int, list[str]]
) -> None:
    try:
        out = svc.complete(run, svc.node_for(run, peer), unit, token)
    except ApiError as e:
        assert e.code is ApiErrorCode.LEASE_LOST
        return
    if out["credited"]:
        credits.setdefault(unit, []).append(peer)
