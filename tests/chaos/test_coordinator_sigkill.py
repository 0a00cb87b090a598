"""SIGKILL the real coordinator process under load, restart it on the same SQLite file:
nothing acknowledged is lost, and leases and the ledger continue where they were.

Steps:
 1. start `distro-coordinator serve --run run.toml` (manifest by path) as a real process;
 2. 100 nodes (the node's real client library) join, lease, renew, complete, heartbeat and
    send each other signed receipts, recording every answer they got;
 3. after 250 acknowledged completions, SIGKILL the process while requests are in flight;
 4. restart it on the same data folder (ten nodes hold a lease taken before the load, so
    renewal is tested whatever the kill interrupted): every acknowledged completion is DONE and credited
    to its node, every acknowledged lease renews with its old token, every node's ledger is
    at least what it was told (at most one in-flight completion more);
 5. the nodes finish the run (their queued reports replay by themselves): every shard done
    exactly once, the ledger adds up; SIGTERM ends the process cleanly (exit 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from distronet.node.daemon.coordinator_client import (
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorUnreachable,
    Lease,
    sign_receipt,
)
from distronet.protocol.identity import Identity

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
SHARDS, NODES, KILL_AFTER, PARKED = 1000, 100, 250, 10


def _write_run(tmp: Path) -> Path:
    shards = [
        {"id": f"s{i:04d}", "path": f"s{i:04d}.bin", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(SHARDS)
    ]
    (tmp / "data").mkdir()
    (tmp / "data" / "manifest.json").write_text(
        json.dumps({"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards})
    )
    run = tmp / "run.toml"
    run.write_text(  # trusted completions: this test sends no receipts
        'id = "chaos"\n[data]\nmanifest = "data/manifest.json"\nlease_ttl_s = 600\n[credit]\nmin_steps = 0\n'
    )
    return run


def _start(tmp: Path, run: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "port"
    port_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "distronet.coordinator.cli", "serve", "--port", "0"]
    cmd += ["--port-file", str(port_file), "--data-dir", str(tmp / "state"), "--operator-token", "t"]
    cmd += [
        "--run",
        str(run),
        "--log-level",
        "WARNING",
        "--ip-rate",
        "1e6",
        "--ip-burst",
        "1e6",
        "--max-conns-per-ip",
        "1000",
    ]  # one observer IP (and every node on it)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert proc.poll() is None, "the coordinator exited at start"
        assert time.monotonic() < deadline, "the coordinator did not start within 60 s"
        time.sleep(0.02)
    return proc, f"http://127.0.0.1:{port_file.read_text()}"


class Node:
    def __init__(self, url: str) -> None:
        self.ident = Identity.generate()
        self.client = CoordinatorClient(
            url, "chaos", self.ident, timeout_s=5, retry_min_s=0.05, retry_max_s=0.3
        )
        self.held: dict[int, Lease] = {}  # acknowledged, not completed
        self.parked: dict[int, Lease] = {}  # leased before the load, held through the kill
        self.credited: set[int] = set()  # acknowledged credited completions
        self.receipts_ok = 0
        self.step = 0


async def _work(node: Node, peers: list[Node], stop: Callable[[], bool]) -> None:
    """One node's loop until ``stop()`` or the coordinator stops answering."""
    c = node.client
    while not stop():
        try:
            if not node.held:
                got = await c.lease(2)
                node.held.update({x.unit: x for x in got})
                if not got:
                    return
            unit = next(iter(node.held))
            if unit % 3 == 0:
                await c.renew(node.held[unit])
            out = await c.complete(node.held[unit])
            if out is None:  # queued: the coordinator is gone
                return
            node.held.pop(unit)
            if out["credited"]:
                node.credited.add(unit)
            node.step += 1
            await c.heartbeat(node.step, loss=3.0)
            other = peers[(peers.index(node) + 1) % len(peers)]
            r = await c.submit_receipts(
                [sign_receipt(node.ident, "chaos", node.step, other.ident.peer_id_b58, "ee" * 32)]
            )
            if r is not None:
                other.receipts_ok += r["accepted"]
        except CoordinatorUnreachable:
            return


