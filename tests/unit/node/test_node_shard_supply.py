"""ShardSupply: a shard boundary takes the shard fetched ahead and never waits for a slow
coordinator; each shard is completed once; a node allowed one lease still gets its next shard.
(An in-memory coordinator stands in for the real one; the daemon's chaos tests use the real one.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from distronet.node.daemon.coordinator_client import CoordinatorUnreachable, Lease
from distronet.node.data import shard_supply
from distronet.node.data.shard_supply import ShardSupply


def _lease(unit: int) -> Lease:
    return Lease(unit, 0, f"s{unit}", f"tok{unit}", 1e12, 10, 10, "0" * 64, f"/shards/{unit}")


class FakeCoordinator:
    """Leases units 0, 1, 2, ... up to ``allowance`` held at once; ``stalled`` holds every call."""

    def __init__(self, allowance: int = 2) -> None:
        self.allowance = allowance
        self.held: set[int] = set()
        self.completed: list[int] = []
        self.next_unit = 0
        self.stalled = asyncio.Event()
        self.stalled.set()  # set: answering

    async def lease(self, want: int = 1) -> list[Lease]:
        await self.stalled.wait()
        if len(self.held) >= self.allowance:
            return []
        unit, self.next_unit = self.next_unit, self.next_unit + 1
        self.held.add(unit)
        return [_lease(unit)]

    async def complete(self, lease: Lease) -> dict[str, Any] | None:
        await self.stalled.wait()
        self.completed.append(lease.unit)
        self.held.discard(lease.unit)
        return {"credited": True}


@pytest.fixture(autouse=True)
def _no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fetch(base_url: str, lease: Lease, folder: Path, **_: Any) -> Path:
        return folder / f"{lease.unit}.bin"

    monkeypatch.setattr(shard_supply, "fetch_shard", fetch)
    monkeypatch.setattr(shard_supply, "shard_tokens", lambda path, dtype: f"tokens of {path.name}")


def _supply(coord: FakeCoordinator, credited: list[int]) -> ShardSupply:
    return ShardSupply(
        coord,  # type: ignore[arg-type]
        "http://coordinator",
        Path("/nonexistent"),
        "uint16",
        on_completed=lambda lease: credited.append(lease.unit),
    )


async def _settle(supply: ShardSupply) -> None:
    """Until the lease ahead (if any) and the completion report in flight are done (the ahead
    reads its tokens on a thread)."""
    deadline = time.monotonic() + 10
    for task in (supply._ahead, supply._completing):
        while task is not None and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
    for _ in range(5):
        await asyncio.sleep(0)


async def _started(coord: FakeCoordinator) -> tuple[ShardSupply, list[int], tuple[Lease, Any]]:
    """A supply that has taken its first shard, with its lease ahead (if any) settled."""
    credited: list[int] = []
    supply = _supply(coord, credited)
    first = await supply.next(None)
    assert first is not None
    await _settle(supply)
    return supply, credited, first


async def test_the_next_shard_is_fetched_ahead_and_taken_at_the_boundary() -> None:
    coord = FakeCoordinator()
    supply, credited, first = await _started(coord)
    assert first[0].unit == 0 and first[1] == "tokens of 0.bin"
    assert coord.held == {0, 1}  # shard 1 leased (and fetched) while shard 0 trains
    second = await supply.next(first[0])
    assert second is not None and second[0].unit == 1
    await _settle(supply)
    assert coord.completed == [0] and credited == [0]
    assert coord.held == {1, 2}
    await supply.close()


async def test_a_stalled_coordinator_never_holds_a_boundary() -> None:
    coord = FakeCoordinator()
    supply, credited, first = await _started(coord)
    second = await supply.next(first[0])  # shard 1 was already here
    assert second is not None
    coord.stalled.clear()  # the coordinator stops answering (SIGSTOP, not a refusal)
    t0 = time.monotonic()
    again = await supply.next(second[0])  # the lease ahead is stuck: read shard 1 again
    assert again is None and time.monotonic() - t0 < 0.5
    assert await supply.next(second[0]) is None  # a completion already on its way is not repeated
    coord.stalled.set()
    await _settle(supply)
    third = await supply.next(second[0])
    assert third is not None and third[0].unit == 2
    await _settle(supply)
    assert coord.completed == [0, 1] and credited == [0, 1]  # each shard completed exactly once
    await supply.close()


async def test_a_node_allowed_one_lease_still_gets_its_next_shard() -> None:
    coord = FakeCoordinator(allowance=1)
    supply, _, first = await _started(coord)
    assert coord.held == {0}  # no lease ahead for this node
    second = await supply.next(first[0])  # completes 0 first, then leases inline
    assert second is not None and second[0].unit == 1
    await _settle(supply)
    assert coord.completed == [0]
    await supply.close()


async def test_an_unreachable_coordinator_means_no_new_shard_now() -> None:
    coord = FakeCoordinator()
    supply, _, first = await _started(coord)  # shard 1 is leased ahead before the refusals begin

    async def refuse(want: int = 1) -> list[Lease]:
        raise CoordinatorUnreachable("connection refused")

    coord.lease = refuse  # type: ignore[method-assign]
    ahead = await supply.next(first[0])  # shard 1 was leased before the refusals began
    assert ahead is not None and ahead[0].unit == 1
    await _settle(supply)
    assert await supply.next(ahead[0]) is None  # nothing ahead, nothing now: read shard 1 again
    await supply.close()


async def test_close_stops_the_fetch_ahead_and_lets_the_report_finish() -> None:
    coord = FakeCoordinator()
    supply, _, first = await _started(coord)
    second = await supply.next(first[0])
    assert second is not None
    await asyncio.wait_for(supply.close(), 5)
    assert coord.completed == [0]
