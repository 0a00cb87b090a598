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

Where things are: the parts are made in ``parts.py`` (identity, run tables, p2pd) and
``training.py`` (model, optimizer, trainer, checkpoint; imports torch); the loops in ``loops.py``
take them as one ``LoopParts``; catch-up (replay, state download, drift repair, resync after a
failed round) is ``node/catchup/resync.py``; shards are ``shards.py``.

Errors (``errors.py``)::

    DistroError
    └── NodeError              the node cannot go on; ``exit_code`` says which ``ExitCode``
        └── NodeStateError     a bad state transition (a bug)
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distronet.node.catchup.digests import DigestBoard
from distronet.node.catchup.resync import CatchUp
from distronet.node.catchup.statesync import StateDonor
from distronet.node.config import NodeConfig
from distronet.node.daemon import loops, parts
from distronet.node.daemon.coordinator_client import (
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorUnreachable,
    JoinResult,
)
from distronet.node.daemon.errors import CALL_S, NodeError, NodeStateError, deadline
from distronet.node.daemon.loops import LoopParts
from distronet.node.daemon.metrics import NodeMetrics
from distronet.node.daemon.reachwatch import ReachWatch
from distronet.node.daemon.shards import Shards
from distronet.node.daemon.status import NodeStatus, StatusFile
from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig
from distronet.node.exitcodes import ExitCode
from distronet.node.models.spec import HF_EXTRA_HINT, ModelSpec, hf_installed
from distronet.node.optim.config import DistroConfig
from distronet.node.swarm.admission import Admission
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.stack import Swarm
from distronet.protocol.errors import ConfigError, Rejected
from distronet.protocol.identity import Identity

if TYPE_CHECKING:  # types only: backends import torch, which loads in the background (_backend)
    from distronet.node.backends import ComputeBackend

__all__ = ["CALL_S", "CLOSE_BUDGET_S", "CLOSE_CAPS_S", "Node", "NodeError", "NodeState", "NodeStateError"]

log = logging.getLogger(__name__)
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
FIRST_CATCH_UP_S = 30.0  # a newcomer's catch-up before its first step, retries included


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


