"""Training runs of the convergence benchmark: one row = one optimizer at one learning rate.

Every row starts from the same weights (``GPT(cfg, seed)``; ``--model llama``: the Llama of
``converge_llama``, built as an ``arch = "hf"`` run builds it), reads the same tokens in the same
order (peer ``i`` reads ``BatchOrder(seed, "builtin-train", i)``) and is scored on the same
held-out windows, so rows differ only by the optimizer. The GPT reads the code corpus as bytes,
the Llama the English corpus as BPE tokens (losses in nats per byte and per token). The lr
schedule is the same for every row: linear warm-up over ``warmup_steps``, cosine decay to
``min_lr_ratio`` of the peak at the last step.

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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from distronet.node.bench.converge_llama import LlamaShape, default_work_dir, english_tokens
from distronet.node.bench.converge_rows import RowSpec
from distronet.node.data.corpus import load_builtin_corpus
from distronet.node.data.order import BatchOrder, validation_windows, windows_to_xy
from distronet.node.models.build import build_model, model_loss
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.node.models.spec import ModelSpec
from distronet.protocol.errors import ConfigError

__all__ = [
    "LLAMA",
    "QUICK",
    "QUICK_LLAMA",
    "STANDARD",
    "BenchData",
    "BenchSetting",
    "RowResult",
    "evaluate",
    "make_data",
    "make_model",
    "ring_allreduce_bytes",
    "run_row",
    "scheduled_lr",
]

SHARD_ID = "builtin-train"


@dataclass(frozen=True)
class BenchSetting:
    """Everything a row's outcome depends on besides the optimizer and its lr.

    ``llama`` set: the Llama of that shape on the English BPE tokens (``model`` unused); None:
    the built-in GPT ``model`` on the code corpus. ``work_dir`` (not part of the outcome) is
    where the English tokens are cached ("": ``converge_llama.default_work_dir()``)."""

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
    llama: LlamaShape | None = None
    work_dir: str = field(default="", compare=False)

    @property
    def model_name(self) -> str:
        """``"llama"`` or ``"gpt"`` (the ``--model`` that chose this setting)."""
        return "gpt" if self.llama is None else "llama"

    @property
    def context(self) -> int:
        return self.model.context if self.llama is None else self.llama.context

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["work_dir"]
        if self.llama is not None:
            del out["model"]  # the GPT shape plays no part
        else:
            del out["llama"]
        return out

    def cache_dir(self) -> Path:
        return Path(self.work_dir) if self.work_dir else default_work_dir()


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
LLAMA = BenchSetting(steps=300, llama=LlamaShape())
"""``--model llama``: 4 peers x 4 windows of 128 tokens, 300 steps (614,400 tokens, 0.84 of an
epoch of the training fortunes), the Llama of ``LlamaShape()``."""
QUICK_LLAMA = BenchSetting(
    peers=2,
    steps=20,
    batch=2,
    seq_len=32,
    eval_windows=32,
    warmup_steps=3,
    llama=LlamaShape(depth=1, width=32, heads=2, kv_heads=1, ffn=64, vocab=512, context=32),
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
    """Built-in corpus (GPT: code, bytes; Llama: English, BPE tokens cached in ``s.cache_dir()``)
    → one ``BatchOrder`` per peer and evenly spaced validation windows."""
    if s.llama is not None:
        eng = english_tokens(s.llama.vocab, s.cache_dir())
        train, val, digest = eng.train, eng.val, eng.digest
    else:
        corpus = load_builtin_corpus()
        train, val, digest = corpus.train, corpus.val, corpus.digest
    orders = tuple(BatchOrder(train, SHARD_ID, s.seed, p, s.batch, s.seq_len) for p in range(s.peers))
    vx, vy = windows_to_xy(validation_windows(val, s.eval_windows, s.seq_len))
    return BenchData(
        orders,
        torch.from_numpy(np.ascontiguousarray(vx)),
        torch.from_numpy(np.ascontiguousarray(vy)),
        digest,
    )


def make_model(s: BenchSetting) -> nn.Module:
    """The row's starting model, the same weights for every row and replica: ``GPT(s.model,
    s.seed)``, or the Llama built from its ``[model.hf]`` table as an ``arch = "hf"`` run is."""
    if s.llama is None:
        return GPT(s.model, seed=s.seed)
    spec = ModelSpec.from_run({"arch": "hf", "hf": s.llama.hf_config(), "seed": s.seed, "seq_len": s.seq_len})
    return build_model(spec, torch.device("cpu"))


def _num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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
    model: str = "gpt"  # --model: "gpt" or "llama"

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
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 64) -> float:
    """Mean next-token cross-entropy (nats per token) of ``model`` over windows ``x``, ``y`` ``(W, T)``."""
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, x.shape[0], batch):
        total += float(model_loss(model, x[i : i + batch], y[i : i + batch])) * x[i : i + batch].shape[0]
    model.train(was_training)
    return total / x.shape[0]


def _tail_mean(losses: list[float]) -> float:
    tail = losses[-max(1, len(losses) // 10) :]
    return float(np.nanmean(tail)) if tail else math.nan


def _adamw(spec: RowSpec, lr: float, s: BenchSetting, data: BenchData) -> RowResult:
    t0 = time.perf_counter()
    model = make_model(s)
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
        loss = model_loss(model, torch.cat(xs), torch.cat(ys))  # mean over peers of each peer's mean loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    val = evaluate(model, data.val_x, data.val_y)
    n = _num_parameters(model)
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
        model=s.model_name,
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
    res = run_swarm(lambda: make_model(s), data.batch, cfg, s.peers, s.steps, seed=s.seed)
    model = res.models[0]
    val = evaluate(model, data.val_x, data.val_y)
    digests = {param_digest(m) for m, alive in zip(res.models, res.alive, strict=True) if alive}
    per_step = [b for row in res.upload_bytes for b in row if b > 0]
    upload = float(np.mean(per_step)) if per_step else math.nan
    n = _num_parameters(model)
    ring = ring_allreduce_bytes(n, s.peers)
    mean_losses = [res.mean_loss(t) for t in range(s.steps)]
    return RowResult(
        spec.name, lr, val, _tail_mean(mean_losses), upload, upload / ring, ring / upload,
        time.perf_counter() - t0, len(digests) == 1, n, spec.summary, dict(overrides), s.model_name,
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