async def _until(cond: Callable[[], bool], deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < end, "condition not met before the deadline"
        await asyncio.sleep(0.01)


async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    run = _write_run(tmp_path)
    proc, url = _start(tmp_path, run)
    nodes = [Node(url) for _ in range(NODES)]
    try:
        for n in nodes:
            await n.client.join(multiaddrs=["/ip4/127.0.0.1/tcp/4001"])
        for n in nodes[:PARKED]:  # leases that surely outlive the kill, whatever its timing
            n.parked = {x.unit: x for x in await n.client.lease(1)}
            assert len(n.parked) == 1
        acked = lambda: sum(len(n.credited) for n in nodes)  # noqa: E731
        tasks = [asyncio.create_task(_work(n, nodes, lambda: False)) for n in nodes]
        await _until(lambda: acked() >= KILL_AFTER, 90)
        os.kill(proc.pid, signal.SIGKILL)  # requests are in flight right now
        proc.wait(10)
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for n in nodes:
            n.held.update(n.parked)
        before = {n.ident.peer_id_b58: (set(n.credited), dict(n.held), n.receipts_ok) for n in nodes}
        still_leased = {n.ident.peer_id_b58: set(n.held) for n in nodes}

        proc, url = _start(tmp_path, run)
        for n in nodes:
            n.client.base_url = url
        async with aiohttp.ClientSession() as http:
            for peer, (credited, held, _) in before.items():
                for unit in credited:
                    async with http.get(f"{url}/api/v1/runs/chaos/leases/{unit}") as r:
                        st = await r.json()
                    assert st["state"] == "done" and st["completed_by"] == peer, st
                for unit in held:  # leased to it still, or done by its own in-flight/queued completion
                    async with http.get(f"{url}/api/v1/runs/chaos/leases/{unit}") as r:
                        st = await r.json()
                    assert (st["state"], st["holder"]) == ("leased", peer) or (
                        st["state"],
                        st["completed_by"],
                    ) == ("done", peer), st
                    if st["state"] == "done":
                        still_leased[peer].discard(unit)
            async with http.get(f"{url}/api/v1/runs/chaos/leaderboard?limit=1000") as r:
                board = {x["peer_id"]: x for x in (await r.json())["leaderboard"]}
        for peer, (credited, _, receipts) in before.items():
            assert board[peer]["tokens"] in (100 * len(credited), 100 * (len(credited) + 1)), peer
            assert board[peer]["steps_acknowledged"] >= receipts
        renewed = 0
        async with aiohttp.ClientSession() as http:
            for n in nodes:  # every acknowledged lease still open continues with its old token
                for unit in still_leased[n.ident.peer_id_b58]:
                    try:
                        await n.client.renew(n.held[unit])
                        renewed += 1
                    except CoordinatorRefused as e:
                        # the node's queued completion of it was replayed since the check above
                        # (the client's replay task runs by itself once the coordinator answers)
                        async with http.get(f"{url}/api/v1/runs/chaos/leases/{unit}") as r:
                            st = await r.json()
                        assert e.code == "conflict" and st["completed_by"] == n.ident.peer_id_b58, st
        assert renewed >= PARKED

        for n in nodes:
            n.client.resume()  # replay what was queued during the outage
        await _until(lambda: all(n.client.pending == 0 for n in nodes), 60)
        for n in nodes:  # leases granted in flight at the kill were never seen: recover them
            n.held.update({x.unit: x for x in await n.client.held_leases() if x.unit not in n.held})
            for unit in list(n.held):
                try:
                    out = await n.client.complete(n.held.pop(unit))
                    assert out is not None
                except CoordinatorRefused:
                    pass
        while True:
            got = await asyncio.gather(*(_finish(n) for n in nodes))
            if not any(got):
                break
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/api/v1/runs/chaos") as r:
                progress = (await r.json())["progress"]
            async with http.get(f"{url}/api/v1/runs/chaos/leaderboard?limit=1000") as r:
                board_list = (await r.json())["leaderboard"]
        assert progress["done"] == SHARDS and progress["leased"] == 0
        assert sum(x["shards"] for x in board_list) == SHARDS
        assert sum(x["tokens"] for x in board_list) == 100 * SHARDS
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        for n in nodes:
            await n.client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def _finish(n: Node) -> int:
    """Lease and complete until the run is exhausted; returns how many this round completed."""
    done = 0
    for lease in await n.client.lease(4):
        out = await n.client.complete(lease)
        assert out is not None and out["credited"]
        done += 1
    return done