class Node:
    """One running node. Build with :meth:`create`; always :meth:`close` (idempotent)."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.state = NodeState.CREATED
        self.stop_requested = asyncio.Event()
        self.stop_at: float | None = None  # monotonic time of the first stop request
        self.stage = "created"  # what the node is doing; during shutdown, which stage (see close)
        self.abandoned = False  # the run was still busy at the wind-down deadline: it was cancelled
        self.client: CoordinatorClient | None = None
        self.join_sent = False  # close() leaves the run only once a join was asked for
        self.run_info: dict[str, Any] = {}
        self.status: NodeStatus | None = None
        self.status_file: StatusFile | None = None
        self.swarm: Swarm | None = None
        self.core: AsyncSwarmExchange | None = None
        self.admission = Admission("-", None)  # who the swarm admits (parts.admission, at connect)
        self.donor: StateDonor | None = None
        self.board: DigestBoard | None = None  # our parameter digests of recent steps, for drift checks
        self.metrics = NodeMetrics()
        self.parts: LoopParts | None = None  # everything the loops use, once built
        self._tasks: list[asyncio.Task[None]] = []

    def _to(self, new: NodeState) -> None:
        if new not in _NEXT[self.state]:
            raise NodeStateError(f"node cannot go from {self.state.value} to {new.value}")
        log.debug("state %s -> %s", self.state.value, new.value)
        self.state = new
        if self.status is not None:
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
        cfg = self.cfg
        backend = None
        if cfg.train.device not in ("auto", "cpu"):  # one that may be absent fails before the network
            backend = await self._backend()
        identity, key_path = parts.load_identity(cfg.data_path)
        reports = cfg.data_path / "reports.jsonl"  # what the coordinator missed while it was down
        self.client = CoordinatorClient(
            cfg.coordinator, cfg.run_id, identity, buffer_path=reports, timeout_s=CALL_S
        )
        spec, dcfg, xcfg, joined = await self._read_and_join(self.client, backend)
        self.client.resume()
        self.status = NodeStatus(cfg.run_id, identity.peer_id_b58, state=self.state.value)
        self.status_file = StatusFile(cfg.data_path / "status.json")
        boot = parts.bootstrap_addrs(joined.bootstrap_peers, identity.peer_id_b58)
        maddrs = await self._connect(identity, key_path, boot, xcfg, joined.relays)
        log.info("p2pd up, %d bootstrap address(es); building the model", len(boot))
        await self.client.heartbeat(0, multiaddrs=maddrs)
        if backend is None and cfg.train.device != "cpu":  # --device auto: its device is known now
            backend = await self._backend()
            self._check_fit(spec, dcfg, backend)
        backend = backend or await self._backend()
        await self._fetch_tokenizer()  # after the fit check: nothing large before it
        # a run in progress (it has peers): wait for at least one of them, then catch up
        self.parts = await self._assemble(spec, dcfg, backend, identity, joined, maddrs, bool(boot))

    async def _read_and_join(
        self, client: CoordinatorClient, backend: ComputeBackend | None
    ) -> tuple[ModelSpec, DistroConfig, ExchangeConfig, JoinResult]:
        """The run's model, optimizer and exchange tables (checked before joining), and the join.
        The fit check runs here, before joining, when the device is known without torch
        (``--device cpu``) or ``backend`` is already built (a named device); with ``--device
        auto`` it runs once torch has loaded (``_build``), still before anything large is fetched."""
        try:
            run_info = await deadline(
                client.get_run(), CALL_S, "coordinator", ExitCode.COORDINATOR_UNREACHABLE
            )
            spec = ModelSpec.from_run(run_info["model"])
            parts.check_vocab(spec, run_info.get("data", {}))
            if spec.arch == "hf" and not hf_installed():  # before joining: we could not train it
                raise ConfigError(f"arch = 'hf' needs transformers, not installed here: {HF_EXTRA_HINT}")
            dcfg = parts.optimizer_config(self.cfg.run_id, run_info["optimizer"])
            xcfg = parts.exchange_config(run_info["exchange"])
            if backend is not None or self.cfg.train.device == "cpu":
                self._check_fit(spec, dcfg, backend)
            self.join_sent = True
            joined = await client.join(join_token=self.cfg.join_token or None, agent="distro-node")
        except CoordinatorUnreachable as e:
            raise NodeError(
                f"{e}; check --coordinator and that it is running", ExitCode.COORDINATOR_UNREACHABLE
            ) from e
        except CoordinatorRefused as e:
            raise NodeError(str(e), ExitCode.REJECTED) from e
        except ConfigError as e:
            raise NodeError(f"the run's definition is not usable by this node: {e}", ExitCode.USAGE) from e
        self.run_info = run_info
        return spec, dcfg, xcfg, joined

    def _check_fit(self, spec: ModelSpec, dcfg: DistroConfig, backend: ComputeBackend | None) -> None:
        """Refuse the run when its model does not fit this device at this node's micro-batch
        (``models.fit``; ``backend`` None: the CPU in fp32). Raises ``NodeError`` with
        ``ExitCode.WONT_FIT``, its message saying what to change; ``--no-fit-check`` skips it."""
        from distronet.node.models import fit

        train = self.cfg.train
        if not train.fit_check:
            log.info("fit check skipped (--no-fit-check)")
            return
        device = backend.name if backend is not None else "cpu"
        precision = backend.precision if backend is not None else "fp32"
        try:
            usable = fit.usable_memory(device, fit.parse_size(train.memory_cap) if train.memory_cap else 0)
            verdict = fit.check_fit(
                spec, usable, dcfg, micro_batch=train.micro_batch,
                checkpointing=train.activation_checkpointing, device=device, precision=precision,
            )  # fmt: skip
        except ConfigError as e:
            raise NodeError(f"fit check: {e}", ExitCode.USAGE) from e
        if not verdict.fits:
            raise NodeError(f"this run does not fit here: {verdict.message()}", ExitCode.WONT_FIT)
        log.info("fit check: %s", verdict.message())

    def _take_credential(self, raw: bytes | None) -> None:
        """Our newest credential: attached to our announcements, known to our admission registry."""
        if raw is None or self.core is None:
            return
        self.core.credential = raw
        if self.swarm is not None:
            self.swarm.membership.credential = raw  # written at the record's next renewal
        try:
            self.admission.offer(raw)
        except Rejected as e:
            log.warning("the coordinator's credential for us does not verify: %s", e)

    async def _connect(
        self,
        identity: Identity,
        key_path: Path,
        boot: tuple[str, ...],
        xcfg: ExchangeConfig,
        relays: tuple[str, ...] = (),
    ) -> list[str]:
        """p2pd, the exchange, the state donor and the digest board; our dialable addresses."""
        try:
            self.swarm = await parts.start_swarm(self.cfg, self.cfg.run_id, identity, key_path, boot, relays)
            self.admission = parts.admission(self.cfg, self.run_info)
            self.core = await AsyncSwarmExchange.create(self.swarm, xcfg, self.admission)
            self._take_credential(self.client.credential if self.client is not None else None)
            if self.client is not None:
                self.client.on_credential = self._take_credential
            self.swarm.membership.on_members = self.admission.learn_members
            self.donor = await deadline(
                StateDonor.create(self.swarm), CALL_S, "state donor", ExitCode.NETWORK
            )
            self.board = await deadline(
                DigestBoard.create(self.swarm.host, identity, self.swarm.run_id),
                CALL_S,
                "digest board",
                ExitCode.NETWORK,
            )
            return await self.swarm.host.maddrs()
        except SwarmError as e:
            raise NodeError(f"the libp2p daemon could not start or join: {e}", ExitCode.NETWORK) from e

    async def _backend(self) -> ComputeBackend:
        """The compute backend, once torch has loaded (``join`` starts that in a background thread,
        ``parts.preload_torch``, so it overlaps the coordinator calls and p2pd's start)."""
        await asyncio.to_thread(parts.wait_torch, 300.0)
        from distronet.node.backends import pick_backend  # imports torch: loaded by now

        try:
            return pick_backend(self.cfg.train.device, self.cfg.train.precision)
        except ConfigError as e:
            raise NodeError(str(e), ExitCode.USAGE) from e

    async def _fetch_tokenizer(self) -> None:
        """The run's tokenizer, when its manifest names one: fetched once into the data dir and
        kept only when its sha256 is the run info's (``data/tokenizer_fetch.py``); a cached copy
        is not downloaded again. A coordinator that serves none is logged (training needs only
        the shards; `distro-node export` then wants ``--tokenizer``)."""
        from distronet.node.data import tokenizer_fetch as tf

        data = self.run_info.get("data", {})
        try:
            path = await tf.ensure_run_tokenizer(
                self.cfg.coordinator, self.cfg.run_id, data, self.cfg.data_path
            )
        except tf.TokenizerNotServed as e:
            log.warning("%s; training goes on (export will need --tokenizer)", e)
            return
        except tf.TokenizerUnavailable as e:
            raise NodeError(f"{e}; check the coordinator", ExitCode.COORDINATOR_UNREACHABLE) from e
        except tf.TokenizerMismatch as e:
            raise NodeError(str(e), ExitCode.TOKENIZER_MISMATCH) from e
        except tf.TokenizerError as e:
            raise NodeError(f"the run's tokenizer is not usable by this node: {e}", ExitCode.USAGE) from e
        if path is not None:
            log.info("the run's tokenizer: %s (sha256 verified)", path)

    async def _assemble(
        self,
        spec: ModelSpec,
        dcfg: DistroConfig,
        backend: ComputeBackend,
        identity: Identity,
        joined: JoinResult,
        maddrs: list[str],
        run_has_peers: bool,
    ) -> LoopParts:
        """The training half (``training.py``), catch-up, shards, /metrics: the loops' parts."""
        from distronet.node.daemon import training  # imports torch: loaded by now (_backend)

        cfg, status, status_file, metrics = self.cfg, self.status, self.status_file, self.metrics
        assert self.client and self.swarm and self.core and self.donor and self.board
        assert status is not None and status_file is not None
        status.device = backend.name
        metrics.device.labels(backend.name).set(1)
        log.info("computing on %s", backend.describe())
        built = training.build_training(cfg, spec, dcfg, backend, self.core, identity)
        replica = built.replica
        # The starting state is offered now (a peer that starts beside us must see step 0, not
        # the state after our first step); later ones are snapshotted when a peer asks.
        self.donor.offer(*await replica.snapshot())
        self.donor.serve_from(lambda: replica.step, replica.snapshot, replica.state_at)
        up, down = self.swarm.bandwidth.up.rate, self.swarm.bandwidth.down.rate
        status.up_budget, status.down_budget = up, down
        metrics.set_budget(up, down)
        if cfg.observe.metrics_port:
            metrics.serve(cfg.observe.metrics_host, cfg.observe.metrics_port)
        catchup = CatchUp(
            self.swarm, self.core, self.donor, self.board, replica, status,
            count_drift=lambda result: metrics.drift.labels(result).inc(), stop=self.stop_requested,
            quorum=cfg.train.state_quorum, admitted=self.admission.admits,
        )  # fmt: skip
        dtype, vocab = self.run_info["data"]["dtype"], self.run_info["data"].get("vocab_size")
        folder = cfg.data_path / "shards"
        shards = Shards(self.client, cfg.coordinator, folder, dtype, built.feed, status, vocab)
        return LoopParts(
            cfg=cfg, identity=identity, client=self.client, swarm=self.swarm, core=self.core,
            trainer=built.trainer, replica=replica, catchup=catchup, shards=shards, status=status,
            status_file=status_file, metrics=metrics,
            checkpoint=functools.partial(training.save, built, cfg.run_id), stop=self.stop_requested,
            maddrs=maddrs, heartbeat_s=float(joined.heartbeat_interval_s), run_has_peers=run_has_peers,
            reach=ReachWatch(
                cfg.net.reach_diagnosis_after_s, cfg.net.reach_diagnosis_every_s,
                p2pd_metrics_port=cfg.net.p2pd_metrics_port,
            ),
        )  # fmt: skip

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

    async def run(self) -> ExitCode:
        """Wait for peers, lease, train until stopped or ``max_steps``/``max_seconds``; ``ExitCode.OK``.

        Raises ``NodeError`` when the run cannot go on (no peers in time, no shard, ...).
        """
        assert self.parts is not None, "run() needs a node built by Node.create"
        self._tasks.append(asyncio.create_task(loops.heartbeats(self.parts), name="heartbeats"))
        self._tasks.append(asyncio.create_task(loops.watch_links(self.parts), name="gossip links"))
        body = asyncio.ensure_future(self._run_body(self.parts))
        stop = asyncio.ensure_future(self.stop_requested.wait())
        try:
            await asyncio.wait({body, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not body.done():
                self.stage = "finishing the step in flight"
                done, _ = await asyncio.wait({body}, timeout=max(0.0, self.wind_down_s()))
                if not done:
                    await self._abandon(body)
                    return ExitCode.OK
            return body.result()
        finally:
            stop.cancel()
            if not body.done():
                body.cancel()

    async def _abandon(self, body: asyncio.Future[ExitCode]) -> None:
        """The run did not wind down in time: log where it was stuck, cancel it."""
        log.warning(
            "shutdown: the run did not wind down within %.0f s of the stop request (%s): abandoned",
            max(MIN_WIND_DOWN_S, self.cfg.shutdown_timeout_s - CLOSE_BUDGET_S),
            self.stage,
        )
        log.warning("shutdown: the run was here when abandoned:\n%s", parts.awaiting(body))
        self.abandoned = True  # a worker thread may still be inside the step
        body.cancel()
        await asyncio.wait({body}, timeout=1.0)
        if self.state is not NodeState.STOPPING:
            self._to(NodeState.STOPPING)

    async def _run_body(self, lp: LoopParts) -> ExitCode:
        try:
            self.stage = "waiting for peers"
            await loops.wait_for_peers(lp)
            log.info("%d peer(s) in the mesh", lp.status.peers)
            if self.stop_requested.is_set():
                self._to(NodeState.STOPPING)
                return ExitCode.OK
            if lp.status.peers:  # a newcomer to a running swarm starts from its current state
                self.stage = "catching up"
                await lp.catchup.join(timeout=FIRST_CATCH_UP_S)
            self._to(NodeState.TRAINING)
            self.stage = "training"
            await loops.train(lp)
        finally:
            if self.state is not NodeState.STOPPING:
                self._to(NodeState.STOPPING)
        return ExitCode.OK

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
        if self.parts is not None:  # the shard ahead stops; a completion report gets sent or queued
            waits.append(asyncio.ensure_future(self.parts.shards.close()))
        if waits:
            await asyncio.wait(waits, timeout=CLOSE_CAPS_S["background tasks"])
        if self.client is not None and self.join_sent:
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
        if self.status is not None and self.status_file is not None:
            with contextlib.suppress(OSError):
                self.status_file.write(self.status)

    def _set_stage(self, stage: str) -> None:
        self.stage = stage
        log.info("shutdown: %s", stage)

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
