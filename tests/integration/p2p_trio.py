"""Shared by the tests over real p2pd peers (test_p2p_exchange, _warmup, _alone; _swarm): start a
peer (its own p2pd, DHT membership and exchange), three of them meshed on both gossip topics,
and waiting on a condition with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig, manifest_topic
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.stack import Swarm
from distronet.protocol.identity import Identity

Peer = tuple[Swarm, AsyncSwarmExchange]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def start_peer(
    tmp: Path, name: str, run: str, config: ExchangeConfig, boot: tuple[str, ...] = ()
) -> Peer:
    """A peer of ``run`` with a fresh identity saved under ``tmp / name``, bootstrapping from ``boot``."""
    identity = Identity.generate()
    identity.save(tmp / name)
    cfg = SwarmConfig(
        identity_path=str(tmp / name), bootstrap=boot, nat_traversal=False, gossip_heartbeat_s=0.2
    )
    swarm = await Swarm.start(identity, cfg, MembershipConfig(run_id=run, ttl_s=5.0, dht_wait_timeout_s=1.0))
    return swarm, await AsyncSwarmExchange.create(swarm, config)


@contextlib.asynccontextmanager
async def trio(tmp: Path, run: str, config: ExchangeConfig) -> AsyncIterator[list[Peer]]:
    """Peers a, b and c, each seeing the other two on both gossip topics (and in its exchange's
    own view of the announcement topic); closed on exit."""
    out = [await start_peer(tmp, "a", run, config)]
    try:
        boot = tuple(await out[0][0].host.maddrs())
        out += [await start_peer(tmp, "b", run, config, boot), await start_peer(tmp, "c", run, config, boot)]

        async def meshed() -> bool:
            for swarm, ex in out:
                others = {s.host.peer_id for s, _ in out} - {swarm.host.peer_id}
                for topic in (swarm.topic, manifest_topic(run)):
                    if not set(await swarm.gossip.topic_peers(topic)) >= others:
                        return False
                if len(ex._subscribed) < len(others):  # refreshed each second
                    return False
            return True

        await eventually(meshed, 15.0, "both gossip topics to reach every peer")
        yield out
    finally:
        for swarm, ex in out:
            await ex.close()
            await swarm.close()
