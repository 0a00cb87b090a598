"""The libp2p Exchange over three REAL p2pd peers on loopback: identical accepted sets per step.

Each peer publishes a real sealed step packet per step; all three collect concurrently and must
get the same manifest and byte-identical frames, and a round closes before its deadline once
every producer's frame is in (after two rounds that taught the replica who produces). Then one
peer is SIGKILLed and the other two keep exchanging without it, and the synchronous adapter is
driven from worker threads.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from p2p_trio import eventually, start_peer, trio

from distronet.node.exchange.base import ExchangeError, Round
from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig, manifest_topic
from distronet.node.exchange.sync import SwarmExchange
from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.stack import Swarm
from distronet.protocol.announce import seal_announcement
from distronet.protocol.errors import RejectCode
from distronet.protocol.layout import layout_digest
from distronet.protocol.manifest import leader_rank
from distronet.protocol.packet import open_packet, seal_packet

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

RUN = "xchg-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(round_deadline_s=1.0, manifest_grace_s=0.3, manifest_wait_s=2.0, pull_timeout_s=10.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[list[tuple[Swarm, AsyncSwarmExchange]]]:
    async with trio(tmp_path_factory.mktemp("xchg"), RUN, CONFIG) as out:
        yield out


def packet(swarm: Swarm, step: int) -> bytes:
    return seal_packet(swarm.identity, RUN, step, DIGEST, os.urandom(20_000))


async def test_three_peers_get_identical_accepted_sets_for_several_steps(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    took = []
    for step in range(3):
        sent = {swarm.identity.peer_id: packet(swarm, step) for swarm, _ in peers}
        start = time.monotonic()
        for swarm, ex in peers:
            await ex.publish(step, sent[swarm.identity.peer_id])
        with pytest.raises(ExchangeError):
            await peers[0][1].publish(step, b"again")
        rounds: list[Round] = await asyncio.gather(*(ex.collect(step) for _, ex in peers))
        took.append(time.monotonic() - start)
        assert all(r.manifest == tuple(sorted(sent)) for r in rounds), step
        assert all(dict(r) == sent for r in rounds)
        for frame in rounds[0].values():  # the bytes are real, verifiable packets
            assert open_packet(frame, run_id=RUN, layout_digest=DIGEST).step == step
    # steps 0 and 1 wait for the deadline; step 2 closes once every producer's frame is in
    assert took[0] >= CONFIG.round_deadline_s and took[2] < CONFIG.round_deadline_s, took
    assert all(ex.closed_early >= 1 for _, ex in peers)
    stats = peers[0][1].stats
    assert stats.packets_up == 3 and stats.packets_down >= 6
    assert stats.bytes_up >= 20_000  # others pulled our frames through our upload budget


async def test_hostile_gossip_is_rejected_without_moving_the_window(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (_, xa), (b, _), (c, _) = peers
    far = seal_announcement(b.identity, RUN, 10**12, b"x" * 100)
    forged = seal_announcement(c.identity, RUN, 3, b"y" * 100)  # relayed by B under C's name
    before = dict(xa.rejected)
    last_sent = [-1.0]

    async def both_rejected() -> bool:
        stale = xa.rejected[RejectCode.STALE_STEP] > before.get(RejectCode.STALE_STEP, 0)
        wrong = xa.rejected[RejectCode.WRONG_PEER] > before.get(RejectCode.WRONG_PEER, 0)
        if not (stale and wrong) and time.monotonic() - last_sent[0] > 1.0:
            last_sent[0] = time.monotonic()  # gossipsub is best-effort: send again, once a second
            await b.gossip.publish(b.topic, far)
            await b.gossip.publish(b.topic, forged)
        return stale and wrong

    await eventually(both_rejected, 10.0, "A to reject both announcements")
    assert 10**12 not in xa._rounds and max(xa._rounds) < 10


async def test_download_budget_forces_a_subset_yet_replicas_agree(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (_, _), (_, _), (c, xc) = peers
    ids = [s.identity.peer_id for s, _ in peers]
    # A step led by A or B, whose downloads are unlimited: a round led by the slow C holds only
    # what C could afford by the deadline, its own frame alone on a loaded machine (seen in CI).
    first = max(ex._newest for _, ex in peers) + 1
    step = next(t for t in range(first, first + 400) if min(ids, key=lambda p: leader_rank(t, p)) != ids[2])
    slow = Bandwidth.from_rates("unlimited", "100kbit")  # 12.5 KB/s down, 16 KiB burst
    c.bandwidth = c.puller.bandwidth = slow
    try:
        skipped = xc.skipped_for_budget
        sent = {s.identity.peer_id: packet(s, step) for s, _ in peers}
        start = time.monotonic()
        for swarm, ex in peers:
            await ex.publish(step, sent[swarm.identity.peer_id])
        rounds = await asyncio.gather(*(ex.collect(step) for _, ex in peers))
        elapsed = time.monotonic() - start
        assert rounds[0] == rounds[1] == rounds[2] and len(rounds[0]) >= 2
        assert all(rounds[0][p] == sent[p] for p in rounds[0])
        assert xc.skipped_for_budget > skipped  # it could not afford both frames by the deadline
        assert slow.down.total_bytes <= slow.down.burst + slow.down.rate * elapsed
    finally:
        c.bandwidth = c.puller.bandwidth = Bandwidth.unlimited()


async def test_replica_that_missed_the_manifest_gossip_asks_the_leader(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    ids = [s.identity.peer_id for s, _ in peers]
    first = max(ex._newest for _, ex in peers) + 1
    step = next(t for t in range(first, first + 400) if min(ids, key=lambda p: leader_rank(t, p)) != ids[1])
    leader = min(ids, key=lambda p: leader_rank(step, p))
    _, xb = peers[1]
    xb._on_manifest = lambda data, sender: None  # type: ignore[method-assign]  # B hears no manifest gossip
    try:
        sent = {s.identity.peer_id: packet(s, step) for s, _ in peers}
        for swarm, ex in peers:
            await ex.publish(step, sent[swarm.identity.peer_id])
        rounds = await asyncio.gather(*(ex.collect(step) for _, ex in peers))
        assert rounds[0] == rounds[1] == rounds[2] and dict(rounds[1]) == sent
        assert leader in xb._rounds[step].manifests  # fetched straight from the leader
    finally:
        del xb._on_manifest


async def test_a_late_producer_that_ranks_first_leads_every_replica(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    """C produced in the round before, then announces ``step`` only after A and B froze it (their
    deadline passed) and after their manifest reached it; C ranks first. Before the fix, A and B
    adopted the best manifest among the producers they had heard ({A, B}) at once, while C sealed
    and applied its own ({A, B, C}): two accepted sets. Now A and B wait for C (a recent
    producer ranked above their manifest), and C, late, seals the entries it already holds, so
    every replica applies {A, B}."""
    (a, xa), (b, xb), (c, xc) = peers
    ids = [s.identity.peer_id for s, _ in peers]
    first = max(ex._newest for _, ex in peers) + 2
    step = next(t for t in range(first, first + 400) if min(ids, key=lambda p: leader_rank(t, p)) == ids[2])
    before = {s.identity.peer_id: packet(s, step - 1) for s, _ in peers}
    for swarm, ex in peers:
        await ex.publish(step - 1, before[swarm.identity.peer_id])
    await asyncio.gather(*(ex.collect(step - 1) for _, ex in peers))

    sent = {s.identity.peer_id: packet(s, step) for s, _ in peers}
    await xa.publish(step, sent[a.identity.peer_id])
    await xb.publish(step, sent[b.identity.peer_id])
    collecting = [asyncio.ensure_future(ex.collect(step)) for ex in (xa, xb)]

    async def c_holds_the_manifest_of_a_or_b() -> bool:
        held = xc._rounds.get(step)
        return held is not None and bool(held.manifests)

    await eventually(c_holds_the_manifest_of_a_or_b, 10.0, "A's or B's manifest to reach C")
    assert all(c.identity.peer_id not in ex._rounds[step].announced for ex in (xa, xb))
    assert not any(t.done() for t in collecting)  # A and B wait for C, who ranks first
    followed = xc.followed
    await xc.publish(step, sent[c.identity.peer_id])
    rounds = await asyncio.gather(*collecting, xc.collect(step))
    assert rounds[0].manifest == rounds[1].manifest == rounds[2].manifest, [r.manifest for r in rounds]
    assert dict(rounds[0]) == {p: sent[p] for p in ids[:2]}  # C's late frame is out everywhere
    assert xc.followed == followed + 1
    assert all(ex._rounds[step].decided is not None for _, ex in peers)


async def test_killed_peer_is_left_out_and_the_rest_stay_identical(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (a, xa), (b, xb), (c, _) = peers
    c.host.kill()
    step = max(xa._newest, xb._newest) + 1  # C produced in the round before: A and B wait for it or ask
    sent = {s.identity.peer_id: packet(s, step) for s in (a, b)}
    await xa.publish(step, sent[a.identity.peer_id])
    await xb.publish(step, sent[b.identity.peer_id])
    ra, rb = await asyncio.gather(xa.collect(step), xb.collect(step))
    assert dict(ra) == dict(rb) == sent

    # the synchronous adapter from worker threads, as the trainer calls it
    loop = asyncio.get_running_loop()
    sa, sb = SwarmExchange(xa, loop), SwarmExchange(xb, loop)
    with pytest.raises(ExchangeError):
        sa.collect(step)  # from the loop's own thread: refused, not deadlocked
    step += 3  # past C's rounds
    await asyncio.gather(
        asyncio.to_thread(sa.publish, step, packet(a, step)),
        asyncio.to_thread(sb.publish, step, packet(b, step)),
    )
    ra, rb = await asyncio.gather(asyncio.to_thread(sa.collect, step), asyncio.to_thread(sb.collect, step))
    assert ra == rb and len(ra) == 2


async def test_newcomer_is_in_the_accepted_set_within_10_s_of_starting(
    peers: list[tuple[Swarm, AsyncSwarmExchange]], tmp_path: Path
) -> None:
    (a, xa), (b, xb), _ = peers  # C was killed above
    started = time.monotonic()
    d, xd = await start_peer(tmp_path, "d", RUN, CONFIG, tuple(await a.host.maddrs()))
    try:

        async def d_ready() -> bool:
            want = {a.host.peer_id, b.host.peer_id}
            topics = (d.topic, manifest_topic(RUN))
            return all([set(await d.gossip.topic_peers(t)) >= want for t in topics])

        await eventually(d_ready, 10.0, "the newcomer's gossip mesh")
        step = max(xa._newest, xb._newest) + 1
        sent = {s.identity.peer_id: packet(s, step) for s in (a, b, d)}
        for s, ex in ((a, xa), (b, xb), (d, xd)):
            await ex.publish(step, sent[s.identity.peer_id])
        rounds = await asyncio.gather(xa.collect(step), xb.collect(step), xd.collect(step))
        join_to_first_accept = time.monotonic() - started
        assert rounds[0] == rounds[1] == rounds[2] and d.identity.peer_id in rounds[0]
        assert join_to_first_accept <= 10.0
        print(f"join_to_first_accept_s={join_to_first_accept:.2f}")
    finally:
        await xd.close()
        await d.close()
