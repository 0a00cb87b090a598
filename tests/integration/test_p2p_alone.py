"""A replica that hears nobody, over three REAL p2pd peers on loopback (exchange doc, "Alone").

C's gossip is made deaf (its announcement and manifest handlers drop every message) while A and
B hear C and pull its packets, as when C's p2pd is starved:

1. C applies ``alone_rounds`` rounds of one, then asks its topic's peers which step they are at:
   they are in step with it, so it refuses the next round of one (``RoundUnavailable``, not a
   round of one that would let it run ahead), while A's and B's rounds hold all three packets.
2. When A and B have moved past C's step, C's round of one raises ``FellBehind`` with their step.
3. When every peer in the topic is far behind (paused, dead, syncing), C keeps training alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from distronet.node.exchange.base import RoundUnavailable
from distronet.node.swarm.exchange import AsyncSwarmExchange, ExchangeConfig, FellBehind, manifest_topic
from distronet.node.swarm.manifest_ask import request_newest
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.stack import Swarm
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.packet import seal_packet

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(180)]

RUN = "alone-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(round_deadline_s=1.5, manifest_grace_s=0.2, manifest_wait_s=1.0, pull_timeout_s=10.0)
Peers = list[tuple[Swarm, AsyncSwarmExchange]]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def start(tmp: Path, name: str, boot: tuple[str, ...] = ()) -> tuple[Swarm, AsyncSwarmExchange]:
    identity = Identity.generate()
    identity.save(tmp / name)
    cfg = SwarmConfig(
        identity_path=str(tmp / name), bootstrap=boot, nat_traversal=False, gossip_heartbeat_s=0.2
    )
    swarm = await Swarm.start(identity, cfg, MembershipConfig(run_id=RUN, ttl_s=5.0, dht_wait_timeout_s=1.0))
    return swarm, await AsyncSwarmExchange.create(swarm, CONFIG)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peers]:
    tmp = tmp_path_factory.mktemp("alone")
    out = [await start(tmp, "a")]
    try:
        boot = tuple(await out[0][0].host.maddrs())
        out += [await start(tmp, "b", boot), await start(tmp, "c", boot)]

        async def meshed() -> bool:
            for swarm, ex in out:
                others = {s.host.peer_id for s, _ in out} - {swarm.host.peer_id}
                for topic in (swarm.topic, manifest_topic(RUN)):
                    if not set(await swarm.gossip.topic_peers(topic)) >= others:
                        return False
                if len(ex._subscribed) < 2:  # the exchange's own view of the topic (refreshed each second)
                    return False
            return True

        await eventually(meshed, 15.0, "both gossip topics to reach every peer")
        xc = out[2][1]
        # C goes deaf: what its p2pd delivers is dropped, as if it never arrived
        xc._on_announcement = lambda data, sender: None  # type: ignore[method-assign]
        xc._on_manifest = lambda data, sender: None  # type: ignore[method-assign]
        yield out
    finally:
        for swarm, ex in out:
            await ex.close()
            await swarm.close()


def packet(swarm: Swarm, step: int) -> bytes:
    return seal_packet(swarm.identity, RUN, step, DIGEST, os.urandom(20_000))


async def test_a_deaf_replica_refuses_to_run_ahead_then_falls_behind(peers: Peers) -> None:
    (a, xa), (b, xb), (c, xc) = peers
    everyone = {s.identity.peer_id for s, _ in peers}
    assert CONFIG.alone_rounds == 2
    step, refused = 0, -1
    while refused < 0 and step < 8:
        for swarm, ex in peers:
            await ex.publish(step, packet(swarm, step))
        ra, rb, rc = await asyncio.gather(*(ex.collect(step) for _, ex in peers), return_exceptions=True)
        assert not isinstance(ra, BaseException) and not isinstance(rb, BaseException), (ra, rb)
        assert dict(ra) == dict(rb), step
        if isinstance(rc, RoundUnavailable):
            refused = step
            assert set(ra) == everyone, step  # A and B hear C: all three count
        else:  # a start-up round C settled by asking for A's or B's manifest, or a round of one
            assert not isinstance(rc, BaseException), rc
            assert dict(rc) == dict(ra) or set(rc) == {c.identity.peer_id}, step
        step += 1
    # after two rounds of one in a row C asked A and B, who were at its step: it refused a third
    assert refused >= 2 and not isinstance(rc, FellBehind) and "in step" in str(rc), (refused, rc)
    assert xc.alone_refused == 1 and xc.alone_streak == 2
    assert xa.alone_refused == xb.alone_refused == 0 and xa.alone_streak == xb.alone_streak == 0
    assert await request_newest(c.host.control_path, a.host.peer_id, 2.0) == refused

    swarm_step = refused + 4
    for step in range(refused + 1, swarm_step + 1):  # A and B move on without C
        for swarm, ex in ((a, xa), (b, xb)):
            await ex.publish(step, packet(swarm, step))
        ra, rb = await asyncio.gather(xa.collect(step), xb.collect(step))
        assert dict(ra) == dict(rb) and set(ra) == {a.identity.peer_id, b.identity.peer_id}
    behind = refused + 2
    await xc.publish(behind, packet(c, behind))
    with pytest.raises(FellBehind) as info:  # C asked A and B which step they are at
        await xc.collect(behind)
    assert info.value.swarm_step == swarm_step and "cannot hear the swarm" in str(info.value)


async def test_a_replica_whose_peers_are_far_behind_keeps_training_alone(peers: Peers) -> None:
    (_a, xa), (_b, _xb), (c, xc) = peers  # A and B stay where they are, as if paused
    first = xa._newest + 20
    refused = xc.alone_refused
    for step in range(first, first + 4):
        await xc.publish(step, packet(c, step))
        assert set(await xc.collect(step)) == {c.identity.peer_id}
    assert xc.alone_streak >= 2 and xc.alone_refused == refused
