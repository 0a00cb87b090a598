"""A hostile process for ``test_node_hostile_process.py``: ``--liars N`` fresh identities that the
run's coordinator never admitted, each on the node's real stack (its own p2pd, DHT membership,
gossip, pull server, ``StateDonor``, ``DigestBoard``), attacking a live run.

For each step t the honest nodes announce (heard on the run's gossip topic), every liar

- re-signs a copy of an honest step-t packet (pulled from its producer, opened with the run's
  layout digest) as its own packet of step t + 1: a valid, signed, on-plan packet of the run,
  announced before the honest nodes open round t + 1;
- gossips a manifest of step t + 1 that it leads, listing the liars' frames only;
- offers a fake state: the run's model with every parameter shifted by 0.25, at step t + 1
  (a blob a node of the run would load), to state asks, and answers digest asks of every step
  with that state's parameter digest. All liars serve the same blob: N votes on one (step, root).

Credentials: liars 0 and 3 attach one forged with a rogue key, its ticket ground per step so
that the leader rank it claims is first (``leader_rank`` < 2^248); liar 1 attaches none; liar 2
a genuine credential of an honest node, copied from that node's announcements.

Every second it dials the nodes the coordinator lists (its public API, as any stranger reads it),
so a node that starts later meets the liars too. It writes ``report.json`` in ``--out``
(atomically, after each step): the liars' peer ids, the fake digest and counts of what it sent
and served. SIGTERM stops it (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

from distronet.node.catchup.digests import DigestBoard
from distronet.node.catchup.state import state_blob
from distronet.node.catchup.statesync import StateDonor
from distronet.node.daemon.parts import optimizer_config
from distronet.node.daemon.trainer import replica_digest
from distronet.node.exchange.memory import MemoryHub
from distronet.node.exchange.swarm import manifest_topic
from distronet.node.models.build import build_model
from distronet.node.models.spec import ModelSpec
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.node.swarm.control import peer_id
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.pubsub import Gossip, Subscription
from distronet.node.swarm.stack import Swarm
from distronet.protocol.announce import open_announcement, seal_announcement
from distronet.protocol.credential import seal_credential
from distronet.protocol.errors import Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.manifest import leader_rank, seal_manifest
from distronet.protocol.packet import open_packet, seal_packet

log = logging.getLogger("hostile")
KINDS = ("rogue", "none", "stolen", "rogue")  # liar i's credential: KINDS[i % 4]
SHIFT = 0.25  # added to every parameter of the fake state


@dataclasses.dataclass
class Liar:
    kind: str
    identity: Identity
    swarm: Swarm
    manifests: Gossip  # manifests may exceed the announcement topic's 1 KiB cap
    subs: list[Subscription]
    donor: StateDonor
    board: DigestBoard


@dataclasses.dataclass
class Attack:
    run: str
    coordinator: str
    layout: bytes  # the run's layout digest
    fake_digest: bytes
    liars: list[Liar]
    report: Path
    rogue: Identity = dataclasses.field(default_factory=Identity.generate)
    newest: int = -1  # the newest step an honest node announced
    stolen: bytes | None = None  # an honest node's credential
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def credential(self, liar: Liar, step: int) -> bytes | None:
        if liar.kind == "none":
            return None
        if liar.kind == "stolen":
            return self.stolen
        me = liar.identity.peer_id
        ticket = ground_ticket(step, me)
        return seal_credential(
            self.rogue, self.run, me, issued_at=int(time.time()), lifetime_s=600, ticket=ticket
        )

    def write_report(self) -> None:
        doc = {
            "peer_ids": [x.identity.peer_id_b58 for x in self.liars],
            "kinds": [x.kind for x in self.liars],
            "fake_digest": self.fake_digest.hex(),
            "newest": self.newest,
            "stolen": self.stolen is not None,
            "states_built": sum(x.donor.built for x in self.liars),  # built only when a peer asks
            "digests_served": sum(x.board.served for x in self.liars),
            **self.counts,
        }
        tmp = self.report.with_name(self.report.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.report)


def ground_ticket(step: int, peer: bytes) -> bytes:
    """A ticket under which ``peer`` would rank first for ``step`` (``leader_rank`` < 2^248)."""
    for j in range(1 << 20):
        ticket = hashlib.sha256(j.to_bytes(4, "big")).digest()[:16]
        if leader_rank(step, peer, ticket)[0] == 0:
            return ticket
    raise AssertionError("no ticket found")  # pragma: no cover  (p = (255/256)^(2^20))


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5.0) as r:
        return json.load(r)


def node_addrs(coordinator: str, run: str) -> dict[str, str]:
    """peer id -> a full multiaddr of every node the coordinator lists (its public API)."""
    nodes = http_json(f"{coordinator}/api/v1/runs/{run}/nodes")["nodes"]
    return {n["peer_id"]: f"{n['multiaddrs'][0]}/p2p/{n['peer_id']}" for n in nodes if n["multiaddrs"]}


def fake_state(run_info: dict[str, Any], me: Identity) -> tuple[torch.nn.Module, DistroOptimizer]:
    """The run's model with every parameter shifted, and a fresh optimizer over it: what a node
    of the run would load (the same tensors, shapes and optimizer state keys)."""
    model = build_model(ModelSpec.from_run(run_info["model"]), torch.device("cpu"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(SHIFT)
    dcfg = optimizer_config(run_info["id"], run_info["optimizer"])
    return model, DistroOptimizer(
        model.named_parameters(), dcfg, MemoryHub().join(me.peer_id), me, roles=tensor_roles(model)
    )


async def start_liar(i: int, out: Path, run: str, boot: tuple[str, ...]) -> Liar:
    identity = Identity.generate()
    key = out / f"liar{i}.key"
    identity.save(key)
    cfg = SwarmConfig(identity_path=str(key), bootstrap=boot, nat_traversal=False, gossip_heartbeat_s=0.2)
    members = MembershipConfig(run_id=run, ttl_s=15.0, dht_wait_timeout_s=2.0)
    swarm = await Swarm.start(identity, cfg, members)
    manifests = Gossip(swarm.host, max_message_bytes=64 * 1024)
    subs = [await swarm.gossip.subscribe(swarm.topic), await manifests.subscribe(manifest_topic(run))]
    donor = await StateDonor.create(swarm)
    board = await DigestBoard.create(swarm.host, identity, run)
    return Liar(KINDS[i % len(KINDS)], identity, swarm, manifests, subs, donor, board)


async def strike(a: Attack, step: int, producer: bytes, sha: bytes, size: int) -> None:
    """Honest step ``step`` was announced: every liar attacks step ``step + 1`` (module doc)."""
    fetch = a.liars[0].swarm.puller.fetch
    frame = await fetch(peer_id(producer), sha, max_bytes=size, size=size, timeout=3.0, step=step)
    payload = open_packet(frame, run_id=a.run, layout_digest=a.layout).payload
    t = step + 1
    frames = {x.identity.peer_id: seal_packet(x.identity, a.run, t, a.layout, payload) for x in a.liars}
    entries = [(p, hashlib.sha256(f).digest(), len(f)) for p, f in frames.items()]
    for liar in a.liars:
        mine = frames[liar.identity.peer_id]
        liar.swarm.puller.store.put(mine, t)
        liar.swarm.puller.store.evict_before(t - 8)
        note = seal_announcement(liar.identity, a.run, t, mine, credential=a.credential(liar, t))
        await liar.swarm.gossip.publish(liar.swarm.topic, note)
        await liar.manifests.publish(manifest_topic(a.run), seal_manifest(liar.identity, a.run, t, entries))
        a.counts["announced"] = a.counts.get("announced", 0) + 1


async def listen(a: Attack) -> None:
    """Learn the honest steps (and a credential to steal) from their announcements; strike each."""
    recorded = -1
    liars = {x.identity.peer_id for x in a.liars}
    async for msg in a.liars[0].subs[0]:
        try:
            ann = open_announcement(msg.data, run_id=a.run)
        except Rejected:
            continue
        if ann.peer_id != msg.sender.to_bytes() or ann.peer_id in liars:
            continue
        a.stolen = a.stolen or ann.credential
        if ann.step <= a.newest:
            continue
        a.newest = ann.step
        for s in range(max(recorded + 1, ann.step - 16), ann.step + 3):  # every step's digest, ahead too
            for liar in a.liars:
                liar.board.record(s, a.fake_digest)
            recorded = s
        try:
            await asyncio.wait_for(strike(a, ann.step, ann.peer_id, ann.packet_sha256, ann.packet_size), 5.0)
        except Exception as e:  # a pull that failed, a publish that was late: the next step tries again
            log.info("step %d: %r", ann.step, e)
            a.counts["errors"] = a.counts.get("errors", 0) + 1
        a.write_report()


async def dial(a: Attack) -> None:
    """Every second: connect every liar to every node the coordinator lists."""
    while True:
        with contextlib.suppress(Exception):
            nodes = await asyncio.to_thread(node_addrs, a.coordinator, a.run)
            for liar in a.liars:
                have = {p.to_base58() for p in await liar.swarm.host.connected_peers()}
                for pid in nodes.keys() - have:
                    with contextlib.suppress(Exception):
                        await liar.swarm.host.connect(nodes[pid])
        await asyncio.sleep(1.0)


async def listed(coordinator: str, run: str, timeout: float) -> tuple[str, ...]:
    """The nodes' multiaddrs, once the coordinator lists one (within ``timeout`` seconds)."""
    end = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, KeyError, ValueError):
            found = tuple(node_addrs(coordinator, run).values())
            if found:
                return found
        if time.monotonic() > end:
            raise TimeoutError(f"the coordinator listed no node within {timeout:.0f} s")
        await asyncio.sleep(0.2)


