"""A tiny deterministic network and per-peer, per-step gradients, shared by optimizer tests that
run several replicas (test_optim_replay)."""

from __future__ import annotations

import torch
from torch import nn


def tiny_model() -> nn.Module:
    """The same weights at every call (seed 0): every replica starts from the run's state."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 8))


def tiny_grads(model: nn.Module, peer: int, step: int) -> None:
    """Set ``model``'s gradients from peer ``peer``'s batch of ``step`` (seeded, fixed)."""
    g = torch.Generator().manual_seed(1000 * peer + step)
    x, y = torch.randn(16, 24, generator=g), torch.randn(16, 8, generator=g)
    model.zero_grad(set_to_none=True)
    nn.functional.mse_loss(model(x), y).backward()
