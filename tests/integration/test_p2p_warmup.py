"""Warm-up masking and falling behind, over three REAL p2pd peers on loopback.

1. A peer in warm-up publishes marked packets: every replica collects the same accepted set
   without it (masked) while hearing it (live); once warm-up is over its packet counts.
2. A peer whose window is far behind its peers' (as after a SIGSTOP) gets ``FellBehind`` from a
   round no other producer joined, instead of applying a round of one; when it then jumps to
   the swarm's step, the announcements it heard early are handed to that round, so it applies
   the same accepted set as the others.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from p2p_trio import eventually, trio

from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig, FellBehind
from distronet.node.swarm.stack import Swarm
from distronet.protocol.layout import layout_digest
from distronet.protocol.packet import seal_packet

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(180)]

RUN = "warm-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(
    round_deadline_s=1.0, manifest_grace_s=0.3, manifest_wait_s=2.0, pull_timeout_s=10.0, warmup_mask_steps=2
)
Peers = list[tuple[Swarm, AsyncSwarmExchange]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peers]:
    async with trio(tmp_path_factory.mktemp("warm"), RUN, CONFIG) as out:
        yield out


def packet(swarm: Swarm, step: int) -> bytes:
    return seal_packet(swarm.identity, RUN, step, DIGEST, os.urandom(20_000))


async def one_step(peers: Peers, step: int) -> list[dict[bytes, bytes]]:
    """Every peer of ``peers`` publishes ``step`` then all collect it; the accepted sets."""
    for swarm, ex in peers:
        await ex.publish(step, packet(swarm, step))
    rounds = await asyncio.gather(*(ex.collect(step) for _, ex in peers))
    return [dict(r) for r in rounds]


async def test_warm_up_packets_are_masked_on_every_replica(peers: Peers) -> None:
    (a, xa), (b, xb), (_c, xc) = peers
    assert xc.start_warmup(0) == 2  # steps 0 and 1 are masked
    for step in (0, 1):
        rounds = await one_step(peers, step)
        assert rounds[0] == rounds[1] == rounds[2], step
        assert set(rounds[0]) == {a.identity.peer_id, b.identity.peer_id}, step

    async def heard() -> bool:  # counted as live all the same
        return xa.warmup_heard >= 1 and xb.warmup_heard >= 1

    await eventually(heard, 5.0, "A and B to hear C's warm-up announcements")
    rounds = await one_step(peers, 2)  # warm-up over: C's packet counts
    assert rounds[0] == rounds[1] == rounds[2]
    assert set(rounds[0]) == {s.identity.peer_id for s, _ in peers}


async def test_a_replica_far_behind_falls_behind_then_rejoins_the_swarms_round(peers: Peers) -> None:
    (a, xa), (b, xb), (c, xc) = peers  # all three are at step 2 now
    ahead = [(a, xa), (b, xb)]
    for step in (10, 11):  # A and B move on; C hears them but its window stays at 2
        rounds = await one_step(ahead, step)
        assert rounds[0] == rounds[1] and set(rounds[0]) == {a.identity.peer_id, b.identity.peer_id}
    await xc.publish(3, packet(c, 3))
    with pytest.raises(FellBehind) as info:
        await xc.collect(3)  # nobody else is at step 3: C is behind, not alone
    assert info.value.swarm_step >= 10

    # C adopts the swarm's step 13 (as the daemon does after a resync) and publishes masked
    # packets; the announcements of 13 that A and B sent before C's window got there are held.
    step = 13
    for swarm, ex in ahead:
        await ex.publish(step, packet(swarm, step))
    want = {a.identity.peer_id, b.identity.peer_id}

    async def held() -> bool:
        return all(xc._early_notes.newest().get(p, -1) >= step for p in want)

    await eventually(held, 10.0, "C to hold A's and B's announcements of step 13")
    xc.start_warmup(step)
    await xc.publish(step, packet(c, step))
    rounds = [dict(r) for r in await asyncio.gather(xa.collect(step), xb.collect(step), xc.collect(step))]
    assert rounds[0] == rounds[1] == rounds[2] and set(rounds[0]) == want
