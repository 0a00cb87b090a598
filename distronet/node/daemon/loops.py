"""The daemon's running loops, one function each: heartbeats + discovery, re-dialling gossip links,
waiting for peers, training.

Each takes a :class:`LoopParts`: exactly what the loops use, built by ``Node.create``
(``node.py``, which stays a table of contents). Catch-up decisions (replay, state download,
drift repair, the resync after a failed round) are ``CatchUp``'s (``node/catchup/resync.py``);
the training loop calls it at each step boundary and after a failed round.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distronet.node.catchup.replica import Replica
from distronet.node.catchup.resync import CatchUp, CatchUpError
from distronet.node.config import NodeConfig
from distronet.node.daemon.coordinator_client import CoordinatorClient, CoordinatorClientError, sign_receipt
from distronet.node.daemon.errors import CALL_S, NodeError
from distronet.node.daemon.metrics import NodeMetrics
from distronet.node.daemon.parts import bootstrap_addrs, wait_decoder_warm
from distronet.node.daemon.reachwatch import ReachWatch
from distronet.node.daemon.shards import Shards
from distronet.node.daemon.status import NodeStatus, StatusFile, StatusLine
from distronet.node.exchange.base import ExchangeError, PeerDead
from distronet.node.exchange.swarm import AsyncSwarmExchange, manifest_topic
from distronet.node.exitcodes import ExitCode
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.links import LinkWatch, repair_links
from distronet.node.swarm.stack import Swarm
from distronet.protocol.coordinator_api import REACH_MAX_LINKS
from distronet.protocol.identity import Identity, peer_id_to_b58

if TYPE_CHECKING:  # types only: the trainer imports torch, which the daemon loads in the background
    from distronet.node.daemon.trainer import StepResult, Trainer
    from distronet.node.optim.distro import StepReport

__all__ = [
    "LoopParts",
    "discover",
    "heartbeats",
    "live_peers",
    "reach_report",
    "round_due",
    "train",
    "wait_for_peers",
    "watch_links",
]

log = logging.getLogger(__name__)
MAX_LOSSES = 256  # the first loss and the most recent ones stay in the status (written every step)
MAX_RECEIPTS = 4096  # signed receipts waiting for the coordinator (past it, the oldest are dropped)
RECEIPT_BATCH = 512  # receipts sent per heartbeat


@dataclasses.dataclass(frozen=True)
class LoopParts:
    """What the loops use, built by ``Node.create``. ``replica`` is the model the trainer steps
    (``replica.trainer is trainer``) and the step it is at; ``checkpoint()`` saves it (blocking:
    called in a worker thread); ``stop`` is the node's stop request. ``maddrs``, ``heartbeat_s``
    and ``run_has_peers`` come from joining the run: our dialable addresses, the coordinator's
    heartbeat interval, and whether the run had peers already (then wait for one)."""

    cfg: NodeConfig
    identity: Identity
    client: CoordinatorClient
    swarm: Swarm
    core: AsyncSwarmExchange
    trainer: Trainer
    replica: Replica
    catchup: CatchUp
    shards: Shards
    status: NodeStatus
    status_file: StatusFile
    metrics: NodeMetrics
    checkpoint: Callable[[], None]
    stop: asyncio.Event
    maddrs: list[str]
    heartbeat_s: float
    run_has_peers: bool
    receipts: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # for the next heartbeat
    # routes to peers and the "reaching nobody" diagnosis (its delays: cfg.net.reach_diagnosis_*)
    reach: ReachWatch = dataclasses.field(default_factory=lambda: ReachWatch(60.0, 600.0))


async def live_peers(swarm: Swarm, run_id: str) -> int:
    """Other nodes in both of our gossip topics (0 when the swarm is gone). gossipsub ignores
    relayed connections: a peer we reach only through a relay counts when the relay (which
    forwards the run's gossip, ``node/relay.py``) is in both topics; the relays are not nodes."""
    if not swarm.host.alive:
        return 0
    a = set(await swarm.gossip.topic_peers(swarm.topic))
    b = set(await swarm.gossip.topic_peers(manifest_topic(run_id)))
    both = {p.to_base58() for p in a & b}
    relays = swarm.host.relay_ids
    if both & relays:  # gossip reaches us through the relay from the peers behind it
        both |= await swarm.host.relayed_peers()
    return len(both - relays)


async def discover(parts: LoopParts) -> int:
    """Ask the coordinator for live peers (a fresh signed join) and dial those we are not connected to.

    Our addresses are read afresh first: a relay reservation made after the start adds a
    ``/p2p-circuit`` address that peers behind other NATs need. Returns how many dials
    succeeded. Never raises for an unreachable coordinator or peer.
    """
    with contextlib.suppress(SwarmError):
        parts.maddrs[:] = await parts.swarm.host.maddrs()
    try:
        joined = await asyncio.wait_for(
            parts.client.join(
                join_token=parts.cfg.join_token or None, multiaddrs=parts.maddrs, agent="distro-node"
            ),
            CALL_S,
        )
    except (CoordinatorClientError, asyncio.TimeoutError) as e:
        log.info("peer discovery: %s", e)
        return 0
    have = {p.to_base58() for p in await parts.swarm.host.connected_peers()}
    dialled = 0
    boot = bootstrap_addrs(joined.bootstrap_peers, parts.identity.peer_id_b58)
    # the run's relays when it names any (join answer, then --relays); else every bootstrap peer
    # is a relay candidate for the diagnosis
    relays = tuple(dict.fromkeys((*joined.relays, *parts.cfg.net.relay_list)))
    parts.reach.set_relays(relays or boot)
    for addr in dict.fromkeys((*relays, *boot)):
        if addr.rsplit("/p2p/", 1)[-1] in have:
            parts.reach.dialled(addr, True)
            continue
        try:
            await parts.swarm.host.connect(addr)
        except SwarmError:
            parts.reach.dialled(addr, False)
            continue
        parts.reach.dialled(addr, True)
        dialled += 1
    return dialled


def _queue_receipts(parts: LoopParts, report: StepReport) -> None:
    """Sign a receipt for each other producer whose packet this round credited (combined and not
    flagged: ``node/optim/verify.py``); the coordinator credits a lease only with such receipts
    from other members (docs/protocol.md §11). The heartbeat loop sends them."""
    me, run_id = parts.identity.peer_id, parts.cfg.run_id
    for peer in report.credited:
        sha = report.frame_sha256.get(peer)
        if peer != me and sha is not None:
            parts.receipts.append(sign_receipt(parts.identity, run_id, report.step, _b58(peer), sha.hex()))
    del parts.receipts[: max(0, len(parts.receipts) - MAX_RECEIPTS)]


async def send_receipts(parts: LoopParts) -> None:
    """Send up to ``RECEIPT_BATCH`` queued receipts (the client queues them while the coordinator
    is down, like every report)."""
    batch = parts.receipts[:RECEIPT_BATCH]
    del parts.receipts[:RECEIPT_BATCH]
    if batch:
        await asyncio.wait_for(parts.client.submit_receipts(batch), 15.0)


async def heartbeats(parts: LoopParts) -> None:
    """Every heartbeat interval: report step, loss and reach (buffered while the coordinator is
    down), refresh the peer count and the reach (``ReachWatch.check``: routes, diagnosis), dial
    peers we do not know yet. The status file is written here too while no step runs (and when
    the diagnosis changes). Runs until cancelled."""
    status = parts.status
    period = max(0.5, min(parts.heartbeat_s, 5.0))
    while True:
        loss = status.loss
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                parts.client.heartbeat(
                    max(parts.replica.step, 0), loss=loss if math.isfinite(loss) else None,
                    reach=reach_report(status),
                ),
                15.0,
            )  # fmt: skip
        with contextlib.suppress(Exception):
            await send_receipts(parts)
        with contextlib.suppress(Exception):
            status.peers = await asyncio.wait_for(live_peers(parts.swarm, parts.cfg.run_id), 10.0)
            parts.metrics.peers.set(status.peers)
            cause = status.diagnosis
            await asyncio.wait_for(
                parts.reach.check(parts.swarm, status, parts.metrics, parts.cfg.net.listen), 20.0
            )
            if status.state != "training" or status.diagnosis != cause:  # steps write it while training
                parts.status_file.write(status)
        with contextlib.suppress(Exception):
            if status.peers + 1 < parts.cfg.train.min_peers or status.peers == 0:
                await discover(parts)
        await asyncio.sleep(period)


