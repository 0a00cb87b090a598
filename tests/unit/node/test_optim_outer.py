"""Outer momentum (``outer_momentum``): replicated buffer of the aggregates, shipped to newcomers."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from distronet.node.catchup.state import load_state_blob, state_blob
from distronet.node.exchange.memory import MemoryHub
from distronet.node.optim.config import preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity


def _ident(i: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"outer-test %d" % i).digest())


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(96, 80), nn.Tanh(), nn.Linear(80, 4))


def test_outer_momentum_bounds() -> None:
    with pytest.raises(ConfigError):
        preset("ours_k4_1bit", outer_momentum=1.0)
    with pytest.raises(ConfigError):
        preset("ours_k4_1bit", outer_momentum=-0.1)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
def test_outer_buffer_is_replicated_and_travels_to_a_newcomer(overlap: bool, nesterov: bool) -> None:
    """Two replicas train; a third adopts replica 0's state blob at step 4 and from then on
    applies bit-identical updates — only possible if the outer buffer travelled with the blob."""
    cfg = preset("ours_k4_1bit", lr=0.01, outer_momentum=0.8, outer_nesterov=nesterov, overlap=overlap)
    hub = MemoryHub()
    ids = [_ident(i) for i in range(3)]
    models = [_model(), _model(), _model(seed=7)]
    opts = [
        DistroOptimizer(m.named_parameters(), cfg, hub.join(i.peer_id), i, roles=tensor_roles(m))
        for m, i in zip(models, ids, strict=True)
    ]
    gen = torch.Generator().manual_seed(3)

    def run(live: list[int]) -> None:
        for i in live:
            for p in models[i].parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opts[i].begin_step()
        for i in live:
            opts[i].finish_step()

    for _ in range(4):
        run([0, 1])
    outer = [[opts[i].state[p]["outer"] for p in models[i].parameters()] for i in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(*outer, strict=True))
    assert any(float(b.abs().max()) > 0 for b in outer[0])
    blob = state_blob(4, models[0], opts[0])
    assert b"#outer" in blob
    load_state_blob(blob, models[2], opts[2])
    opts[2].resume_at(4)
    for t in (4, 5, 6):
        run([0, 1, 2])
        for a, c in zip(models[0].parameters(), models[2].parameters(), strict=True):
            assert torch.equal(a, c), t


def test_outer_momentum_changes_the_update() -> None:
    """With μ > 0 the second step's update differs from the plain rule's (the buffer is used)."""
    finals = []
    for mu in (0.0, 0.9):
        ident = _ident(0)
        model = _model()
        opt = DistroOptimizer(
            model.named_parameters(),
            preset("ours_k4_1bit", lr=0.01, outer_momentum=mu),
            MemoryHub().join(ident.peer_id),
            ident,
            roles=tensor_roles(model),
        )
        gen = torch.Generator().manual_seed(5)
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        finals.append([p.detach().clone() for p in model.parameters()])
    assert not all(torch.equal(a, b) for a, b in zip(*finals, strict=True))


@pytest.mark.parametrize("overlap", [False, True])
def test_outer_momentum_replicas_bit_identical_under_faults(overlap: bool) -> None:
    """Dropped, late, duplicated packets and a peer death: the survivors stay bit-identical."""
    from distronet.node.bench.swarm_sim import SwarmFaults, param_digest, run_swarm
    from distronet.node.exchange.faulty import FaultPlan

    torch.manual_seed(0)
    x = torch.randn(256, 96)
    y = torch.tanh(x @ torch.randn(96, 4) / 7)

    def batches(peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 * peer + step)
        ix = torch.randint(0, len(x), (32,), generator=g)
        return x[ix], y[ix]

    def mse(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(model(xb), yb)

    plan = FaultPlan(seed=5, p_drop=0.15, p_late=0.1, p_duplicate=0.3, max_delay=0.9)
    cfg = preset("ours_k4_1bit", lr=3e-3, outer_momentum=0.9, outer_nesterov=True, overlap=overlap)
    res = run_swarm(_model, batches, cfg, 4, 10, SwarmFaults(plan=plan, deaths={2: 5}), loss_fn=mse)
    live = [m for m, ok in zip(res.models, res.alive, strict=True) if ok]
    assert len(live) == 3 and len({param_digest(m) for m in live}) == 1
