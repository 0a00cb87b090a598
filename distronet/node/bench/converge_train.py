"""Training runs of the convergence benchmark: one row = one optimizer at one learning rate.

Every row starts from the same weights (``GPT(cfg, seed)``), reads the same tokens in the same
order (peer ``i`` reads ``BatchOrder(seed, "builtin-train", i)``) and is scored on the same
held-out windows, so rows differ only by the optimizer. The lr schedule is the same for every
row: linear warm-up over ``warmup_steps``, cosine decay to ``min_lr_ratio`` of the peak at the
last step.

* AdamW with dense all-reduce: N peers' batches give N gradients; an all-reduce averages them
  exactly and every replica applies the same AdamW step, so the N replicas stay identical and
  one model stands for all. The average of N per-peer mean losses over equal batches is the
  mean loss over their concatenation, so one backward over the N batches side by side gives
  that averaged gradient. Upload per peer per step is the fp32 ring all-reduce's
  ``2·(N−1)/N·4`` bytes per parameter.
* DisTrO rows: N replicas over the in-memory exchange (``distronet.node.bench.swarm_sim.run_swarm``);
  upload is the mean size of the sealed packets as on the wire, framing included.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from distronet.node.bench.converge_rows import RowSpec
from distronet.node.data.corpus import load_builtin_corpus
from distronet.node.data.order import BatchOrder, validation_windows, windows_to_xy
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.protocol.errors import ConfigError

__all__ = [
    "QUICK",
    "STANDARD",
    "BenchData",
    "BenchSetting",
    "RowResult",
    "evaluate",
    "make_data",
    "ring_allreduce_bytes",
    "run_row",
    "scheduled_lr",
]

SHARD_ID = "builtin-train"


@dataclass(frozen=True)
class BenchSetting:
    """Everything a row's outcome depends on besides the optimizer and its lr."""

    peers: int = 4
    steps: int = 600
    batch: int = 4  # windows per peer per step
    seq_len: int = 128
    model: GPTConfig = field(default_factory=GPTConfig)
    seed: int = 0
    eval_windows: int = 256
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_weight_decay: float = 0.1  # on matrices and embeddings; none on biases and norms

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


STANDARD = BenchSetting()
QUICK = BenchSetting(
    peers=2,
    steps=40,
    batch=4,
    seq_len=64,
    model=GPTConfig(depth=2, width=64, heads=2, context=64),
    eval_windows=64,
    warmup_steps=5,
)


@dataclass(frozen=True)
class BenchData:
    """The per-peer data orders and the fixed validation batch ``(W, T)`` int64 tensors."""

    orders: tuple[BatchOrder, ...]
    val_x: torch.Tensor
    val_y: torch.Tensor
    corpus_digest: str

    def batch(self, peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.orders[peer].xy(step)
        return torch.from_numpy(x), torch.from_numpy(y)


def make_data(s: BenchSetting) -> BenchData:
    """Built-in corpus → one ``BatchOrder`` per peer and evenly spaced validation windows."""
    corpus = load_builtin_corpus()
    orders = tuple(BatchOrder(corpus.train, SHARD_ID, s.seed, p, s.batch, s.seq_len) for p in range(s.peers))
    vx, vy = windows_to_xy(validation_windows(corpus.val, s.eval_windows, s.seq_len))
    return BenchData(
        orders,
        torch.from_numpy(np.ascontiguousarray(vx)),
        torch.from_numpy(np.ascontiguousarray(vy)),
        corpus.digest,
    )


@dataclass(frozen=True)
class RowResult:
    """One row of the benchmark table (the ``--json`` object)."""

    config: str
    lr: float
    val_loss: float
    train_loss: float  # mean over the last 10 % of steps and over peers
    upload_bytes_per_step: float
    ratio_vs_ring_allreduce: float  # upload / fp32 ring all-reduce upload (1.0 for AdamW)
    compression_vs_ring_allreduce: float  # the inverse: how many times less than the ring
    seconds: float
    replicas_identical: bool
    parameters: int
    summary: str
    overrides: dict[str, Any] = field(default_factory=dict)  # preset fields changed with --set

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ring_allreduce_bytes(parameters: int, peers: int) -> float:
    """Bytes one peer uploads per step in a fp32 ring all-reduce: 2·(N−1)/N·4 per parameter."""
    return 2.0 * (peers - 1) / peers * 4.0 * parameters


def scheduled_lr(peak: float, step: int, s: BenchSetting) -> float:
    """Linear warm-up over ``s.warmup_steps``, then cosine from ``peak`` to ``s.min_lr_ratio·peak``."""
    if s.warmup_steps and step < s.warmup_steps:
        return peak * (step + 1) / s.warmup_steps
    span = max(1, s.steps - s.warmup_steps)
    frac = min(1.0, max(0.0, (step - s.warmup_steps) / span))
    return peak * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac)))


