"""CPU per pull and per gossip call through two real p2pd on loopback (one process, both nodes).

Usage: ``SZ=500 .venv/bin/python docs/scripts/network_pull_cost.py [N]`` (N requests, default 200;
SZ payload bytes, default 50000). Prints, per request, the CPU of both p2pd daemons (minus their
idle rate, measured first) and of this Python process (both sides' event-loop work), and wall
time: pulls of distinct payloads from B, gossip publishes, list-peers calls.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
import tempfile
import time

import psutil

from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.stack import Swarm
from distronet.protocol.identity import Identity


def cpu() -> tuple[float, float]:
    """(CPU seconds of our children — the daemons —, of this process)."""
    me, kids = psutil.Process(), 0.0
    for k in me.children(recursive=True):
        try:
            c = k.cpu_times()
        except psutil.Error:
            continue
        kids += c.user + c.system
    c = me.cpu_times()
    return kids, c.user + c.system


async def start(tmp: pathlib.Path, name: str, boot: tuple[str, ...] = ()) -> Swarm:
    ident = Identity.generate()
    ident.save(tmp / name)
    cfg = SwarmConfig(
        identity_path=str(tmp / name), bootstrap=boot, nat_traversal=False, gossip_heartbeat_s=0.5
    )
    return await Swarm.start(ident, cfg, MembershipConfig(run_id="x", ttl_s=30.0, dht_wait_timeout_s=1.0))


async def main(n: int, size: int) -> None:
    tmp = pathlib.Path(tempfile.mkdtemp())
    a = await start(tmp, "a")
    b = await start(tmp, "b", tuple(await a.host.maddrs()))
    await asyncio.sleep(8)  # past the daemons' start-up work
    shas = [b.puller.store.put(os.urandom(size), 1) for _ in range(n)]
    k0, m0, t0 = *cpu(), time.monotonic()
    await asyncio.sleep(3)
    k1, m1, t1 = *cpu(), time.monotonic()
    idle = (k1 - k0) / (t1 - t0)
    print(f"idle: daemons {idle * 1e3:.2f} ms/s, python {(m1 - m0) / (t1 - t0) * 1e3:.2f} ms/s")

    async def pulls() -> None:
        for sha in shas:
            await a.puller.fetch(b.host.peer_id, sha, max_bytes=10**7, timeout=10)

    async def publishes() -> None:
        for _ in range(n):
            await a.gossip.publish(a.topic, b"x" * 300)

    async def lists() -> None:
        for _ in range(n):
            await a.gossip.topic_peers(a.topic)

    for what, run in ((f"pull {size} B", pulls), ("publish 300 B", publishes), ("list peers", lists)):
        k0, m0, t0 = *cpu(), time.monotonic()
        await run()
        k1, m1, t1 = *cpu(), time.monotonic()
        daemons = ((k1 - k0) - idle * (t1 - t0)) / n
        print(f"{what}: daemons {daemons * 1e3:.3f} ms, python {(m1 - m0) / n * 1e3:.3f} ms, "
              f"wall {(t1 - t0) / n * 1e3:.2f} ms per call")  # fmt: skip
    await a.close()
    await b.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200, int(os.environ.get("SZ", "50000"))))
