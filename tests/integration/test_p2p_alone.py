"""A replica that hears nobody, over three REAL p2pd peers (exchange doc "Hearing nobody"; swarm.alone).

C's gossip is made deaf (its announcement and manifest handlers drop every message) while A and
B hear C and pull its packets, as when C's p2pd is starved. Steps (one module, in order):

1. In step with A and B, C still applies the swarm's rounds (its own packet included): it asks
   the producers of its last accepted sets for each round's manifest. Nothing is a round of one.
2. C runs ahead of A and B (rounds of one: it knows no producer but itself). It then asks which
   step they are at, waits for them while they are in step (8 steps or fewer behind), and when
   they reach its step it adopts their manifest of that round: the same accepted set as theirs.
3. C far ahead of A and B (as if they were paused): it trains on alone, asking only once.
4. A and B past C's step while C knows nobody: ``FellBehind`` with their step.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from p2p_trio import eventually, trio

from distronet.node.exchange.manifest_ask import request_newest
from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig, FellBehind
from distronet.node.swarm.stack import Swarm
from distronet.protocol.layout import layout_digest
from distronet.protocol.packet import seal_packet

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]

RUN = "alone-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(round_deadline_s=1.5, manifest_grace_s=0.2, manifest_wait_s=0.5, pull_timeout_s=10.0)
Peers = list[tuple[Swarm, AsyncSwarmExchange]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peers]:
    async with trio(tmp_path_factory.mktemp("alone"), RUN, CONFIG) as out:
        xc = out[2][1]
        # C goes deaf: what its p2pd delivers is dropped, as if it never arrived
        xc._on_announcement = lambda data, sender: None  # type: ignore[method-assign]
        xc._on_manifest = lambda data, sender: None  # type: ignore[method-assign]
        yield out


def packet(swarm: Swarm, step: int) -> bytes:
    return seal_packet(swarm.identity, RUN, step, DIGEST, os.urandom(20_000))


async def advance(peers: Peers, steps: range) -> list[dict[bytes, bytes]]:
    """``peers`` publish and collect each of ``steps`` together; the last step's accepted sets."""
    rounds: list[dict[bytes, bytes]] = []
    for step in steps:
        for swarm, ex in peers:
            await ex.publish(step, packet(swarm, step))
        rounds = [dict(r) for r in await asyncio.gather(*(ex.collect(step) for _, ex in peers))]
        names = {s.identity.peer_id: "ABC"[i] for i, (s, _) in enumerate(peers)}
        assert all(r == rounds[0] for r in rounds), (step, [sorted(names[p] for p in r) for r in rounds])
    return rounds


async def test_a_deaf_replica_in_step_applies_the_swarms_rounds(peers: Peers) -> None:
    c = peers[2][0]
    everyone = {s.identity.peer_id for s, _ in peers}
    whole = 0
    for step in range(5):
        rounds = await advance(peers, range(step, step + 1))  # identical on all three
        assert c.identity.peer_id in rounds[0], step  # A and B hear C; C asks for their manifests
        # (a round of C's packet alone is one C led, ranked first, before anyone else had sealed it)
        whole += set(rounds[0]) == everyone
    assert whole >= 1


async def test_a_deaf_replica_ahead_waits_for_peers_in_step_and_adopts_their_round(peers: Peers) -> None:
    (a, xa), (b, xb), (c, xc) = peers  # all three at step 4
    ahead = 9
    for step in (7, 8):  # C runs ahead: rounds of one (nobody has a manifest of these to give)
        await xc.publish(step, packet(c, step))
        assert set(await xc.collect(step)) == {c.identity.peer_id}, step
    await xc.publish(ahead, packet(c, ahead))  # two rounds of one before it: C knows nobody
    waiting = asyncio.ensure_future(xc.collect(ahead))  # asks A and B (at 4): in step, so it waits

    async def waits() -> bool:
        return xc.alone.waits == 1

    await eventually(waits, 10.0, "C to wait for A and B")
    assert not waiting.done()
    rounds = await advance([(a, xa), (b, xb)], range(5, ahead + 1))  # A and B reach C's step
    got = dict(await asyncio.wait_for(waiting, 30.0))
    assert got == rounds[0]  # C adopted their manifest of that step: the swarm's accepted set
    assert await request_newest(c.host.control_path, a.host.peer_id, 2.0) == ahead


async def test_a_replica_whose_peers_are_far_behind_keeps_training_alone(peers: Peers) -> None:
    (_a, xa), (_b, _xb), (c, xc) = peers  # A and B at step 9
    first = xa._newest + 20
    waits = xc.alone.waits
    for step in range(first, first + 4):
        await xc.publish(step, packet(c, step))
        assert set(await xc.collect(step)) == {c.identity.peer_id}, step
    assert xc.alone.streak >= 2 and xc.alone.waits == waits
    assert xc.alone.quiet_until > time.monotonic()  # asked once, found nobody near: on alone


async def test_a_replica_that_knows_nobody_and_is_behind_its_peers_falls_behind(peers: Peers) -> None:
    (a, xa), (b, xb), (c, xc) = peers
    jump = xc._newest + 10
    await advance([(a, xa), (b, xb)], range(jump, jump + 1))  # A and B jump past C
    xc.alone.quiet_until = 0.0  # the recheck period of the previous test is over
    behind = xc._newest + 1
    await xc.publish(behind, packet(c, behind))
    with pytest.raises(FellBehind) as info:
        await xc.collect(behind)
    assert info.value.swarm_step == jump and "cannot hear the swarm" in str(info.value)