def reach_report(status: NodeStatus) -> dict[str, Any]:
    """The heartbeat's ``reach``: connected peers by route and the diagnosis cause ("" when a
    peer is reached), within the protocol's bounds (``coordinator_api.REACH``)."""
    cap = REACH_MAX_LINKS
    return {
        "direct": min(status.reach_direct, cap),
        "hole_punched": min(status.reach_hole_punched, cap),
        "relayed": min(status.reach_relayed, cap),
        "diagnosis": status.diagnosis,
    }


async def watch_links(parts: LoopParts, period: float = 3.0) -> None:
    """Every ``period`` seconds: re-dial members that are missing from our gossip topics
    (``swarm.links``: a connection whose pubsub hello was lost, seen as a one-way partition in
    shaped runs). Runs until cancelled; a check that fails or runs late is skipped."""
    swarm, watch = parts.swarm, LinkWatch()
    topics = [swarm.topic, manifest_topic(parts.cfg.run_id)]
    while True:
        await asyncio.sleep(period)
        if not swarm.host.alive:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(repair_links(swarm, watch, topics, parts.reach.dialled), 30.0)


async def wait_for_peers(parts: LoopParts) -> None:
    """Until ``min_peers`` nodes (this one included) share both gossip topics, dialling the
    coordinator's peers meanwhile. Raises ``NodeError(NETWORK)`` after ``start_timeout_s``."""
    tc = parts.cfg.train
    want = max(tc.min_peers - 1, 1 if parts.run_has_peers else 0)
    end = time.monotonic() + tc.start_timeout_s
    next_dial = 0.0
    while not parts.stop.is_set():
        peers = await asyncio.wait_for(live_peers(parts.swarm, parts.cfg.run_id), 10.0)
        parts.status.peers = peers
        if peers >= want:
            return
        if time.monotonic() > end:
            raise NodeError(
                f"only {peers + 1} of {want + 1} nodes in the mesh after {tc.start_timeout_s:.0f} s "
                "(lower --min-peers, or check that peers can reach this node)",
                ExitCode.NETWORK,
            )
        if time.monotonic() >= next_dial:
            await discover(parts)
            next_dial = time.monotonic() + 1.0
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(parts.stop.wait(), 0.2)


