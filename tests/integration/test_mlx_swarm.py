"""An MLX node trains beside torch-CPU nodes in one in-process swarm; the replicas stay bit-identical.

Steps:
 1. three replicas of a small built-in GPT over the in-memory exchange (``run_swarm``, every
    replica aggregating on its own, as separate processes do); peer 0 computes its loss and
    gradients with the MLX backend, peers 1 and 2 with torch on the CPU;
 2. after 8 DisTrO steps the three parameter digests are equal, every round accepted all three
    packets (the MLX peer's included), MLX ran all 8 of peer 0's passes, and the loss fell;
 3. peer 0's first loss is the one torch computes on its batch (within 1e-5): MLX computed it.

Real MLX (``mlx[cpu]`` on Linux): skips locally without it, fails under CI (``CI`` set).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import distronet.node.models.gpt as gpt_module
from distronet.node.backends import pick_backend
from distronet.node.bench.swarm_sim import param_digest, run_swarm
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.node.optim.config import preset

CFG = GPTConfig(depth=2, width=32, heads=4, context=32)
STEPS, PEERS, BATCH, SEQ = 8, 3, 8, 32
TEXT = np.frombuffer(Path(gpt_module.__file__).read_bytes(), dtype=np.uint8).astype(np.int64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _batches(peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = np.random.default_rng(1000 * peer + step).integers(0, len(TEXT) - SEQ - 1, BATCH)
    x = np.stack([TEXT[s : s + SEQ] for s in starts])
    y = np.stack([TEXT[s + 1 : s + SEQ + 1] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


@pytest.mark.slow  # about 3 s on a quiet 2-core machine; more under load
@pytest.mark.usefixtures("require_mlx")
def test_mlx_peer_and_torch_peers_stay_bit_identical() -> None:
    mlx, cpu = pick_backend("mlx"), pick_backend("cpu")
    built: list[nn.Module] = []

    def factory() -> nn.Module:
        built.append(GPT(CFG, seed=0))
        return built[-1]

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (mlx if model is built[0] else cpu).loss(model, x, y)

    start = GPT(CFG, seed=0)
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0)
    res = run_swarm(factory, _batches, cfg, PEERS, STEPS, loss_fn=loss_fn, share_rounds=False)

    assert len({param_digest(m) for m in res.models}) == 1
    assert param_digest(res.models[0]) != param_digest(start)
    assert mlx.steps == STEPS
    for opt in res.optimizers:
        assert all(set(opt.reports[s].accepted) == set(res.peer_ids) for s in range(STEPS))
    first = [res.mean_loss(s) for s in range(3)]
    last = [res.mean_loss(s) for s in range(STEPS - 3, STEPS)]
    assert statistics.mean(last) < statistics.mean(first) - 0.3, (first, last)
    with torch.no_grad():
        want: Any = start.loss(*_batches(0, 0))
    assert abs(res.losses[0][0] - float(want)) <= 1e-5
