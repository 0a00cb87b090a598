"""The daemon's running loops, one function each: heartbeats + discovery, waiting for peers, training.

Kept apart from ``daemon.py`` so that file stays a table of contents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from distronet.node.coordinator_client import CoordinatorClientError
from distronet.node.exchange.base import ExchangeError, PeerDead
from distronet.node.exitcodes import ExitCode
from distronet.node.node_parts import bootstrap_addrs
from distronet.node.status import StatusLine
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.exchange import FellBehind
from distronet.node.sync import StateSnapshot
from distronet.node.trainer import StepResult
from distronet.protocol.identity import peer_id_to_b58

if TYPE_CHECKING:
    from distronet.node.daemon import Node

__all__ = ["discover", "heartbeats", "train", "wait_for_peers"]

log = logging.getLogger(__name__)
MAX_LOSSES = 2000


async def discover(node: Node) -> int:
    """Ask the coordinator for live peers (a fresh signed join) and dial those we are not connected to.

    Returns how many dials succeeded. Never raises for an unreachable coordinator or peer.
    """
    from distronet.node.daemon import CALL_S

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


async def wait_for_peers(node: Node) -> None:
    """Until ``min_peers`` nodes (this one included) share both gossip topics, dialling the
    coordinator's peers meanwhile. Raises ``NodeError(NETWORK)`` after ``start_timeout_s``."""
    from distronet.node.daemon import NodeError

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


def _line(node: Node) -> StatusLine | None:
    mode = node.cfg.observe.status
    if mode == "off":
        return None
    return StatusLine(live=None if mode == "auto" else False, prefix=f"[{node.identity.peer_id_b58[-6:]}] ")


async def _one_step(node: Node) -> StepResult | None:
    """Run step ``node.step`` in a worker thread. On a stop request the step may finish within
    ``shutdown_timeout_s``; else it is abandoned (None)."""
    fut = asyncio.ensure_future(asyncio.to_thread(node.trainer.step, node.step))
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
    s.step, s.loss = res.step, res.loss
    if s.first_step < 0:
        s.first_step = res.step
    s.losses.append(res.loss)
    del s.losses[1 : max(1, len(s.losses) - MAX_LOSSES)]
    s.bytes_up, s.bytes_down = stats.bytes_up, stats.bytes_down
    s.up_bps, s.down_bps = (stats.bytes_up - up0) / wall, (stats.bytes_down - down0) / wall
    report = node.optimizer.reports[-1] if node.optimizer.reports else None
    due = res.step - 1 if node.optimizer.cfg.overlap else res.step  # overlap applies round t-1 in step t
    if report is not None and report.step == due:
        s.rounds += 1
        s.own_accepted += int(report.own_accepted)
        m.packets.labels("accepted", "").inc(len(report.accepted))
        for code in report.rejected.values():
            m.packets.labels("rejected", code.name).inc()
        s.record_round(report.step, [peer_id_to_b58(p) for p in report.accepted])
    if node.core is not None:
        s.warmup_heard = node.core.warmup_heard
    if node.client is not None:
        s.pending_reports = node.client.pending
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


async def drift_check(node: Node) -> None:
    """Compare our state hash with the peers' offers for the same step; adopt the swarm's state
    when every peer at our step holds another one. Costs one small request per peer."""
    from distronet.node.swarm.statesync import ask_manifest

    assert node.swarm is not None
    assert node.donor is not None
    peers = list(set(await node.swarm.gossip.topic_peers(node.swarm.topic)))
    if not peers:
        return
    own = await node.donor.current()  # our offer at node.step, built now (it was offered lazily)
    if own is None or own.step != node.step:
        return
    mine = own.sha256
    offers = await asyncio.gather(*(ask_manifest(node.swarm, p, 5.0) for p in peers))
    same_step = [m.sha256 for m in offers if m is not None and m.step == node.step]
    if not same_step:
        node.metrics.drift.labels("skipped").inc()
        return
    if mine in same_step:
        node.status.drift_equal += 1
        node.metrics.drift.labels("equal").inc()
        return
    node.status.drift_differs += 1
    node.metrics.drift.labels("differs").inc()
    log.warning(
        "step %d: our parameters differ from all %d peers at this step; resyncing", node.step, len(same_step)
    )
    await node.catch_up(newer_than=node.step - 1, timeout=30.0)


async def _resync(node: Node, err: Exception) -> None:
    """After a failed round our parameters may differ from the swarm's: adopt the swarm's newer
    state. Raises ``NodeError(NETWORK)`` when none comes within ``shutdown_timeout_s``."""
    from distronet.node.daemon import NodeError

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


def _snapshot(node: Node, snapshot: StateSnapshot) -> tuple[Callable[[], bytes], str]:
    build = snapshot.take(node.step, node.trainer.model, node.optimizer)
    return build, snapshot.param_digest()


async def _offer(node: Node, snapshot: StateSnapshot) -> str:
    """Offer our state at ``node.step`` to newcomers and resyncing peers: one copy of it now
    (off the loop), serialised and hashed only if a peer asks (``StateDonor.offer_lazy``).
    Returns the parameter digest of that state (one sha256 pass over the copy)."""
    build, digest = await asyncio.to_thread(_snapshot, node, snapshot)
    if node.donor is not None:
        node.donor.offer_lazy(node.step, build)
    return digest


async def train(node: Node) -> None:
    """Train until a stop request, ``max_steps`` or ``max_seconds``; checkpoint every K steps and at
    the end; complete each shard once it has been read through and lease the next."""
    tc = node.cfg.train
    line = _line(node)
    snapshot = StateSnapshot()
    started = time.monotonic()
    await node.next_shard()
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
                res = await _one_step(node)
            except PeerDead:
                break
            except ExchangeError as e:
                await _resync(node, e)
                continue
            if res is None:
                return
            node.step = res.step + 1
            digest = await _offer(node, snapshot)
            _account(node, res, max(time.monotonic() - t0, 1e-6), up0, down0, digest)
            # A newcomer's first packets race rounds the others may have decided already; the
            # exchange can then hand it another accepted set. Checking right after a catch-up
            # (and every drift_every steps) finds that and adopts the swarm's state again.
            if node.step <= node.verify_until or (tc.drift_every and node.step % tc.drift_every == 0):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(drift_check(node), 15.0)
            node.status_file.write(node.status)
            if line is not None:
                line.show(node.status)
            if tc.checkpoint_every and node.step % tc.checkpoint_every == 0:
                await asyncio.to_thread(node.checkpoint)
    finally:
        if line is not None:
            line.end()
    if not node.abandoned and node.step > 0:
        await asyncio.to_thread(node.checkpoint)
    node.status_file.write(node.status)
