"""Issue 17 over three REAL p2pd peers: an announcement with a false size does not make a
victim skip honest frames.

B announces a frame it never serves (its pull server stalls), claiming nearly all C can download
by the round's deadline. A then announces an honest 300 kB frame (more than
the budget left beside the full claim). C must still pull A's frame
(one fair share held for B's claim, not the whole claim); on the old accounting C skipped it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from p2p_trio import eventually, trio

from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig
from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.servicer import StreamCall, StreamRoute
from distronet.node.swarm.stack import Swarm
from distronet.protocol.announce import seal_announcement
from distronet.protocol.layout import layout_digest
from distronet.protocol.packet import seal_packet
from distronet.protocol.pull import PULL_REQUEST_BYTES

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

RUN = "false-size-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(round_deadline_s=4.0, manifest_grace_s=0.3, manifest_wait_s=2.0, pull_timeout_s=10.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[list[tuple[Swarm, AsyncSwarmExchange]]]:
    async with trio(tmp_path_factory.mktemp("fsz"), RUN, CONFIG) as out:
        yield out


async def test_a_false_size_does_not_starve_an_honest_frame(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (a, xa), (b, _), (c, xc) = peers
    release = asyncio.Event()

    async def stall(call: StreamCall) -> None:  # B never answers a pull
        await release.wait()

    b.puller.servicer.update(StreamRoute(b.puller.protocol, PULL_REQUEST_BYTES, stall, deadline_s=30.0))
    slow = Bandwidth.from_rates("unlimited", "2mbit")  # 250 kB/s down
    c.bandwidth = c.puller.bandwidth = slow
    try:
        await xc.publish(0, seal_packet(c.identity, RUN, 0, DIGEST, os.urandom(1000)))  # C's round is open
        sent = [0.0]

        async def c_heard_the_lie() -> bool:
            if time.monotonic() - sent[0] > 0.5:  # gossip is best-effort: send again
                sent[0] = time.monotonic()
                left = xc._rounds[0].opened_at + CONFIG.round_deadline_s - sent[0]
                claim = slow.down.affordable(left - 0.6) - 1_000  # fits when it lands, with ~150 kB spare
                lie = seal_announcement(b.identity, RUN, 0, os.urandom(claim))  # B does not hold it
                await b.gossip.publish(b.topic, lie)
            return b.identity.peer_id in xc._rounds[0].pulls

        await eventually(c_heard_the_lie, 5.0, "C to start pulling B's falsely sized frame")
        honest = seal_packet(a.identity, RUN, 0, DIGEST, os.urandom(300_000))
        await xa.publish(0, honest)

        async def c_has_a() -> bool:
            held = xc._rounds[0].frames.get(a.identity.peer_id)
            return held is not None and held[1] == honest

        await eventually(c_has_a, CONFIG.round_deadline_s, "C to pull A's honest frame")
        assert not xc._rounds[0].pulls[b.identity.peer_id].done(), "B's pull must still hold its budget"
        assert xc.skipped_for_budget == 0
    finally:
        release.set()
        b.puller.servicer.update(b.puller.route())
        c.bandwidth = c.puller.bandwidth = Bandwidth.unlimited()
