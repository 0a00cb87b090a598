"""N peers in one process: each its own model replica, identity and data, over a ``MemoryHub``.

Used by the tests and by ``distro-node bench converge``. The public entry point::

    run_swarm(model_factory, batches_for, cfg, n_peers, steps, faults=None, *,
              loss_fn=None, seed=0, on_step=None, share_rounds=True,
              keep_global_batch=False) -> SwarmResult

* ``model_factory()`` builds a fresh model; it must give the same initial weights every call
  (e.g. ``lambda: GPT(GPTConfig(), seed=0)``).
* ``batches_for(peer, step) -> (x, y)`` gives peer ``peer``'s batch of step ``step``.
* ``loss_fn(model, x, y) -> Tensor`` (default ``models.build.model_loss``: ``model.loss(x, y)``,
  or a Hugging Face causal LM's cross-entropy).
* ``faults``: ``SwarmFaults(plan=FaultPlan(...), deaths={peer: step})`` — seeded network faults
  through ``FaultyLinks``, and peers that die (leave the run) at a given step.
* ``on_step(step, result)`` is called after every step (e.g. to evaluate mid-run).
* ``keep_global_batch=True``: a dead peer's data is not lost. From the step after a peer dies,
  the survivors take over its stream (``batches_for(dead, step)``, as the coordinator reissues
  a dead node's shards): its windows are dealt round-robin to the live peers
  (``batch_share.takeover``), each survivor trains on its own batch plus its dealt windows as
  one batch, its mean loss weighted by ``batch_share.loss_weight`` so the step still averages the
  run's global batch of ``n_peers × B`` windows. ``SwarmResult.windows[peer][step]`` records
  how many windows each peer trained on. Without deaths the run is unchanged (bit-identical).

Replicas share one ``DecodeCache`` (each frame decoded, and each round's aggregate computed,
once per process, not once per replica: both are pure functions of the bytes; ``share_decode=False``
turns the latter off). Peer identities come from ``seed``
(``Identity.from_seed``), so a run replays exactly.
Per step, every live peer computes its gradient and publishes, then every live peer collects
and applies (the collect decides the round: in this single thread, the round's deadline).
``SwarmResult.upload_bytes[peer][step]`` are the bytes of that peer's sealed packet as on the wire.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Mapping

import torch
from torch import nn

from distronet.node.daemon.trainer import (
    param_digest,  # re-exported: the digest tests and the bench compare
)
from distronet.node.data.batch_share import loss_weight, takeover
from distronet.node.exchange.base import PeerDead
from distronet.node.exchange.faulty import FaultPlan, FaultyExchange, FaultyLinks
from distronet.node.exchange.memory import MemoryHub
from distronet.node.models.build import model_loss
from distronet.node.optim.config import DistroConfig
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.packets import DecodeCache
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

__all__ = ["SwarmFaults", "SwarmResult", "param_digest", "run_swarm"]

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class SwarmFaults:
    """Seeded network faults and peer deaths (peer index -> step it dies at)."""

    plan: FaultPlan | None = None
    deaths: Mapping[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SwarmResult:
    """Outcome of ``run_swarm``; lists are indexed by peer (0..n_peers-1)."""

    models: list[nn.Module]
    optimizers: list[DistroOptimizer]
    peer_ids: list[bytes]
    alive: list[bool]
    losses: list[list[float]]  # per peer per step; nan once dead
    upload_bytes: list[list[int]]  # per peer per step, sealed packet bytes; 0 once dead
    seconds: float
    windows: list[list[int]] = dataclasses.field(default_factory=list)  # per peer per step; 0 once dead

    def params(self, peer: int) -> dict[str, torch.Tensor]:
        """Final parameters of ``peer`` (detached)."""
        return {n: p.detach() for n, p in self.models[peer].named_parameters()}

    def mean_loss(self, step: int) -> float:
        """Mean training loss over the peers alive at ``step``."""
        vals = [row[step] for row in self.losses if not math.isnan(row[step])]
        return sum(vals) / len(vals) if vals else math.nan


def _default_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model_loss(model, x, y)


def run_swarm(
    model_factory: Callable[[], nn.Module],
    batches_for: Callable[[int, int], Batch],
    cfg: DistroConfig,
    n_peers: int,
    steps: int,
    faults: SwarmFaults | None = None,
    *,
    loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    seed: int = 0,
    on_step: Callable[[int, SwarmResult], None] | None = None,
    share_rounds: bool = True,
    keep_global_batch: bool = False,
) -> SwarmResult:
    """Train ``n_peers`` replicas for ``steps`` steps over an in-memory exchange (module docstring).

    ``share_rounds=False`` makes every replica aggregate each round and compute its update on its
    own, as separate processes do (frames are still decoded once): slower, and the strict test of
    bit-identical replicas. ``keep_global_batch`` (module docstring) keeps the global batch
    constant after deaths; every peer's ``batches_for`` must then give the same number of windows.

    Raises ``ConfigError`` for ``n_peers < 1``, ``steps < 0`` or a death of an unknown peer.
    """
    if n_peers < 1 or steps < 0:
        raise ConfigError(f"run_swarm needs n_peers >= 1 and steps >= 0, got {n_peers}, {steps}")
    faults = faults or SwarmFaults()
    if any(not 0 <= i < n_peers for i in faults.deaths):
        raise ConfigError(f"deaths name unknown peers: {sorted(faults.deaths)}")
    loss_fn = loss_fn or _default_loss
    hub = MemoryHub(FaultyLinks(faults.plan) if faults.plan else None)
    t0 = time.perf_counter()
    res = SwarmResult([], [], [], [True] * n_peers, [], [], 0.0)
    cache = DecodeCache(max_entries=4 * n_peers, max_rounds=2 if share_rounds else 0)
    for i in range(n_peers):
        ident = Identity.from_seed(hashlib.sha256(f"distronet-sim/{seed}/{i}".encode()).digest())
        ex = FaultyExchange(hub.join(ident.peer_id), die_at_step=faults.deaths.get(i))
        model = model_factory()
        res.models.append(model)
        res.optimizers.append(
            DistroOptimizer(
                model.named_parameters(), cfg, ex, ident, decode_cache=cache, roles=tensor_roles(model)
            )
        )
        res.peer_ids.append(ident.peer_id)
        res.losses.append([])
        res.upload_bytes.append([])
        res.windows.append([])
    for step in range(steps):
        batch_of = _step_batches(batches_for, step, res.alive, keep_global_batch)
        for i, (model, opt) in enumerate(zip(res.models, res.optimizers, strict=True)):
            if not res.alive[i]:
                res.losses[i].append(math.nan)
                res.upload_bytes[i].append(0)
                res.windows[i].append(0)
                continue
            opt.zero_grad(set_to_none=True)
            x, y, weight = batch_of(i)
            loss = loss_fn(model, x, y)
            (loss * weight if weight != 1.0 else loss).backward()
            try:
                opt.begin_step()
            except PeerDead:
                res.alive[i] = False
                res.losses[i].append(math.nan)
                res.upload_bytes[i].append(0)
                res.windows[i].append(0)
                continue
            res.windows[i].append(int(x.shape[0]))
            res.losses[i].append(float(loss.detach()))
            res.upload_bytes[i].append(opt.exchange.stats.bytes_up_by_step.get(step, 0))
        for i, opt in enumerate(res.optimizers):
            if res.alive[i]:
                opt.finish_step()
        if on_step is not None:
            on_step(step, res)
    for i, opt in enumerate(res.optimizers):
        if res.alive[i]:
            opt.flush()
    res.seconds = time.perf_counter() - t0
    return res


def _step_batches(
    batches_for: Callable[[int, int], Batch], step: int, alive: list[bool], keep_global_batch: bool
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor, float]]:
    """``peer -> (x, y, loss weight)`` for ``step``: the peer's own batch, plus (with
    ``keep_global_batch`` and dead peers) the dead peers' windows dealt to it by ``takeover``."""
    dead = [i for i, ok in enumerate(alive) if not ok]
    if not keep_global_batch or not dead:
        return lambda i: (*batches_for(i, step), 1.0)
    live = [i for i, ok in enumerate(alive) if ok]
    orphan_batches = {d: batches_for(d, step) for d in dead}
    batch = int(next(iter(orphan_batches.values()))[0].shape[0])
    dealt = takeover(batch, live, dead, step)

    def batch_of(i: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        x, y = batches_for(i, step)
        if int(x.shape[0]) != batch:
            raise ConfigError(
                f"keep_global_batch needs equal batches; peer {i} has {x.shape[0]}, not {batch}"
            )
        xs, ys = [x], [y]
        for d, w in dealt[i]:
            xs.append(orphan_batches[d][0][w : w + 1])
            ys.append(orphan_batches[d][1][w : w + 1])
        n = batch + len(dealt[i])
        return torch.cat(xs), torch.cat(ys), loss_weight(n, batch * len(alive), len(live))

    return batch_of
