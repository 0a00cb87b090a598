"""A round manifest listing a frame that no live peer holds, over four REAL p2pd peers: D seals
and gossips a manifest listing A's and B's frames and its own, which it never let anyone pull,
then dies (SIGKILL of its p2pd). A, B and C cannot fill that frame from anyone — D is gone, the
others answer that they do not have it — and apply the round without it, all the same set,
instead of failing it on every replica (``exchange`` module doc, "A frame nobody holds"). And a
peer whose only other peer dies that way trains on alone instead of failing the round."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from p2p_trio import eventually, start_peer, trio

from distronet.node.exchange.base import RoundUnavailable
from distronet.node.exchange.swarm import ExchangeConfig, manifest_topic
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.manifest import open_manifest, seal_manifest
from distronet.protocol.packet import seal_packet

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(240)]

RUN = "dead-frame-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(
    round_deadline_s=0.5, manifest_grace_s=0.2, manifest_wait_s=0.5, pull_timeout_s=10.0, retention=4
)


async def test_a_frame_held_by_no_live_peer_is_left_out_by_every_replica(tmp_path: Path) -> None:
    async with trio(tmp_path, RUN, CONFIG) as peers:
        a, b = peers[0][0], peers[1][0]
        d, xd = await start_peer(tmp_path, "d", RUN, CONFIG, tuple(await a.host.maddrs()))
        try:
            topic = manifest_topic(RUN)

            async def d_meshed() -> bool:
                return set(await d.gossip.topic_peers(topic)) >= {s.host.peer_id for s, _ in peers}

            await eventually(d_meshed, 15.0, "D to reach A, B and C on the manifest topic")
            step = 0
            frames = {s.identity.peer_id: seal_packet(s.identity, RUN, step, DIGEST, os.urandom(20_000))
                      for s in (a, b, d)}  # fmt: skip
            for s in (a, b):  # A and B hold their own frames (as after a publish); D's stays with D
                s.puller.store.put(frames[s.identity.peer_id], step)
            entries = [(p, hashlib.sha256(f).digest(), len(f)) for p, f in frames.items()]
            manifest = seal_manifest(d.identity, RUN, step, entries)
            for _, ex in peers:
                ex._round(step, local=True)  # the round is open where the manifest arrives
            await xd._gossip(xd._manifest_gossip, topic, manifest)

            async def everyone_has_it() -> bool:
                return all(d.identity.peer_id in ex._rounds[step].manifests for _, ex in peers)

            await eventually(everyone_has_it, 15.0, "D's manifest to reach A, B and C")
            d.host.kill()  # D dies with the only copy of its frame

            got = await asyncio.wait_for(asyncio.gather(*(ex.collect(step) for _, ex in peers)), 60.0)
            expected = {p: f for p, f in frames.items() if p != d.identity.peer_id}
            for (_, ex), rnd in zip(peers, got, strict=True):
                assert dict(rnd) == expected  # the same accepted set everywhere, D's frame left out
                assert ex.dead_frames == 1
                assert ex._rounds[step].adopted is not None
                assert ex._rounds[step].adopted.leader == d.identity.peer_id
        finally:
            await xd.close()
            await d.close()


async def test_the_last_live_peer_applies_the_round_alone(tmp_path: Path) -> None:
    """Two peers; D seals and gossips a manifest listing A's frame and its own, never pulled, and
    dies. Nobody can answer "not here" any more: A, alone in the run's topic, applies the round
    with its own frame (it used to fail it, then find no peer to resync from, and exit)."""
    a, xa = await start_peer(tmp_path, "a", RUN, CONFIG)
    try:
        d, xd = await start_peer(tmp_path, "d", RUN, CONFIG, tuple(await a.host.maddrs()))
        try:
            topic = manifest_topic(RUN)

            async def meshed() -> bool:
                return d.host.peer_id in await a.gossip.topic_peers(topic) and bool(
                    await a.gossip.topic_peers(a.topic)
                )

            await eventually(meshed, 15.0, "A and D to see each other on both topics")
            step = 0
            frames = {s.identity.peer_id: seal_packet(s.identity, RUN, step, DIGEST, os.urandom(20_000))
                      for s in (a, d)}  # fmt: skip
            a.puller.store.put(frames[a.identity.peer_id], step)
            entries = [(p, hashlib.sha256(f).digest(), len(f)) for p, f in frames.items()]
            xa._round(step, local=True)
            await xd._gossip(xd._manifest_gossip, topic, seal_manifest(d.identity, RUN, step, entries))

            async def a_has_it() -> bool:
                return d.identity.peer_id in xa._rounds[step].manifests

            await eventually(a_has_it, 15.0, "D's manifest to reach A")
            d.host.kill()

            async def a_alone() -> bool:
                return not await a.gossip.topic_peers(a.topic)

            await eventually(a_alone, 15.0, "A's p2pd to drop D from the topic")
            got = await asyncio.wait_for(xa.collect(step), 60.0)
            assert dict(got) == {a.identity.peer_id: frames[a.identity.peer_id]}
            assert xa.dead_frames == 1
        finally:
            await xd.close()
            await d.close()
    finally:
        await xa.close()
        await a.close()


async def test_a_peer_whose_topic_still_has_members_does_not_go_it_alone(tmp_path: Path) -> None:
    """A manifest of a producer and leader nobody can reach (a ghost), while B and C are alive in
    the topic: every source of the ghost's frame is unreachable, but A is not the last live peer
    (A may be the one cut off), so nothing is proven and the round fails."""
    async with trio(tmp_path, RUN, CONFIG) as peers:
        a, xa = peers[0]
        ghost = Identity.generate()
        step = 0
        frames = {a.identity.peer_id: seal_packet(a.identity, RUN, step, DIGEST, os.urandom(5_000)),
                  ghost.peer_id: seal_packet(ghost, RUN, step, DIGEST, os.urandom(5_000))}  # fmt: skip
        a.puller.store.put(frames[a.identity.peer_id], step)
        entries = [(p, hashlib.sha256(f).digest(), len(f)) for p, f in frames.items()]
        manifest = open_manifest(
            seal_manifest(ghost, RUN, step, entries), run_id=RUN, max_entries=16, max_size=2**20
        )
        state = xa._round(step, local=True)
        with pytest.raises(RoundUnavailable):
            await asyncio.wait_for(xa._fill(step, state, manifest), 60.0)
        assert xa.dead_frames == 0