async def main(coordinator: str, run: str, n: int, out: Path) -> int:
    torch.set_num_threads(1)
    t0 = time.monotonic()
    run_info = http_json(f"{coordinator}/api/v1/runs/{run}")
    model, opt = fake_state(run_info, Identity.generate())
    log.info("fake state built %.1f s after the start", time.monotonic() - t0)
    boot = await listed(coordinator, run, 120.0)
    t0 = time.monotonic()
    liars = list(await asyncio.gather(*(start_liar(i, out, run, boot) for i in range(n))))
    log.info("%d liars up in %.1f s", n, time.monotonic() - t0)
    fake = bytes.fromhex(replica_digest(model, opt))  # the fake state's digest, as a node computes it
    a = Attack(run, coordinator, opt.digest, fake, liars, out / "report.json")

    async def blob() -> tuple[int, bytes]:
        s = a.newest + 1
        return s, await asyncio.to_thread(state_blob, s, model, opt)

    for liar in liars:
        liar.donor.serve_from(lambda: a.newest + 1, blob)
    a.write_report()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    tasks = [asyncio.ensure_future(listen(a)), asyncio.ensure_future(dial(a))]
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        a.write_report()
        for liar in liars:
            for close in (liar.donor.close, liar.board.close, liar.manifests.close, liar.swarm.close):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), 5.0)
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="a hostile process of never-admitted liars (module doc)")
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--liars", type=int, default=4)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s hostile %(message)s")
    sys.exit(asyncio.run(main(args.coordinator, args.run, args.liars, args.out)))
