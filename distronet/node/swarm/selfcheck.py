"""Transport self-check on loopback: ``python -m distronet.node.swarm.selfcheck [--json]``.

Starts three real p2pd nodes and measures, side by side in one run (medians over repeats):
p2pd start time, join time (start → visible in a peer's membership view), stream pull
throughput against a plain asyncio TCP loopback transfer of the same bytes, how close a
budgeted pull runs to its budget, and the time a 3-peer exchange round takes past its deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig, manifest_topic
from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.stack import Swarm
from distronet.protocol.identity import Identity

__all__ = ["main", "measure"]

RUN = "selfcheck"


async def _start(tmp: Path, name: str, boot: tuple[str, ...] = (), bw: Bandwidth | None = None) -> Swarm:
    ident = Identity.generate()
    ident.save(tmp / name)
    cfg = SwarmConfig(
        identity_path=str(tmp / name), bootstrap=boot, nat_traversal=False, gossip_heartbeat_s=0.2
    )
    return await Swarm.start(ident, cfg, MembershipConfig(run_id=RUN, ttl_s=10.0), bandwidth=bw)


async def _until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("self-check condition not reached")
        await asyncio.sleep(0.02)


async def _tcp_seconds(data: bytes) -> float:
    """Seconds to move ``data`` over a plain asyncio TCP loopback connection."""
    done: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(data))
        done.set_result(time.monotonic())
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    start = time.monotonic()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    end = await done
    writer.close()
    server.close()
    await server.wait_closed()
    return end - start


async def measure(repeats: int = 3, payload_mib: int = 16) -> dict[str, float]:
    """Run the checks; returns the figures (seconds, MB/s and ratios)."""
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t = time.monotonic()
        a = await _start(tmp, "a", bw=Bandwidth.from_rates("unlimited", "unlimited"))
        out["p2pd_first_start_s"] = time.monotonic() - t
        boot = tuple(await a.host.maddrs())
        nodes = [a]
        try:
            joins = []
            for name in ("b", "c"):
                t = time.monotonic()
                n = await _start(tmp, name, boot)
                nodes.append(n)
                pid = n.identity.peer_id_b58
                await _until(lambda pid=pid: _sees(a, pid))  # type: ignore[misc]
                joins.append(time.monotonic() - t)
            out["join_to_visible_s"] = statistics.median(joins)
            data = os.urandom(payload_mib * 2**20)
            digest = a.puller.store.put(data, step=0)
            pulls, tcps = [], []
            for i in range(repeats):
                puller = nodes[1 + i % 2].puller
                puller.store.evict_before(1)
                t = time.monotonic()
                await puller.fetch(a.host.peer_id, digest, max_bytes=len(data), timeout=120.0)
                pulls.append(time.monotonic() - t)
                tcps.append(await _tcp_seconds(data))
            mb = len(data) / 1e6
            out["pull_MBps"] = mb / statistics.median(pulls)
            out["tcp_MBps"] = mb / statistics.median(tcps)
            out["pull_over_tcp"] = out["pull_MBps"] / out["tcp_MBps"]
            budget = Bandwidth.from_rates("80mbit", "unlimited")  # 10 MB/s
            a.bandwidth = a.puller.bandwidth = budget
            small = data[: 8 * 2**20]
            d2 = a.puller.store.put(small, step=1)
            t = time.monotonic()
            await nodes[1].puller.fetch(a.host.peer_id, d2, max_bytes=len(small), timeout=120.0)
            took = time.monotonic() - t
            out["budgeted_rate_over_budget"] = len(small) / took / budget.up.rate  # includes the burst
            out["budgeted_rate_excl_burst_over_budget"] = (
                (len(small) - budget.up.burst) / took / budget.up.rate
            )
            out["exchange_round_past_deadline_s"] = await _rounds(nodes, repeats)
        finally:
            for n in nodes:
                await n.close()
    return out


async def _sees(node: Swarm, peer_b58: str) -> bool:
    return peer_b58 in await node.membership.members()


async def _rounds(nodes: list[Swarm], repeats: int) -> float:
    cfg = ExchangeConfig(round_deadline_s=0.5, manifest_grace_s=0.2)
    exs = [await AsyncSwarmExchange.create(n, cfg) for n in nodes]
    try:

        async def meshed() -> bool:
            for n in nodes:
                others = {m.host.peer_id for m in nodes} - {n.host.peer_id}
                for topic in (n.topic, manifest_topic(RUN)):
                    if not set(await n.gossip.topic_peers(topic)) >= others:
                        return False
            return True

        await _until(meshed)
        extra = []
        for step in range(repeats + 1):
            t = time.monotonic()
            for ex in exs:
                await ex.publish(step, os.urandom(100_000))
            rounds = await asyncio.gather(*(ex.collect(step) for ex in exs))
            assert all(r == rounds[0] and len(r) == len(nodes) for r in rounds)
            if step:  # the first round also pays for connection set-up
                extra.append(time.monotonic() - t - cfg.round_deadline_s)
        return statistics.median(extra)
    finally:
        for ex in exs:
            await ex.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    figures = asyncio.run(measure(args.repeats))
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for k, v in figures.items():
            print(f"{k:40s} {v:10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
