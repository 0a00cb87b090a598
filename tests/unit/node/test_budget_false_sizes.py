"""Issue 17: announcements with false sizes must not reserve a victim's whole download budget.

An announcement only claims its frame's size. Three Sybils claim frames just under what the
victim can download by the deadline and never send a byte; five honest peers announce 200 kB
frames. The exchange's admission (``_admit``, driven as gossip drives it) must still pull every
honest frame; on the old accounting (each claim held in full) all five were skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from types import SimpleNamespace
from typing import Any

import pytest

from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig
from distronet.node.exchange.types import RoundState
from distronet.node.swarm.budget import EXACT, Bandwidth, Reservations, TokenBucket
from distronet.node.swarm.errors import PullTimeout
from distronet.protocol.announce import Announcement
from distronet.protocol.identity import Identity

HONEST_SIZE = 200_000


class FakePuller:
    """Honest producers deliver (reporting progress); Sybils never answer."""

    def __init__(self, liars: set[bytes]) -> None:
        self.liars, self.asked = liars, 0

    async def fetch(self, peer: Any, digest: bytes, *, size: int, timeout: float, progress: Any = None,
                    **_: Any) -> bytes:  # fmt: skip
        self.asked += 1
        if peer.to_bytes() in self.liars:
            await asyncio.sleep(timeout)
            raise PullTimeout("never answered")
        progress(size)
        return bytes(size)


def ann(peer: bytes, size: int) -> Announcement:
    return Announcement(1, "r", 0, peer, hashlib.sha256(peer).digest(), size, (), b"s" * 64)


@pytest.mark.asyncio
async def test_false_sizes_do_not_starve_honest_frames() -> None:
    liars = [Identity.generate().peer_id for _ in range(3)]
    honest = [Identity.generate().peer_id for _ in range(5)]
    bw = Bandwidth.from_rates("unlimited", "4MB/s", wire=EXACT)
    swarm = SimpleNamespace(
        bandwidth=bw, puller=FakePuller(set(liars)), identity=Identity.generate(), run_id="r"
    )
    ex = AsyncSwarmExchange(swarm, ExchangeConfig(round_deadline_s=2.0), None)  # type: ignore[arg-type]
    ex._subscribed = set(liars) | set(honest)
    state = RoundState(opened_at=time.monotonic())
    claim = bw.down.affordable(1.9) - 1  # each lie alone would fit: the old code held it all
    for p in liars:
        ex._admit(state, ann(p, claim))
    for p in honest:
        ex._admit(state, ann(p, HONEST_SIZE))
    assert ex.skipped_for_budget == 0
    assert set(state.pulls) == set(liars) | set(honest)
    await asyncio.wait_for(asyncio.gather(*(state.pulls[p] for p in honest)), 1.0)
    assert set(state.frames) == set(honest)
    for p in liars:
        state.pulls[p].cancel()
    await asyncio.gather(*state.pulls.values(), return_exceptions=True)
    assert ex._holds.held == 0  # every hold released when its pull ended


def test_a_hold_is_one_fair_share_and_settles_against_bytes_received() -> None:
    bucket = TokenBucket(1_000_000, burst=100_000)
    holds = Reservations(floor=10_000)
    assert holds.admit(bucket, "lie", 10**9, 1.0, shares=4)  # holds a quarter, not a billion
    assert 270_000 <= holds.held <= 280_000
    assert holds.admit(bucket, "a", 300_000, 1.0, shares=4)
    assert holds.admit(bucket, "b", 100_000, 1.0, shares=4)
    assert not holds.admit(bucket, "a", 1, 1.0, shares=4)  # one hold per frame
    before = holds.held
    holds.arrived("b", 60_000)
    holds.arrived("b", 60_000)  # more than it claimed: the hold only reaches zero
    assert holds.held == before - 100_000
    holds.release("lie")
    holds.release("a")
    holds.release("b")
    holds.release("never-admitted")
    assert holds.held == 0
    tiny = TokenBucket(10_000, burst=16_384)
    assert Reservations(floor=20_000).admit(tiny, "x", 20_000, 1.0, shares=8)  # the floor: one whole frame
