"""The daemon's running loops, one function each: heartbeats + discovery, waiting for peers, training.

Kept apart from ``daemon.py`` so that file stays a table of contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import time
from typing import TYPE_CHECKING

from distronet.node.daemon.coordinator_client import CoordinatorClientError
from distronet.node.daemon.parts import bootstrap_addrs, wait_decoder_warm
from distronet.node.daemon.status import StatusLine
from distronet.node.daemon.trainer import StepResult, Trainer
from distronet.node.exchange.base import ExchangeError, PeerDead
from distronet.node.exchange.swarm import FellBehind
from distronet.node.exitcodes import ExitCode
from distronet.node.swarm.errors import SwarmError
from distronet.protocol.identity import peer_id_to_b58

if TYPE_CHECKING:
    from distronet.node.daemon.node import Node
    from distronet.node.swarm.hivemind_shim import PeerID

__all__ = ["discover", "heartbeats", "round_due", "train", "wait_for_peers", "watch_links"]

log = logging.getLogger(__name__)
MAX_LOSSES = 256  # the first loss and the most recent ones stay in the status (written every step)


async def discover(node: Node) -> int:
    """Ask the coordinator for live peers (a fresh signed join) and dial those we are not connected to.

    Returns how many dials succeeded. Never raises for an unreachable coordinator or peer.
    """
    from distronet.node.daemon.node import CALL_S

    assert node.client is not None and node.swarm is not None
    try:
        joined = await asyncio.wait_for(
            node.client.join(
                join_token=node.cfg.join_token or None, multiaddrs=node.maddrs, agent="distro-node"
            ),
            CALL_S,
        )
    except (CoordinatorClientError, asyncio.TimeoutError) as e:
        log.info("peer discovery: %s", e)
        return 0
    have = {p.to_base58() for p in await node.swarm.host.connected_peers()}
    dialled = 0
    for addr in bootstrap_addrs(joined.bootstrap_peers, node.identity.peer_id_b58):
        if addr.rsplit("/p2p/", 1)[-1] in have:
            continue
        with contextlib.suppress(SwarmError):
            await node.swarm.host.connect(addr)
            dialled += 1
    return dialled


async def heartbeats(node: Node) -> None:
    """Every heartbeat interval: report step and loss (buffered while the coordinator is down),
    dial peers we do not know yet, refresh the peer count. Runs until cancelled."""
    assert node.client is not None
    period = max(0.5, min(node.heartbeat_s, 5.0))
    while True:
        loss = node.status.loss
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                node.client.heartbeat(max(node.step, 0), loss=loss if math.isfinite(loss) else None), 15.0
            )
        with contextlib.suppress(Exception):
            node.status.peers = await asyncio.wait_for(node.live_peers(), 10.0)
            node.metrics.peers.set(node.status.peers)
            if node.status.peers + 1 < node.cfg.train.min_peers or node.status.peers == 0:
                await discover(node)
        await asyncio.sleep(period)


async def watch_links(node: Node, period: float = 3.0) -> None:
    """Every ``period`` seconds: re-dial members that are missing from our gossip topics
    (``swarm.links``: a connection whose pubsub hello was lost, seen as a one-way partition in
    shaped runs). Runs until cancelled; a check that fails or runs late is skipped."""
    from distronet.node.exchange.swarm import manifest_topic
    from distronet.node.swarm.links import LinkWatch, repair_links

    if node.swarm is None:
        return
    watch = LinkWatch()
    topics = [node.swarm.topic, manifest_topic(node.cfg.run_id)]
    while True:
        await asyncio.sleep(period)
        if not node.swarm.host.alive:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(repair_links(node.swarm, watch, topics), 30.0)


async def wait_for_peers(node: Node) -> None:
    """Until ``min_peers`` nodes (this one included) share both gossip topics, dialling the
    coordinator's peers meanwhile. Raises ``NodeError(NETWORK)`` after ``start_timeout_s``."""
    from distronet.node.daemon.node import NodeError

    want = max(node.cfg.train.min_peers - 1, 1 if node.run_has_peers else 0)
    end = time.monotonic() + node.cfg.train.start_timeout_s
    next_dial = 0.0
    while not node.stop_requested.is_set():
        peers = await asyncio.wait_for(node.live_peers(), 10.0)
        node.status.peers = peers
        if peers >= want:
            return
        if time.monotonic() > end:
            raise NodeError(
                f"only {peers + 1} of {want + 1} nodes in the mesh after "
                f"{node.cfg.train.start_timeout_s:.0f} s "
                "(lower --min-peers, or check that peers can reach this node)",
                ExitCode.NETWORK,
            )
        if time.monotonic() >= next_dial:
            await discover(node)
            next_dial = time.monotonic() + 1.0
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(node.stop_requested.wait(), 0.2)