@functools.lru_cache(maxsize=1024)
def _b58(peer: bytes) -> str:
    return peer_id_to_b58(peer)


def _line(parts: LoopParts) -> StatusLine | None:
    mode = parts.cfg.observe.status
    if mode == "off":
        return None
    return StatusLine(live=None if mode == "auto" else False, prefix=f"[{parts.identity.peer_id_b58[-6:]}] ")


def round_due(optimizer: object, step: int) -> int | None:
    """The round that step ``step`` applies: ``step`` itself, or ``step - 1`` once overlapped
    (``optimizer.overlapped``), and none at the first overlapped step (its round is applied one
    step later and the one before it was applied in its own step)."""
    overlapped = getattr(optimizer, "overlapped", None)
    if not callable(overlapped) or not overlapped(step):
        return step
    return step - 1 if overlapped(step - 1) else None


def _step_and_digest(trainer: Trainer, step: int) -> tuple[StepResult, str]:
    c0 = time.thread_time()
    res = trainer.step(step)
    digest = trainer.digest()  # what replicas hold bit-identical (the consensus in overlap mode)
    return dataclasses.replace(res, cpu_s=time.thread_time() - c0), digest


async def _one_step(parts: LoopParts) -> tuple[StepResult, str] | None:
    """Run step ``replica.step`` in a worker thread; the result and the parameter digest after it
    (one BLAKE3 pass, in the same thread). On a stop request the step may finish within
    ``shutdown_timeout_s``; else it is abandoned (None)."""
    fut = asyncio.ensure_future(asyncio.to_thread(_step_and_digest, parts.trainer, parts.replica.step))
    stop = asyncio.ensure_future(parts.stop.wait())
    limit = parts.cfg.shutdown_timeout_s
    try:
        await asyncio.wait({fut, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not fut.done():
            done, _ = await asyncio.wait({fut}, timeout=limit)
            if not done:
                log.warning("the step in flight did not finish in %.0f s: abandoned", limit)
                return None
        return fut.result()
    finally:
        stop.cancel()


def _account(parts: LoopParts, res: StepResult, wall: float, up0: int, down0: int, digest: str) -> None:
    s, m, stats, core = parts.status, parts.metrics, parts.core.stats, parts.core
    s.step, s.loss, s.step_time = res.step, res.loss, time.time()
    s.cpu_steps += 1
    s.cpu_train_s += res.cpu_s
    s.cpu_optimizer_s += res.optimizer_cpu_s
    if s.first_step < 0:
        s.first_step = res.step
    s.losses.append(res.loss)
    del s.losses[1 : max(1, len(s.losses) - MAX_LOSSES)]
    s.bytes_up, s.bytes_down = stats.bytes_up, stats.bytes_down
    s.up_bps, s.down_bps = (stats.bytes_up - up0) / wall, (stats.bytes_down - down0) / wall
    optimizer = parts.replica.optimizer
    report = optimizer.reports[-1] if optimizer.reports else None
    due = round_due(optimizer, res.step)
    if report is not None and due is not None and report.step == due:
        s.rounds += 1
        s.own_accepted += int(report.own_accepted)
        m.packets.labels("accepted", "").inc(len(report.accepted))
        for code in report.rejected.values():
            m.packets.labels("rejected", code.name).inc()
        leader = core.leader_of(report.step)
        s.record_round(
            report.step, [_b58(p) for p in report.accepted], None if leader is None else _b58(leader)
        )
        _queue_receipts(parts, report)
    s.warmup_heard, s.alone_waits, s.dead_frames = core.warmup_heard, core.alone.waits, core.dead_frames
    s.rejected = {code.name: n for code, n in core.rejected.items()}
    s.not_admitted = {_b58(p): n for p, n in core.refused_peers.items()}
    s.pending_reports = parts.client.pending
    s.record_digest(res.step, digest)
    m.steps.inc()
    m.step.set(res.step)
    m.loss.set(res.loss)
    m.step_seconds.labels("compute").observe(res.compute_s)
    m.step_seconds.labels("exchange").observe(res.exchange_s)
    m.bytes.labels("up").inc(stats.bytes_up - up0)
    m.bytes.labels("down").inc(stats.bytes_down - down0)
    for direction, rate, budget in (("up", s.up_bps, s.up_budget), ("down", s.down_bps, s.down_budget)):
        m.utilisation.labels(direction).set(rate / budget if math.isfinite(budget) and budget > 0 else 0.0)
    m.info.clear()
    m.info.labels(s.peer_id, s.run_id, digest).set(1)


async def _resync(parts: LoopParts, err: ExchangeError) -> None:
    """The failed round's catch-up (``CatchUp.after_failed_round``), within ``shutdown_timeout_s``.
    Raises ``NodeError(NETWORK)`` when no peer offered a newer state."""
    try:
        await parts.catchup.after_failed_round(err, parts.cfg.shutdown_timeout_s)
    except CatchUpError as e:
        raise NodeError(str(e), ExitCode.NETWORK) from e


async def train(parts: LoopParts) -> None:
    """Train until a stop request, ``max_steps`` or ``max_seconds``; checkpoint every K steps and at
    the end; complete each shard once it has been read through and lease the next. After each
    step, the catch-up's step boundary (``CatchUp.after_step``: drift checks and repair)."""
    tc, replica, shards, status = parts.cfg.train, parts.replica, parts.shards, parts.status
    line = _line(parts)
    started = time.monotonic()
    await shards.next(replica.step)
    await asyncio.to_thread(wait_decoder_warm, 120.0)
    try:
        while not parts.stop.is_set():
            if tc.max_steps and replica.step >= tc.max_steps:
                break
            if tc.max_seconds and time.monotonic() - started >= tc.max_seconds:
                break
            if shards.done(replica.step):
                await shards.next(replica.step)
            stats = parts.core.stats
            up0, down0, t0 = stats.bytes_up, stats.bytes_down, time.monotonic()
            try:
                async with replica.lock:  # a state snapshot for a peer waits for the boundary
                    done = await _one_step(parts)
                    if done is not None:
                        replica.step = done[0].step + 1
                        await replica.boundary()  # a donor's snapshot asked for this step (rendezvous)
            except PeerDead:
                break
            except ExchangeError as e:
                await _resync(parts, e)
                continue
            if done is None:
                return
            res, digest = done
            _account(parts, res, max(time.monotonic() - t0, 1e-6), up0, down0, digest)
            await parts.catchup.after_step(res.step, digest, tc.drift_every)
            parts.status_file.write(status)
            if line is not None:
                line.show(status)
            if tc.checkpoint_every and replica.step % tc.checkpoint_every == 0:
                await asyncio.to_thread(parts.checkpoint)
    finally:
        parts.catchup.drift.cancel()
        if line is not None:
            line.end()
    if replica.step > 0:
        await asyncio.to_thread(parts.checkpoint)
    parts.status_file.write(status)
