"""The training half of a node: model, ``DistroOptimizer`` over the exchange, trainer, resumed from
the local checkpoint (:func:`build_training`); and saving that checkpoint (:func:`save`).

Imports torch: the daemon imports this module only once torch has loaded
(``parts.preload_torch``), so that the node connects to the coordinator and starts p2pd meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from distronet.node.backends import ComputeBackend
from distronet.node.catchup.errors import StateRefused
from distronet.node.catchup.guard_state import guard_state, load_guard_state
from distronet.node.catchup.replica import Replica
from distronet.node.config import NodeConfig
from distronet.node.daemon.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from distronet.node.daemon.parts import ShardFeed, peer_index
from distronet.node.daemon.trainer import BatchSource, Trainer
from distronet.node.data.batch_share import SharedFeed
from distronet.node.exchange.swarm import AsyncSwarmExchange, packet_check
from distronet.node.exchange.sync import SwarmExchange
from distronet.node.models.build import build_model, set_checkpointing
from distronet.node.models.spec import ModelSpec
from distronet.node.optim.config import DistroConfig
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

__all__ = ["CHECKPOINT_FILE", "Training", "build_training", "save"]

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "checkpoint.safetensors"  # in the data dir (checkpoint.py: format 2)
OLD_CHECKPOINT_FILE = "checkpoint.pt"  # an older node's torch file (format 1): not read


@dataclass(frozen=True)
class Training:
    """What :func:`build_training` made: the trainer, the replica it advances (the same model and
    optimizer) and the feed of the leased shard's batches (empty until a shard is leased)."""

    trainer: Trainer
    replica: Replica
    feed: ShardFeed
    checkpoint_path: Path


def build_training(
    cfg: NodeConfig,
    spec: ModelSpec,
    dcfg: DistroConfig,
    backend: ComputeBackend,
    core: AsyncSwarmExchange,
    identity: Identity,
) -> Training:
    """Build the model on ``backend``, its optimizer over ``core`` and the trainer, at step 0 or
    at the local checkpoint's step (``data_dir/checkpoint.safetensors``, when it is of this run). Runs
    on the event loop's thread (the exchange's sync face is bound to the running loop). Raises
    ``CheckpointError`` for an unreadable checkpoint, one of another run, or one whose state does
    not hash to the digest it was saved with."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    model = build_model(spec, backend.device)
    if spec.checkpointing or cfg.train.activation_checkpointing:
        if not backend.checkpointing:
            raise ConfigError(f"activation checkpointing is not available on --device {backend.name}; "
                              "use a smaller micro_batch instead")  # fmt: skip
        set_checkpointing(model)
    exchange = SwarmExchange(core, asyncio.get_running_loop())
    roles = tensor_roles(model)  # from the model's structure: the same on every replica, MLX ones too

    def fresh_optimizer() -> DistroOptimizer:
        return DistroOptimizer(model.named_parameters(), dcfg, exchange, identity, roles=roles)

    optimizer = fresh_optimizer()
    core.frame_check = packet_check(cfg.run_id, optimizer.digest)  # we lead only with valid packets
    feed = ShardFeed(spec.seed, peer_index(identity.peer_id), spec.batch, spec.seq_len)

    def live() -> tuple[Sequence[bytes], bytes]:  # the last applied round's accepted peers, and us
        reports = replica.optimizer.reports  # the replica's optimizer of now (catch-up replaces it)
        return (reports[-1].accepted if reports else ()), identity.peer_id

    # the leased shard's ``batch`` windows a step, or, when the run sets ``global_batch``, this
    # node's share of it among those peers (the same set on every replica), so survivors take
    # over a dead peer's
    batches: BatchSource = SharedFeed(feed.draw, spec.global_batch, live) if spec.global_batch else feed
    trainer = Trainer(model, optimizer, batches, backend, spec.micro_batch_for(cfg.train.micro_batch))
    replica = Replica(trainer, optimizer, fresh_optimizer)
    path = cfg.data_path / CHECKPOINT_FILE
    ckpt = load_checkpoint(path, run_id=cfg.run_id)
    old = cfg.data_path / OLD_CHECKPOINT_FILE
    if ckpt is None and old.exists():
        log.warning("%s is an older node's checkpoint (torch format), not read: starting from the run's "
                    "weights and catching up with the swarm; delete it to silence this", old)  # fmt: skip
    if ckpt is not None:
        _restore_guard(optimizer, ckpt, path)
        try:
            model.load_state_dict(ckpt.model)
            optimizer.load_state_dict(ckpt.optimizer)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:  # torch's words for "does not fit"
            raise CheckpointError(f"checkpoint {path} does not fit this run's model ({e}); delete it") from e
        optimizer.resume_at(ckpt.step)
        if ckpt.digest and trainer.digest() != ckpt.digest:
            raise CheckpointError(f"checkpoint {path}: its state does not hash to its digest; delete it")
        replica.step = ckpt.step
        log.info("resumed from %s at step %d", path, ckpt.step)
    return Training(trainer, replica, feed, path)


def _restore_guard(optimizer: DistroOptimizer, ckpt: Checkpoint, path: Path) -> None:
    """Load the checkpoint's guard history into ``optimizer.guard`` (checked as a peer's would be:
    ``guard_state.load_guard_state``). Raises ``CheckpointError`` when it is refused."""
    if ckpt.guard is None:
        log.warning("checkpoint %s has no guard history (an older node's): judging from a clean one", path)
        return
    try:
        load_guard_state(optimizer.guard, ckpt.guard, max_step=ckpt.step)
    except StateRefused as e:
        raise CheckpointError(f"checkpoint {path}: {e}; delete it to start fresh") from e


def save(training: Training, run_id: str) -> None:
    """Save model + optimizer (and its guard's history) at the replica's step (the next step to
    run) to its checkpoint path (atomically). Runs on the caller's thread: call it in a worker
    thread."""
    trainer, replica = training.trainer, training.replica
    save_checkpoint(
        training.checkpoint_path,
        Checkpoint(
            run_id,
            replica.step,
            trainer.digest(),
            trainer.model.state_dict(),
            replica.optimizer.state_dict(),
            guard_state(replica.optimizer.guard),
        ),
    )
