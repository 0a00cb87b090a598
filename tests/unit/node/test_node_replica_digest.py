"""The daemon's drift-check digest and its round accounting under every overlap mode."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from distronet.node.node_loop import round_due
from distronet.node.optim.config import preset
from distronet.node.swarm_sim import SwarmResult, run_swarm
from distronet.node.trainer import param_digest, replica_digest

torch.manual_seed(0)
_X = torch.randn(256, 24)
_Y = torch.tanh(_X @ torch.randn(24, 4) / 5)


def _factory() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(24, 32), nn.Tanh(), nn.Linear(32, 4))


def _batches(peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * peer + step)
    ix = torch.randint(0, len(_X), (16,), generator=g)
    return _X[ix], _Y[ix]


def _mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def test_own_guess_replicas_agree_on_the_replica_digest_not_on_parameters() -> None:
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0, overlap=True, overlap_predict="own", overlap_scale=0.7)
    seen: list[tuple[int, int]] = []  # per step: distinct replica digests, distinct parameter digests

    def look(step: int, res: SwarmResult) -> None:
        pairs = list(zip(res.models, res.optimizers, strict=True))
        seen.append((len({replica_digest(m, o) for m, o in pairs}), len({param_digest(m) for m, _ in pairs})))

    run_swarm(_factory, _batches, cfg, 3, 6, loss_fn=_mse, share_rounds=False, on_step=look)
    assert all(r == 1 for r, _ in seen)  # the consensus is bit-identical after every step
    assert any(p == 3 for _, p in seen)  # while each replica's parameters carry its own guess


def test_without_overlap_the_replica_digest_is_the_parameter_digest() -> None:
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0)
    res = run_swarm(_factory, _batches, cfg, 2, 3, loss_fn=_mse)
    for m, o in zip(res.models, res.optimizers, strict=True):
        assert replica_digest(m, o) == param_digest(m)
    assert replica_digest(res.models[0], object()) == param_digest(res.models[0])  # a plain optimizer


@dataclass
class _Opt:
    start: int | None  # None: no overlap

    def overlapped(self, step: int) -> bool:
        return self.start is not None and step >= self.start


def test_round_due() -> None:
    assert [round_due(_Opt(None), s) for s in range(3)] == [0, 1, 2]
    assert [round_due(_Opt(0), s) for s in range(3)] == [None, 0, 1]
    assert [round_due(_Opt(2), s) for s in range(5)] == [0, 1, None, 2, 3]
    assert round_due(object(), 7) == 7
