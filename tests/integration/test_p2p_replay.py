"""Replaying rounds the swarm decided (``AsyncSwarmExchange.replay``, ``node/catchup/replay.py``) over
three REAL p2pd peers: A and B run rounds while C computes nothing; C then asks A which accepted
set it applied for each round and pulls those frames — the very rounds A and B applied — until A
answers that the next round is not decided yet. A round older than A's window is refused."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from p2p_trio import Peer, trio

from distronet.node.exchange.base import RoundUnavailable
from distronet.node.exchange.manifest_ask import ask_newest
from distronet.node.exchange.swarm import ExchangeConfig
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.packet import seal_packet

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]

RUN = "replay-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(
    round_deadline_s=0.5, manifest_grace_s=0.2, manifest_wait_s=0.5, pull_timeout_s=10.0, retention=4
)
Peers = list[Peer]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Peers]:
    async with trio(tmp_path_factory.mktemp("replay"), RUN, CONFIG) as out:
        yield out


async def test_a_replica_replays_the_rounds_its_peers_decided(peers: Peers) -> None:
    (a, xa), (b, xb), (c, xc) = peers
    assert await ask_newest(c.host.control_path, a.host.peer_id, 2.0) == -1  # no step yet
    decided = []
    for step in range(6):
        for swarm, ex in ((a, xa), (b, xb)):
            await ex.publish(step, seal_packet(swarm.identity, RUN, step, DIGEST, os.urandom(20_000)))
        got = await asyncio.gather(xa.collect(step), xb.collect(step))
        assert dict(got[0]) == dict(got[1])
        decided.append(dict(got[0]))
    assert await ask_newest(c.host.control_path, a.host.peer_id, 2.0) == 5
    assert set(decided[5]) == {a.identity.peer_id, b.identity.peer_id}

    stranger = Identity.generate().peer_id  # not in the swarm: no answer, the next source is asked
    source = [stranger, a.identity.peer_id]
    with pytest.raises(RoundUnavailable, match="older than"):
        await xc.replay(1, source, 2.0)  # A's window (retention 4) starts at step 2
    for step in range(2, 6):
        rnd = await xc.replay(step, source, 2.0)
        assert rnd is not None and rnd.step == step
        assert dict(rnd) == decided[step], step  # the accepted set A and B applied, byte for byte
    newest = xc._newest
    assert await xc.replay(6, source, 2.0) is None  # A has not decided round 6: C is at the tip
    assert 6 not in xc._rounds and xc._newest == newest  # the probe opened no round (its deadline
    # would have run from the probe, not from C's own publish)
    with pytest.raises(RoundUnavailable, match="none of 1 peer"):
        await xc.replay(7, [stranger], 1.0)  # nobody answered: not taken for the tip
    assert await xc.collect(5) is xc._rounds[5].decided  # what it replayed is its decided round
