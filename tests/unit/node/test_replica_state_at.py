"""``Replica.state_at``: the state at one step's boundary, the rendezvous a state donor serves."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch

from distronet.node.catchup.replica import Replica
from distronet.node.catchup.state import load_state_blob


def _replica(step: int) -> Replica:
    torch.manual_seed(0)
    trainer = SimpleNamespace(model=torch.nn.Linear(3, 2))
    return Replica(trainer=trainer, optimizer=None, fresh_optimizer=lambda: None, step=step)  # type: ignore[arg-type]


async def _step(replica: Replica, by: int = 1) -> None:
    """A training step of a stand-in: the parameters at step s are all s."""
    async with replica.lock:
        replica.step += by
        with torch.no_grad():
            for p in replica.model.parameters():
                p.fill_(float(replica.step))
        await replica.boundary()


def _step_of(blob: bytes) -> tuple[int, float]:
    model = torch.nn.Linear(3, 2)
    step = load_state_blob(blob, model)
    return step, float(model.weight.detach()[0, 0])


async def test_a_replica_resting_at_the_step_answers_now() -> None:
    replica = _replica(5)
    await _step(replica, 0)
    got = await replica.state_at(5)
    assert got is not None and got[0] == 5 and _step_of(got[1]) == (5, 5.0)


async def test_a_step_ahead_is_answered_at_its_boundary_with_one_copy_for_all() -> None:
    replica = _replica(5)
    waiters = [asyncio.ensure_future(replica.state_at(8)) for _ in range(3)]
    await asyncio.sleep(0)
    for _ in range(2):
        await _step(replica)
        assert not any(w.done() for w in waiters)
    await _step(replica)
    got = [await w for w in waiters]
    assert all(g is not None and g[0] == 8 for g in got)
    assert len({id(g[1]) for g in got if g is not None}) == 1  # one snapshot served them all
    assert got[0] is not None and _step_of(got[0][1]) == (8, 8.0)
    assert replica._wanted == {}


async def test_a_step_passed_or_skipped_answers_none() -> None:
    replica = _replica(5)
    assert await replica.state_at(4) is None
    skipped = asyncio.ensure_future(replica.state_at(6))
    await asyncio.sleep(0)
    await _step(replica, 3)  # an adopted state or replayed rounds jump past 6
    assert await skipped is None and replica._wanted == {}


async def test_the_step_running_is_too_late() -> None:
    """Step 5 is running (the lock held): its start was the boundary; we learn so once it ends."""
    replica = _replica(5)
    await replica.lock.acquire()
    late = asyncio.ensure_future(replica.state_at(5))
    await asyncio.sleep(0)
    assert not late.done()
    replica.step = 6
    replica.lock.release()
    assert await late is None


async def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    replica = _replica(5)
    waiter = asyncio.ensure_future(replica.state_at(9))
    await asyncio.sleep(0)
    assert 9 in replica._wanted
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert replica._wanted == {}