@functools.lru_cache(maxsize=1024)
def _b58(peer: bytes) -> str:
    return peer_id_to_b58(peer)


def _line(node: Node) -> StatusLine | None:
    mode = node.cfg.observe.status
    if mode == "off":
        return None
    return StatusLine(live=None if mode == "auto" else False, prefix=f"[{node.identity.peer_id_b58[-6:]}] ")


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


async def _one_step(node: Node) -> tuple[StepResult, str] | None:
    """Run step ``node.step`` in a worker thread; the result and the parameter digest after it
    (one BLAKE3 pass, in the same thread). On a stop request the step may finish within
    ``shutdown_timeout_s``; else it is abandoned (None)."""
    fut = asyncio.ensure_future(asyncio.to_thread(_step_and_digest, node.trainer, node.step))
    stop = asyncio.ensure_future(node.stop_requested.wait())
    try:
        await asyncio.wait({fut, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not fut.done():
            done, _ = await asyncio.wait({fut}, timeout=node.cfg.shutdown_timeout_s)
            if not done:
                node.abandoned = True
                log.warning(
                    "the step in flight did not finish in %.0f s: abandoned", node.cfg.shutdown_timeout_s
                )
                return None
        return fut.result()
    finally:
        stop.cancel()


def _account(node: Node, res: StepResult, wall: float, up0: int, down0: int, digest: str) -> None:
    s, m, stats = node.status, node.metrics, node.exchange.stats
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
    report = node.optimizer.reports[-1] if node.optimizer.reports else None
    due = round_due(node.optimizer, res.step)
    if report is not None and due is not None and report.step == due:
        s.rounds += 1
        s.own_accepted += int(report.own_accepted)
        m.packets.labels("accepted", "").inc(len(report.accepted))
        for code in report.rejected.values():
            m.packets.labels("rejected", code.name).inc()
        s.record_round(report.step, [_b58(p) for p in report.accepted])
    if node.core is not None:
        s.warmup_heard = node.core.warmup_heard
        s.alone_waits = node.core.alone.waits
        s.dead_frames = node.core.dead_frames
    if node.client is not None:
        s.pending_reports = node.client.pending
    s.record_digest(res.step, digest)
    if node.board is not None:
        node.board.record(res.step, bytes.fromhex(digest))
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


async def drift_check(node: Node) -> list[PeerID] | None:
    """Compare our parameter digest after step ``node.step - 1`` with the peers' digests of that
    step (``swarm.digests``: one small request per peer; a peer one step behind answers when it
    gets there). Returns the peers whose state we should adopt (``digests.state_to_adopt``: the
    largest group of equal digests, ties to the smallest digest, wins; its members keep their
    state), or None to keep ours. Never raises for silent or unreachable peers."""
    from distronet.node.catchup.digests import ask_digest, state_to_adopt

    assert node.swarm is not None and node.board is not None
    done = node.step - 1
    mine = node.board.get(done)
    peers = list(set(await node.swarm.gossip.topic_peers(node.swarm.topic)))
    if mine is None or not peers:
        return None
    theirs = await asyncio.gather(*(ask_digest(node.swarm.host, p, done, 5.0) for p in peers))
    known = [d for d in theirs if d is not None]
    log.info("drift check after step %d: %d of %d peers answered, %d equal", done, len(known), len(peers),
             known.count(mine))  # fmt: skip
    if not known:
        node.metrics.drift.labels("skipped").inc()
        return None
    donors = state_to_adopt(mine, dict(zip(peers, theirs, strict=True)))
    if donors is None:
        if mine in known:
            node.status.drift_equal += 1
            node.metrics.drift.labels("equal").inc()
        else:
            node.metrics.drift.labels("kept").inc()
            log.warning("step %d: our parameters differ from all %d peers that answered; ours rank "
                        "first (smallest digest), so we keep them", done, len(known))  # fmt: skip
        return None
    node.status.drift_differs += 1
    node.metrics.drift.labels("differs").inc()
    log.warning("step %d: our parameters differ from the %d of %d answering peers that rank first; "
                "adopting their state", done, len(donors), len(known))  # fmt: skip
    return donors


class _DriftWatch:
    """Drift checks in the background, so a step never waits for the peers' answers; a check
    that finds drift makes :meth:`drifted` true at the next step boundary (unless the node
    adopted a state meanwhile, which makes that check's verdict moot)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.task: asyncio.Task[list[PeerID] | None] | None = None
        self.resyncs = 0  # node.status.resyncs when the running check started

    def start(self) -> None:
        if self.task is None:
            self.resyncs = self.node.status.resyncs
            self.task = asyncio.ensure_future(self._check())

    async def _check(self) -> list[PeerID] | None:
        return await asyncio.wait_for(drift_check(self.node), 15.0)

    def drifted(self) -> list[PeerID] | None:
        """Once, when the finished check found drift that still applies: the peers to adopt from."""
        if self.task is None or not self.task.done():
            return None
        task, self.task = self.task, None
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result() if self.node.status.resyncs == self.resyncs else None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


async def _resync(node: Node, err: Exception) -> None:
    """After a failed round our parameters may differ from the swarm's: adopt the swarm's newer
    state. Raises ``NodeError(NETWORK)`` when none comes within ``shutdown_timeout_s``."""
    from distronet.node.daemon.node import NodeError

    if isinstance(err, FellBehind):
        node.status.fell_behind += 1
    log.warning("step %d failed in the exchange (%s); resyncing from peers", node.step, err)
    end = time.monotonic() + node.cfg.shutdown_timeout_s
    while time.monotonic() < end and not node.stop_requested.is_set():
        if await node.catch_up(newer_than=node.step, timeout=max(1.0, end - time.monotonic())):
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(node.stop_requested.wait(), 0.5)
    if not node.stop_requested.is_set():
        raise NodeError(
            f"step {node.step} failed and no peer offered a newer state to resync from", ExitCode.NETWORK
        )


async def train(node: Node) -> None:
    """Train until a stop request, ``max_steps`` or ``max_seconds``; checkpoint every K steps and at
    the end; complete each shard once it has been read through and lease the next."""
    tc = node.cfg.train
    line = _line(node)
    watch = _DriftWatch(node)
    started = time.monotonic()
    await node.next_shard()
    await asyncio.to_thread(wait_decoder_warm, 120.0)
    try:
        while not node.stop_requested.is_set():
            if tc.max_steps and node.step >= tc.max_steps:
                break
            if tc.max_seconds and time.monotonic() - started >= tc.max_seconds:
                break
            if node.feed.done(node.step):
                await node.next_shard()
            stats = node.exchange.stats
            up0, down0, t0 = stats.bytes_up, stats.bytes_down, time.monotonic()
            try:
                async with node.model_lock:  # a state snapshot for a peer waits for the boundary
                    done = await _one_step(node)
                    if done is not None:
                        node.step = done[0].step + 1
            except PeerDead:
                break
            except ExchangeError as e:
                await _resync(node, e)
                continue
            if done is None:
                return
            res, digest = done
            _account(node, res, max(time.monotonic() - t0, 1e-6), up0, down0, digest)
            # A newcomer's first packets race rounds the others may have decided already; the
            # exchange can then hand it another accepted set. Checking right after a catch-up
            # (and every drift_every steps) finds that and adopts the swarm's state again.
            donors = watch.drifted()
            if donors and not node.stop_requested.is_set():
                with contextlib.suppress(Exception):
                    await node.catch_up(newer_than=node.step - 1, timeout=30.0, donors=donors)
            if node.step <= node.verify_until or (tc.drift_every and node.step % tc.drift_every == 0):
                watch.start()
            node.status_file.write(node.status)
            if line is not None:
                line.show(node.status)
            if tc.checkpoint_every and node.step % tc.checkpoint_every == 0:
                await asyncio.to_thread(node.checkpoint)
    finally:
        watch.cancel()
        if line is not None:
            line.end()
    if not node.abandoned and node.step > 0:
        await asyncio.to_thread(node.checkpoint)
    node.status_file.write(node.status)
