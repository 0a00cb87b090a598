"""The node daemon: ``await Node.create(cfg)``, ``await node.run()``, ``await node.close()``.

A node's life (``NodeState``; any other transition raises ``NodeStateError``)::

    CREATED → STARTING → WAITING_PEERS → TRAINING → STOPPING → CLOSED
                 └──────────────┴────────────┴──────────→ STOPPING / CLOSED   (stop or failure)

``create`` reads the run from the coordinator, loads (or makes) the identity in the data dir,
joins with a signed challenge, starts p2pd with the coordinator's bootstrap peers, subscribes
the exchange and builds model + ``DistroOptimizer`` over ``SwarmExchange``, resuming from the
local checkpoint when one exists. ``run`` waits for ``min_peers``, leases a shard and trains:
each step runs in a worker thread (torch never blocks the loop); heartbeats, peer discovery and
the status line run beside it. A stop request (SIGINT/SIGTERM) lets the step in flight finish
(within the wind-down bound below, else it is abandoned), checkpoints, and ``close`` leaves the run
(the coordinator reissues our lease at once) and stops p2pd. Every await that crosses a process
boundary has a deadline.

Shutdown is bounded whatever the coordinator's or the peers' health: after a stop request the
run winds down within ``shutdown_timeout_s - CLOSE_BUDGET_S`` (else whatever it is doing — the
step in flight, a catch-up, a shard report — is abandoned, logged with the coroutine chain it
was stuck in, and the process exits hard after ``close``), and each stage of ``close`` has its own cap
(``CLOSE_CAPS_S``, ``CLOSE_BUDGET_S`` in all; p2pd is SIGKILLed if its stage runs out).
``stage`` names what shutdown is doing (logged; ``join``'s watchdog prints it with every
thread's stack if the process is still alive past its deadline).

Errors::

    DistroError
    └── NodeError              the node cannot go on; ``exit_code`` says which ``ExitCode``
        └── NodeStateError     a bad state transition (a bug)
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from distronet.node.catchup.digests import DigestBoard
from distronet.node.catchup.replay import replay_node
from distronet.node.catchup.statesync import NoNewerState, StateDonor, fetch_state
from distronet.node.config import NodeConfig
from distronet.node.daemon import parts
from distronet.node.daemon.coordinator_client import (
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorUnreachable,
    Lease,
)
from distronet.node.daemon.metrics import NodeMetrics
from distronet.node.daemon.status import NodeStatus, StatusFile
from distronet.node.data.batch_share import SharedFeed
from distronet.node.data.shard_supply import DOWNLOAD_S, ShardSupply
from distronet.node.exchange.swarm import AsyncSwarmExchange, manifest_topic
from distronet.node.exchange.sync import SwarmExchange
from distronet.node.exitcodes import ExitCode
from distronet.node.models.spec import ModelSpec
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.stack import Swarm
from distronet.protocol.errors import ConfigError, DistroError

if TYPE_CHECKING:  # torch's modules load in a background thread while the node connects (_backend)
    from distronet.node.backends import ComputeBackend
    from distronet.node.daemon.trainer import BatchSource
    from distronet.node.swarm.hivemind_shim import PeerID

__all__ = ["Node", "NodeError", "NodeState", "NodeStateError"]

log = logging.getLogger(__name__)
T = TypeVar("T")
CALL_S = 15.0  # deadline of one call to the coordinator or p2pd
VERIFY_STEPS = 3  # a node that adopted the swarm's state checks its hash against peers this many steps
# Caps of close()'s stages (seconds), each independent of the coordinator's and peers' health.
CLOSE_CAPS_S: dict[str, float] = {
    "background tasks": 1.0,
    "leave the run": 3.0,
    "exchange": 1.5,
    "state donor": 1.0,
    "digest board": 1.0,
    "p2pd": 4.5,
    "coordinator client": 1.0,
}
CLOSE_BUDGET_S = sum(CLOSE_CAPS_S.values())  # 13 s: set aside for close() out of shutdown_timeout_s
MIN_WIND_DOWN_S = 2.0  # the step in flight gets at least this long after a stop request


class NodeError(DistroError):
    """The node cannot go on. ``exit_code`` is the process exit code to use."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NodeStateError(NodeError):
    """A transition the state machine does not allow (a bug in the caller)."""


