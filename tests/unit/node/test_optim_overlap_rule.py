"""Overlap mode against the update rules written out by hand, on a tiny deterministic problem.

One peer, a linear model, a fixed batch per step. Without lookahead the overlapped optimizer
must equal, bit for bit, a plain optimizer fed the gradient at its parameters one step stale;
with lookahead the model's parameters must be the consensus minus the next step's learning rate
times the guess, the consensus receiving each real update exactly once.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch
from torch import nn

from distronet.node.exchange.memory import MemoryHub
from distronet.node.optim.config import DistroConfig, build, lr_at, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

_ID = Identity.from_seed(hashlib.sha256(b"overlap-rule").digest())


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 8))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 24, generator=g), torch.randn(16, 8, generator=g)


def _grad_at(model: nn.Module, params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    scratch = copy.deepcopy(model)
    with torch.no_grad():
        for q, v in zip(scratch.parameters(), params, strict=True):
            q.copy_(v)
    x, y = _batch(step)
    nn.functional.mse_loss(scratch(x), y).backward()
    return [q.grad.detach().clone() for q in scratch.parameters()]  # type: ignore[union-attr]


def _opt(model: nn.Module, cfg: DistroConfig) -> DistroOptimizer:
    return DistroOptimizer(
        model.named_parameters(), cfg, MemoryHub().join(_ID.peer_id), _ID, roles=tensor_roles(model)
    )


def _cfg(**kw: object) -> DistroConfig:
    fields: dict[str, object] = {"weight_decay": 0.1, **kw}
    return preset("ours_k32", lr=0.02, warmup_steps=3, total_steps=12, **fields)


@pytest.mark.parametrize("start", [0, 5])
def test_overlap_without_lookahead_is_the_plain_rule_one_step_stale(start: int) -> None:
    """Steps before ``overlap_start`` are synchronous; from it on the gradient is one step stale."""
    plain_m, over_m = _model(), _model()
    over_cfg = _cfg(overlap=True, overlap_lookahead=False, overlap_start=start)
    plain, over = _opt(plain_m, _cfg()), _opt(over_m, over_cfg)
    hist = [[p.detach().clone() for p in plain_m.parameters()]]  # hist[t]: plain's θ before step t
    for t in range(12):
        stale = hist[t if t <= start else t - 1]
        assert all(torch.equal(a, b) for a, b in zip(over_m.parameters(), stale, strict=True)), t
        for p, g in zip(over_m.parameters(), _grad_at(over_m, list(over_m.parameters()), t), strict=True):
            p.grad = g
        over.step()
        for p, g in zip(plain_m.parameters(), _grad_at(plain_m, stale, t), strict=True):
            p.grad = g
        plain.step()
        hist.append([p.detach().clone() for p in plain_m.parameters()])
    over.flush()  # applies the last round: both have now applied rounds 0..11
    assert all(torch.equal(a, b) for a, b in zip(over_m.parameters(), plain_m.parameters(), strict=True))


@pytest.mark.parametrize(("wd", "scale"), [(0.0, 1.0), (0.1, 1.0), (0.1, 0.5)])
def test_overlap_lookahead_is_consensus_minus_next_lr_times_last_update(wd: float, scale: float) -> None:
    model = _model()
    cfg = _cfg(overlap=True, weight_decay=wd, overlap_scale=scale)
    opt = _opt(model, cfg)
    params = list(model.parameters())
    prev = [p.detach().clone() for p in params]
    for t in range(12):
        for p, g in zip(params, _grad_at(model, params, t), strict=True):
            p.grad = g
        opt.step()
        cons = [opt.state[p]["consensus"] for p in params]
        if t == 0:  # nothing applied yet: no guess either
            assert all(
                torch.equal(p, c) and torch.equal(c, q) for p, c, q in zip(params, cons, prev, strict=True)
            )
            continue
        lr, nxt = lr_at(cfg, t - 1), lr_at(cfg, t)  # round t - 1 applied; round t in flight
        for p, c, q in zip(params, cons, prev, strict=True):
            update = (q * (1.0 - lr * wd) - c) / lr  # what the consensus received, exactly once
            assert update.abs().max() > 0
            torch.testing.assert_close(p.detach(), c - scale * nxt * update, rtol=1e-5, atol=1e-6)
        prev = [c.clone() for c in cons]
    opt.flush()
    assert all(torch.equal(p, opt.state[p]["consensus"]) for p in params)


@pytest.mark.parametrize("predict", ["last", "own"])
@pytest.mark.parametrize("adopt_at", [3, 5])
def test_newcomer_adopting_around_overlap_start_matches_the_donor(predict: str, adopt_at: int) -> None:
    """``overlap_start=3``: a node adopting the state at the switch step or after it ends with
    the donor's consensus bit for bit (and, with the shared ``last`` guess, its parameters)."""
    from distronet.node.catchup.state import load_state_blob, state_blob

    hub = MemoryHub()
    cfg = _cfg(overlap=True, overlap_start=3, overlap_predict=predict)
    ids = [Identity.from_seed(hashlib.sha256(b"overlap-rule %d" % i).digest()) for i in range(3)]
    models = [_model() for _ in ids]
    with torch.no_grad():
        for p in models[2].parameters():
            p.mul_(0.5)  # the newcomer starts from other weights
    opts = [
        DistroOptimizer(m.named_parameters(), cfg, hub.join(i.peer_id), i, roles=tensor_roles(m))
        for m, i in zip(models, ids, strict=True)
    ]

    def run(step: int, live: list[int]) -> None:
        for i in live:
            for p, g in zip(
                models[i].parameters(),
                _grad_at(models[i], list(models[i].parameters()), 100 * i + step),
                strict=True,
            ):
                p.grad = g
            opts[i].begin_step()
        for i in live:
            opts[i].finish_step()

    for t in range(adopt_at):
        run(t, [0, 1])
    load_state_blob(state_blob(adopt_at, models[0], opts[0]), models[2], opts[2])
    opts[2].resume_at(adopt_at)
    for t in range(adopt_at, 8):
        run(t, [0, 1, 2])
    for a, c in zip(opts[0].replicated_params(), opts[2].replicated_params(), strict=True):
        assert torch.equal(a, c)
    for a, c in zip(models[0].parameters(), models[2].parameters(), strict=True):
        assert torch.equal(a, c) != (predict == "own")  # "own": each peer's guess is its own
    for o in opts:
        o.flush()
    assert all(torch.equal(a, c) for a, c in zip(models[0].parameters(), models[2].parameters(), strict=True))


@pytest.mark.parametrize("bad", [{"overlap_scale": 2.5}, {"overlap_scale": -0.1}, {"overlap_start": -1}])
def test_bad_overlap_fields_are_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        build({"overlap": True, **bad})
