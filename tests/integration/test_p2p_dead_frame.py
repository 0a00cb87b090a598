"""A round manifest listing a frame that no live peer holds, over four REAL p2pd peers: D seals
and gossips a manifest listing A's and B's frames and its own, which it never let anyone pull,
then dies (SIGKILL of its p2pd). A, B and C cannot fill that frame from anyone — D is gone, the
others answer that they do not have it — and apply the round without it, all the same set,
instead of failing it on every replica (``exchange`` module doc, "A frame nobody holds")."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from p2p_trio import eventually, start_peer, trio

from distronet.node.swarm.exchange import ExchangeConfig, manifest_topic
from distronet.node.swarm.manifest import seal_manifest
from distronet.protocol.layout import layout_digest
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