class NodeState(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    WAITING_PEERS = "waiting_peers"
    TRAINING = "training"
    STOPPING = "stopping"
    CLOSED = "closed"


_NEXT: dict[NodeState, set[NodeState]] = {
    NodeState.CREATED: {NodeState.STARTING, NodeState.CLOSED},
    NodeState.STARTING: {NodeState.WAITING_PEERS, NodeState.STOPPING, NodeState.CLOSED},
    NodeState.WAITING_PEERS: {NodeState.TRAINING, NodeState.STOPPING},
    NodeState.TRAINING: {NodeState.STOPPING},
    NodeState.STOPPING: {NodeState.CLOSED},
    NodeState.CLOSED: set(),
}


async def deadline(aw: Awaitable[T], seconds: float, what: str, code: ExitCode = ExitCode.ERROR) -> T:
    """Await ``aw`` for at most ``seconds``; raise ``NodeError(code)`` naming ``what`` if late."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise NodeError(f"{what}: no answer within {seconds:.0f} s", code) from None


class Node:
    """One running node. Build with :meth:`create`; always :meth:`close` (idempotent)."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.state = NodeState.CREATED
        self.stop_requested = asyncio.Event()
        self.stop_at: float | None = None  # monotonic time of the first stop request
        self.stage = "created"  # what the node is doing; during shutdown, which stage (see close)
        self.abandoned = False  # a step was still running at close: exit the process hard
        self.client: CoordinatorClient | None = None
        self.swarm: Swarm | None = None
        self.core: AsyncSwarmExchange | None = None
        self.donor: StateDonor | None = None
        self.board: DigestBoard | None = None  # our parameter digests of recent steps, for drift checks
        self.model_lock = asyncio.Lock()  # held while a step (or a state load) changes the model
        self.metrics = NodeMetrics()
        self.run_info: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.verify_until = -1  # after adopting a state, drift-check every step up to here
        self._tokens: Any = None  # the current shard's tokens (numpy, 1-D)
        self.supply: ShardSupply | None = None  # completes shards, fetches the next one ahead
        self.catch_up_failed = False  # the last catch_up could not fetch or load a peer's state

    def _to(self, new: NodeState) -> None:
        if new not in _NEXT[self.state]:
            raise NodeStateError(f"node cannot go from {self.state.value} to {new.value}")
        log.debug("state %s -> %s", self.state.value, new.value)
        self.state = new
        if hasattr(self, "status"):
            self.status.state = new.value

    # ------------------------------------------------------------------ build

    @classmethod
    async def create(cls, cfg: NodeConfig) -> Node:
        """Build and connect every part (module docstring). On failure, what was built is closed.

        Raises ``NodeError`` with the exit code to use (coordinator unreachable, refused, p2pd).
        """
        self = cls(cfg)
        log.info("starting: run %s, coordinator %s", cfg.run_id, cfg.coordinator)
        self._to(NodeState.STARTING)
        try:
            await self._build()
        except BaseException:
            await self.close()
            raise
        self._to(NodeState.WAITING_PEERS)
        return self

    async def _build(self) -> None:
        cfg, data = self.cfg, self.cfg.data_path
        backend = None
        if cfg.train.device not in ("auto", "cpu"):  # one that may be absent fails before the network
            backend = await self._backend()
        self.identity, key_path = parts.load_identity(data)
        self.client = CoordinatorClient(
            cfg.coordinator, cfg.run_id, self.identity, buffer_path=data / "reports.jsonl", timeout_s=CALL_S
        )
        try:
            self.run_info = await deadline(
                self.client.get_run(), CALL_S, "coordinator", ExitCode.COORDINATOR_UNREACHABLE
            )
            spec = ModelSpec.from_run(self.run_info["model"])
            dcfg = parts.optimizer_config(cfg.run_id, self.run_info["optimizer"])
            xcfg = parts.exchange_config(self.run_info["exchange"])
            joined = await self.client.join(join_token=cfg.join_token or None, agent="distro-node")
        except CoordinatorUnreachable as e:
            raise NodeError(
                f"{e}; check --coordinator and that it is running", ExitCode.COORDINATOR_UNREACHABLE
            ) from e
        except CoordinatorRefused as e:
            raise NodeError(str(e), ExitCode.REJECTED) from e
        except ConfigError as e:
            raise NodeError(f"the run's definition is not usable by this node: {e}", ExitCode.USAGE) from e
        self.client.resume()
        self.status = NodeStatus(cfg.run_id, self.identity.peer_id_b58, state=self.state.value)
        self.status_file = StatusFile(data / "status.json")
        self.heartbeat_s = float(joined.heartbeat_interval_s)
        boot = parts.bootstrap_addrs(joined.bootstrap_peers, self.identity.peer_id_b58)
        self.run_has_peers = bool(boot)  # a run in progress: wait for at least one peer, then catch up
        try:
            self.swarm = await parts.start_swarm(cfg, cfg.run_id, self.identity, key_path, boot)
            self.core = await AsyncSwarmExchange.create(self.swarm, xcfg)
            self.donor = await deadline(
                StateDonor.create(self.swarm), CALL_S, "state donor", ExitCode.NETWORK
            )
            self.board = await deadline(
                DigestBoard.create(self.swarm.host), CALL_S, "digest board", ExitCode.NETWORK
            )
            self.maddrs = await self.swarm.host.maddrs()
        except SwarmError as e:
            raise NodeError(f"the libp2p daemon could not start or join: {e}", ExitCode.NETWORK) from e
        log.info("p2pd up, %d bootstrap address(es); building the model", len(boot))
        await self.client.heartbeat(0, multiaddrs=self.maddrs)
        self.backend = backend or await self._backend()
        self._build_training(spec, dcfg)

    async def _backend(self) -> ComputeBackend:
        """The compute backend, once torch has loaded (``join`` starts that in a background thread,
        ``node_parts.preload_torch``, so it overlaps the coordinator calls and p2pd's start)."""
        await asyncio.to_thread(parts.wait_torch, 300.0)
        from distronet.node.backends import pick_backend

        try:
            return pick_backend(self.cfg.train.device)
        except ConfigError as e:
            raise NodeError(str(e), ExitCode.USAGE) from e

    def _batches(self, spec: ModelSpec) -> BatchSource:
        """The trainer's batch source: the leased shard's ``batch`` windows a step, or — when the
        run sets ``global_batch`` — this node's share of it among the last applied round's
        accepted peers (the same set on every replica), so survivors take over a dead peer's."""
        if not spec.global_batch:
            return self.feed

        def live() -> tuple[Sequence[bytes], bytes]:
            reports = self.optimizer.reports
            return (reports[-1].accepted if reports else ()), self.identity.peer_id

        return SharedFeed(self.feed.draw, spec.global_batch, live)

    def _build_training(self, spec: ModelSpec, dcfg: Any) -> None:
        cfg = self.cfg
        import torch

        from distronet.node.catchup.state import state_blob
        from distronet.node.daemon.checkpoint import load_checkpoint
        from distronet.node.daemon.trainer import Trainer
        from distronet.node.models.build import build_model
        from distronet.node.optim.distro import DistroOptimizer

        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        assert self.core is not None
        model = build_model(spec, self.backend.device)
        self.exchange = SwarmExchange(self.core, asyncio.get_running_loop())
        self.optimizer = DistroOptimizer(model.named_parameters(), dcfg, self.exchange, self.identity)
        self.feed = parts.ShardFeed(
            spec.seed, parts.peer_index(self.identity.peer_id), spec.batch, spec.seq_len
        )
        self.dcfg = dcfg
        self.trainer = Trainer(model, self.optimizer, self._batches(spec), self.backend)
        self.status.device = self.backend.name
        self.metrics.device.labels(self.backend.name).set(1)
        log.info("computing on %s", self.backend.describe())
        self.step = 0
        self.ckpt_path = cfg.data_path / "checkpoint.pt"
        ckpt = load_checkpoint(self.ckpt_path, run_id=cfg.run_id)
        if ckpt is not None:
            model.load_state_dict(ckpt.model)
            self.optimizer.load_state_dict(ckpt.optimizer)
            self.optimizer.resume_at(ckpt.step)
            self.step = ckpt.step
            log.info("resumed from %s at step %d", self.ckpt_path, ckpt.step)
        assert self.donor is not None
        # The starting state is offered now (a peer that starts beside us must see step 0, not
        # the state after our first step); later ones are snapshotted when a peer asks.
        self.donor.offer(self.step, state_blob(self.step, model, self.optimizer))
        self.donor.serve_from(lambda: self.step, self.snapshot_state)
        up, down = self.swarm.bandwidth.up.rate, self.swarm.bandwidth.down.rate  # type: ignore[union-attr]
        self.status.up_budget, self.status.down_budget = up, down
        self.metrics.set_budget(up, down)
        if cfg.observe.metrics_port:
            self.metrics.serve(cfg.observe.metrics_host, cfg.observe.metrics_port)

    # ------------------------------------------------------------------ run

    def request_stop(self) -> None:
        """Finish (or abandon) the step in flight, then stop. Safe to call more than once."""
        if self.stop_at is None:
            self.stop_at = time.monotonic()
        self.stop_requested.set()

    def wind_down_s(self) -> float:
        """Seconds the run may still take to wind down after the stop request (the step in
        flight, the final checkpoint): ``shutdown_timeout_s`` less ``CLOSE_BUDGET_S``, at least
        ``MIN_WIND_DOWN_S``, less the time since the request."""
        since = 0.0 if self.stop_at is None else time.monotonic() - self.stop_at
        return max(MIN_WIND_DOWN_S, self.cfg.shutdown_timeout_s - CLOSE_BUDGET_S) - since

    def _set_stage(self, stage: str) -> None:
        self.stage = stage
        log.info("shutdown: %s", stage)

    async def run(self) -> ExitCode:
        """Wait for peers, lease, train until stopped or ``max_steps``/``max_seconds``; ``ExitCode.OK``.

        Raises ``NodeError`` when the run cannot go on (no peers in time, no shard, ...).
        """
        from distronet.node.daemon import loops as node_loop

        self._tasks.append(asyncio.create_task(node_loop.heartbeats(self), name="heartbeats"))
        self._tasks.append(asyncio.create_task(node_loop.watch_links(self), name="gossip links"))
        body = asyncio.ensure_future(self._run_body())
        stop = asyncio.ensure_future(self.stop_requested.wait())
        try:
            await asyncio.wait({body, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not body.done():
                self.stage = "finishing the step in flight"
                done, _ = await asyncio.wait({body}, timeout=max(0.0, self.wind_down_s()))
                if not done:
                    log.warning(
                        "shutdown: the run did not wind down within %.0f s of the stop request "
                        "(%s): abandoned",
                        max(MIN_WIND_DOWN_S, self.cfg.shutdown_timeout_s - CLOSE_BUDGET_S),
                        self.stage,
                    )
                    log.warning("shutdown: the run was here when abandoned:\n%s", parts.awaiting(body))
                    self.abandoned = True  # a worker thread may still be inside the step
                    body.cancel()
                    await asyncio.wait({body}, timeout=1.0)
                    if self.state is not NodeState.STOPPING:
                        self._to(NodeState.STOPPING)
                    return ExitCode.OK
            return body.result()
        finally:
            stop.cancel()
            if not body.done():
                body.cancel()

    async def _run_body(self) -> ExitCode:
        from distronet.node.daemon import loops as node_loop

        try:
            self.stage = "waiting for peers"
            await node_loop.wait_for_peers(self)
            log.info("%d peer(s) in the mesh", self.status.peers)
            if self.stop_requested.is_set():
                self._to(NodeState.STOPPING)
                return ExitCode.OK
            if self.status.peers:  # a newcomer to a running swarm starts from its current state
                self.stage = "catching up"
                await self._first_catch_up(timeout=30.0)
            self._to(NodeState.TRAINING)
            self.stage = "training"
            await node_loop.train(self)
        finally:
            if self.state is not NodeState.STOPPING:
                self._to(NodeState.STOPPING)
        return ExitCode.OK

    async def live_peers(self) -> int:
        """Other nodes in both of our gossip topics (0 when the swarm is gone)."""
        if self.swarm is None or not self.swarm.host.alive:
            return 0
        a = set(await self.swarm.gossip.topic_peers(self.swarm.topic))
        b = set(await self.swarm.gossip.topic_peers(manifest_topic(self.cfg.run_id)))
        return len(a & b)

    async def next_shard(self) -> None:
        """Complete the current lease (if any) and switch to the next shard, fetched one ahead
        (``node/data/shard_supply.py``: a boundary never waits for a slow coordinator).

        Keeps training on the old shard when no new one is here yet (it is completed only once:
        the report is queued while the coordinator is down and replayed later). Raises
        ``NodeError`` when there is no shard at all, and a failed first download.
        """
        assert self.client is not None
        if self.supply is None:
            self.supply = ShardSupply(
                self.client,
                self.cfg.coordinator,
                self.cfg.data_path / "shards",
                self.run_info["data"]["dtype"],
                on_completed=self._credited,
            )
        old = self.feed.lease
        try:
            got = await self.supply.next(old)
        except asyncio.TimeoutError:
            raise NodeError(f"shard download: no answer within {DOWNLOAD_S:.0f} s") from None
        if got is None:
            if old is None:
                raise NodeError("the coordinator has no shard to lease to this node", ExitCode.REJECTED)
            self.feed.switch(old, self._tokens, self.step)  # read the old shard again
            return
        lease, self._tokens = got
        self.feed.switch(lease, self._tokens, self.step)
        self.status.shard = lease.shard_id

    def _credited(self, lease: Lease) -> None:
        self.status.shards_done += 1
        self.status.completed_units.append(lease.unit)

    async def _first_catch_up(self, timeout: float) -> None:
        """Adopt the swarm's state before the first step; try again (within ``timeout``) while
        fetching fails (a donor moved on mid-download), not when the swarm has nothing newer."""
        end = time.monotonic() + timeout
        while not await self.catch_up(
            newer_than=self.step, timeout=max(1.0, end - time.monotonic()), joining=True
        ):
            if not self.catch_up_failed or time.monotonic() >= end or self.stop_requested.is_set():
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_requested.wait(), 0.3)

    async def catch_up(
        self,
        *,
        newer_than: int,
        timeout: float,
        donors: Sequence[PeerID] | None = None,
        joining: bool = False,
    ) -> bool:
        """Adopt the newest state the peers agree on if its step is > ``newer_than``; True if adopted.

        ``donors``: fetch only from these peers (the drift check's winning group: our state
        differs, so no replay); default: every peer on the run's topic, and a node a few rounds
        behind replays them instead (``node/catchup/replay.py``; ``joining``: a swarm at most one step
        ahead is in step with us, nothing is downloaded). A downloaded state restarts momentum at
        zero (ARCHITECTURE.md §5). Raises nothing for a swarm that has no newer state;
        ``ExchangeError``-free: the exchange is reused as it is.
        """
        assert self.swarm is not None
        self.catch_up_failed = False
        replay = donors is None
        if donors is None:
            donors = list(set(await self.swarm.gossip.topic_peers(self.swarm.topic)))
        if not donors:
            return False
        peers = [p.to_bytes() for p in donors]
        if replay and self.core is not None:
            replayed = await replay_node(self, peers, min(timeout, 20.0), verify_steps=VERIFY_STEPS)
            if replayed or (replayed is False and joining):
                return bool(replayed)
            newer_than = max(newer_than, self.step)  # rounds replayed before it stopped count
        try:
            manifest, blob = await fetch_state(
                self.swarm,
                donors,
                timeout=timeout,
                per_donor=2,
                progress=parts.DownloadProgress("state"),
                newer_than=newer_than,
            )
        except NoNewerState:
            return False
        except (SwarmError, asyncio.TimeoutError) as e:
            log.info("no state to catch up from: %s", e)
            self.catch_up_failed = True
            return False
        if manifest.step <= newer_than:
            return False
        from distronet.node.catchup.state import load_state_blob
        from distronet.node.optim.distro import DistroOptimizer

        model = self.trainer.model
        fresh = DistroOptimizer(model.named_parameters(), self.dcfg, self.exchange, self.identity)
        async with self.model_lock:  # no state snapshot of a half-loaded model
            try:
                step = await asyncio.to_thread(load_state_blob, blob, model, fresh)
            except ConfigError as e:
                log.warning("a peer's state does not fit this run's model: %s", e)
                self.catch_up_failed = True
                return False
            self.optimizer = fresh
            self.optimizer.resume_at(step)
            self.trainer.optimizer = self.optimizer
            log.info("caught up: adopted the swarm's state at step %d (was at %d)", step, self.step)
            self.step = step
        if self.donor is not None:
            self.donor.offer(step, blob)
        if replay and self.core is not None:  # the swarm moved on during the download
            await replay_node(self, peers, 10.0, verify_steps=VERIFY_STEPS)
        self.status.resyncs += 1
        self.status.resync_steps.append(self.step)  # where it resumes, with momentum at zero
        self.verify_until = self.step + VERIFY_STEPS
        if self.core is not None:  # zero momentum: our next packets are masked warm-up packets
            self.status.warmup_until = self.core.start_warmup(self.step)
        return True

    async def snapshot_state(self) -> tuple[int, bytes]:
        """``(step, state blob)`` of the next step boundary (now, if no step is running): what the
        donor serves on request. Copies params + replicated optimizer state once (~10 ms for the
        default model, in a worker thread); the next step waits for that copy."""
        from distronet.node.catchup.state import state_blob

        async with self.model_lock:
            step = self.step
            return step, await asyncio.to_thread(state_blob, step, self.trainer.model, self.optimizer)

    def checkpoint(self) -> None:
        """Save model + optimizer at ``self.step`` (the next step to run). Runs on the caller's thread."""
        from distronet.node.daemon.checkpoint import Checkpoint, save_checkpoint

        model = self.trainer.model
        save_checkpoint(
            self.ckpt_path,
            Checkpoint(
                self.cfg.run_id,
                self.step,
                self.trainer.digest(),
                model.state_dict(),
                self.optimizer.state_dict(),
            ),
        )

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Leave the run, stop the exchange and p2pd, stop /metrics. Never raises; idempotent.

        Each stage is capped (``CLOSE_CAPS_S``): a dead or stalled coordinator or peer costs at
        most that stage's cap; p2pd is SIGKILLed when its orderly stop runs out of time.
        """
        if self.state is NodeState.CLOSED:
            return
        if self.state is not NodeState.STOPPING and NodeState.STOPPING in _NEXT[self.state]:
            self._to(NodeState.STOPPING)
        self._set_stage("background tasks")
        for task in self._tasks:
            task.cancel()
        waits: list[asyncio.Future[Any]] = list(self._tasks)
        if self.supply is not None:  # the shard ahead stops; a completion report gets sent or queued
            waits.append(asyncio.ensure_future(self.supply.close()))
        if waits:
            await asyncio.wait(waits, timeout=CLOSE_CAPS_S["background tasks"])
        if self.client is not None:
            await self._capped("leave the run", self.client.leave())
        if self.core is not None:
            await self._capped("exchange", self.core.close())
        if self.donor is not None:
            await self._capped("state donor", self.donor.close())
        if self.board is not None:
            await self._capped("digest board", self.board.close())
        if self.swarm is not None and not await self._capped("p2pd", self.swarm.close(leave=True)):
            self.swarm.host.kill()  # its orderly stop ran out of time: no p2pd outlives us
        if self.client is not None:
            await self._capped("coordinator client", self.client.close())
        self._set_stage("closed")
        self.metrics.close()
        self._to(NodeState.CLOSED)
        if hasattr(self, "status"):
            with contextlib.suppress(OSError):
                self.status_file.write(self.status)

    async def _capped(self, stage: str, aw: Awaitable[Any]) -> bool:
        """Run one stage of ``close`` for at most ``CLOSE_CAPS_S[stage]``; True if it finished
        (an error counts as finished: it is logged, never raised)."""
        self._set_stage(stage)
        cap = CLOSE_CAPS_S[stage]
        try:
            await asyncio.wait_for(aw, cap)
        except asyncio.TimeoutError:
            log.warning("shutdown: %s did not finish within %.1f s; going on", stage, cap)
            return False
        except Exception as e:  # close never raises; what failed is logged
            log.info("shutdown: %s failed: %r", stage, e)
        return True

    @property
    def loss(self) -> float:
        return self.status.loss if hasattr(self, "status") else math.nan

    def uptime(self, since: float) -> float:
        return time.monotonic() - since