@torch.no_grad()
def evaluate(model: GPT, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    """Mean next-token cross-entropy (nats per byte) of ``model`` over windows ``x``, ``y`` ``(W, T)``."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, x.shape[0], batch):
        total += float(model.loss(x[i : i + batch], y[i : i + batch])) * x[i : i + batch].shape[0]
    model.train(was_training)
    return total / x.shape[0]


def _tail_mean(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10) :]
    return float(np.nanmean(tail)) if tail else math.nan


def _adamw(spec: RowSpec, lr: float, s: BenchSetting, data: BenchData) -> RowResult:
    t0 = time.perf_counter()
    model = GPT(s.model, seed=s.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": s.adamw_weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr, betas=s.adamw_betas)
    losses: list[float] = []
    for step in range(s.steps):
        for g in opt.param_groups:
            g["lr"] = scheduled_lr(lr, step, s)
        xs, ys = zip(*(data.batch(p, step) for p in range(s.peers)), strict=True)
        loss = model.loss(torch.cat(xs), torch.cat(ys))  # mean over peers of each peer's mean loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    val = evaluate(model, data.val_x, data.val_y)
    n = model.num_parameters()
    ring = ring_allreduce_bytes(n, s.peers)
    return RowResult(
        spec.name,
        lr,
        val,
        _tail_mean(losses),
        ring,
        1.0,
        1.0,
        time.perf_counter() - t0,
        True,
        n,
        spec.summary,
    )


def _distro(
    spec: RowSpec, lr: float, s: BenchSetting, data: BenchData, overrides: dict[str, Any]
) -> RowResult:
    from distronet.node.bench.swarm_sim import param_digest, run_swarm
    from distronet.node.optim.config import preset

    assert spec.preset is not None
    t0 = time.perf_counter()
    cfg = preset(
        spec.preset,
        **overrides,
        lr=lr,
        warmup_steps=s.warmup_steps,
        total_steps=s.steps,
        decay="cosine",
        min_lr_ratio=s.min_lr_ratio,
    )
    res = run_swarm(lambda: GPT(s.model, seed=s.seed), data.batch, cfg, s.peers, s.steps, seed=s.seed)
    model = res.models[0]
    assert isinstance(model, GPT)
    val = evaluate(model, data.val_x, data.val_y)
    digests = {param_digest(m) for m, alive in zip(res.models, res.alive, strict=True) if alive}
    per_step = [b for row in res.upload_bytes for b in row if b > 0]
    upload = float(np.mean(per_step)) if per_step else math.nan
    n = model.num_parameters()
    ring = ring_allreduce_bytes(n, s.peers)
    mean_losses = [res.mean_loss(t) for t in range(s.steps)]
    return RowResult(
        spec.name, lr, val, _tail_mean(mean_losses), upload, upload / ring, ring / upload,
        time.perf_counter() - t0, len(digests) == 1, n, spec.summary, dict(overrides),
    )  # fmt: skip


def run_row(
    spec: RowSpec,
    lr: float,
    s: BenchSetting,
    data: BenchData | None = None,
    threads: int = 1,
    overrides: dict[str, Any] | None = None,
) -> RowResult:
    """Train ``spec`` at peak ``lr`` under ``s`` and score it.

    ``overrides`` change fields of a distro row's preset (``ConfigError`` for an AdamW row).
    Costs ``s.peers·s.steps`` forward/backward passes of ``s.batch`` windows, plus the optimizer.
    """
    torch.set_num_threads(threads)
    data = data if data is not None else make_data(s)
    if spec.kind == "adamw":
        if overrides:
            raise ConfigError("the adamw row takes no preset overrides")
        return _adamw(spec, lr, s, data)
    return _distro(spec, lr, s, data, overrides or {})
