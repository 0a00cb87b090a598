"""DistroOptimizer: exact error feedback, lost-packet recovery, update rules, loss goes down."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from torch import nn

from distronet.kernels.coding import decode_payload
from distronet.kernels.dct import dct_chunks
from distronet.kernels.decode import scatter_sum
from distronet.node.exchange.base import Exchange, Forwarding, Round
from distronet.node.exchange.memory import MemoryHub
from distronet.node.optim.config import DistroConfig, UpdateRule, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.node.optim.update import apply_rule
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity
from distronet.protocol.packet import open_packet


def _ident(i: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"optim-test %d" % i).digest())


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(96, 80), nn.Tanh(), nn.Linear(80, 4))


class _Recorder(Forwarding):
    """An exchange wrapper that keeps every published frame (and can hide this peer's own)."""

    def __init__(self, inner: Exchange, *, hide_own: bool = False) -> None:
        super().__init__(inner)
        self.frames, self.hide_own = {}, hide_own

    def publish(self, step: int, frame: bytes) -> None:
        self.frames[step] = frame
        self.inner.publish(step, frame)

    def collect(self, step: int) -> Round:
        rnd = self.inner.collect(step)
        if self.hide_own:
            return Round(step, {p: f for p, f in rnd.items() if p != self.peer_id})
        return rnd


@pytest.mark.parametrize("name", ["demo_reference", "psyche", "ours_k4_1bit", "ours_k32"])
def test_error_feedback_is_exact(name: str) -> None:
    """residual + what the receivers decode == β·m + DCT(g), quantisation error included."""
    model = _model()
    ident = _ident(0)
    ex = _Recorder(MemoryHub().join(ident.peer_id))
    cfg = preset(name, lr=0.01)
    opt = DistroOptimizer(model.named_parameters(), cfg, ex, ident, roles=tensor_roles(model))
    params = list(model.parameters())
    for step in range(3):
        prev = opt.momentum_chunks()  # chunk order (2-D momenta are kept spatial: copies)
        for p in params:
            p.grad = torch.randn_like(p)
        scale = 0.01 if cfg.extraction.lr_in_momentum else 1.0
        want = [
            cfg.extraction.beta * m + scale * dct_chunks(p.grad, pl.layout)
            for m, p, pl in zip(prev, params, opt.plans, strict=False)
        ]
        opt.step()
        pkt = open_packet(ex.frames[step], run_id=cfg.run_id, layout_digest=opt.digest)
        shapes = [(pl.layout.n_chunks, pl.layout.chunk_numel) for pl in opt.plans]
        for t in decode_payload(pkt.payload, shapes).tensors():
            pl = opt.plans[t.tensor_id]
            sent = scatter_sum(
                pl.layout, [(torch.from_numpy(np.asarray(t.idx)), torch.from_numpy(np.asarray(t.val)))]
            )
            got = opt.momentum_chunks()[t.tensor_id] + sent
            torch.testing.assert_close(got, want[t.tensor_id], rtol=1e-6, atol=1e-6)


def test_lost_own_packet_returns_to_momentum() -> None:
    """When this peer's packet is not in the accepted set, the momentum keeps everything."""
    model = _model()
    ident = _ident(1)
    ex = _Recorder(MemoryHub().join(ident.peer_id), hide_own=True)
    cfg = preset("psyche", lr=0.01)
    opt = DistroOptimizer(model.named_parameters(), cfg, ex, ident, roles=tensor_roles(model))
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    want = [dct_chunks(p.grad, pl.layout) for p, pl in zip(model.parameters(), opt.plans, strict=False)]
    opt.step()
    for p, b, w, m in zip(model.parameters(), before, want, opt.momentum_chunks(), strict=False):
        assert torch.equal(p.detach(), b)  # nothing accepted: nothing applied
        torch.testing.assert_close(m, w, rtol=1e-6, atol=1e-6)
    assert opt.reports[-1].own_accepted is False and opt.reports[-1].accepted == ()


def test_update_rules_have_unit_rms() -> None:
    d = torch.randn(64, 48)
    for rule in UpdateRule:
        u = apply_rule(rule, d, v=torch.zeros_like(d), n=1)
        assert u.shape == d.shape
        assert 0.5 < float(u.pow(2).mean().sqrt()) < 1.5
    u = apply_rule(UpdateRule.ORTHO, d, ns_steps=8) / 64**0.5
    sv = torch.linalg.svdvals(u)
    assert float(sv.max()) < 1.3 and float(sv.min()) > 0.5  # roughly orthogonal


@pytest.mark.slow
@pytest.mark.parametrize("name", ["demo_reference", "ours_k4_1bit"])
def test_reduces_loss_on_small_problem(name: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(256, 96)
    w_true = torch.randn(96, 4)
    y = torch.tanh(x @ w_true / 10)
    hub = MemoryHub()
    peers = []
    for i in range(2):
        ident = _ident(10 + i)
        model = _model()
        peers.append(
            (
                model,
                DistroOptimizer(
                    model.named_parameters(),
                    preset(name, lr=3e-3),
                    hub.join(ident.peer_id),
                    ident,
                    roles=tensor_roles(model),
                ),
            )
        )
    losses = []
    for _step in range(40):
        for i, (model, opt) in enumerate(peers):
            opt.zero_grad()
            sl = slice(128 * i, 128 * (i + 1))
            loss = nn.functional.mse_loss(model(x[sl]), y[sl])
            loss.backward()
            opt.begin_step()
            if i == 0:
                losses.append(float(loss.detach()))
        for _, opt in peers:
            opt.finish_step()
    assert losses[-1] < 0.5 * losses[0]
    a, b = (list(m.parameters()) for m, _ in peers)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=False))


def test_bad_arguments() -> None:
    ident = _ident(2)
    ex = MemoryHub().join(ident.peer_id)
    with pytest.raises(ConfigError):
        DistroOptimizer([], DistroConfig(), ex, ident)
    with pytest.raises(ConfigError):
        DistroOptimizer(
            [("i", nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False))],
            DistroConfig(),
            ex,
            ident,
        )
    opt = DistroOptimizer(_model().named_parameters(), DistroConfig(), ex, ident)
    with pytest.raises(ConfigError):
        opt.finish_step()


def test_overlap_newcomer_adopting_a_state_applies_the_round_in_flight() -> None:
    """Overlap: a node that adopts the swarm's state at step t sent nothing for round t - 1, yet
    its first step collects and applies that round — and ends bit-identical with the donor."""
    from distronet.node.catchup.state import load_state_blob, state_blob

    hub, cfg = MemoryHub(), preset("ours_k32", lr=0.01, overlap=True)
    ids = [_ident(i) for i in range(3)]
    models = [_model(), _model(), _model(seed=7)]  # the newcomer starts from other weights
    opts = [
        DistroOptimizer(m.named_parameters(), cfg, hub.join(i.peer_id), i, roles=tensor_roles(m))
        for m, i in zip(models, ids, strict=True)
    ]
    gen = torch.Generator().manual_seed(3)

    def run(step: int, live: list[int]) -> None:
        for i in live:
            for p in models[i].parameters():
                p.grad = torch.randn(p.shape, generator=gen)
            opts[i].begin_step()
        for i in live:
            opts[i].finish_step()

    for t in range(4):
        run(t, [0, 1])
    load_state_blob(state_blob(4, models[0], opts[0]), models[2], opts[2])
    opts[2].resume_at(4)
    for t in (4, 5):
        run(t, [0, 1, 2])
        for a, c in zip(models[0].parameters(), models[2].parameters(), strict=True):
            assert torch.equal(a, c), t
    assert opts[2].reports[0].step == 3 and opts[2].reports[0].own_accepted is False
    assert opts[2].reports[-1].own_accepted is True


def test_a_saved_state_loads_back_and_an_older_chunk_order_one_is_converted() -> None:
    """``state_dict`` / ``load_state_dict`` keep every momentum (2-D ones spatial, back in the
    class buffers the selection reads in place); a state saved before ``momentum_layout`` 2
    (every momentum in chunk order) loads as the same momenta; a momentum of another shape is
    refused with a ValueError."""
    from distronet.node.optim.packets import momentum_buffers

    cfg = preset("ours_k32", lr=0.01)

    def net() -> nn.Module:  # two 64 x 64 matrices: one momentum class, one buffer
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))

    model = net()
    ident = _ident(4)

    def make(m: nn.Module) -> DistroOptimizer:  # a hub of its own each: one live peer per id
        return DistroOptimizer(
            m.named_parameters(), cfg, MemoryHub().join(ident.peer_id), ident, roles=tensor_roles(m)
        )

    opt = make(model)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    want = opt.momentum_chunks()
    assert any(p.spatial for p in opt.plans)
    saved = opt.state_dict()
    old = {
        "state": {
            i: {**st, "momentum": want[i].clone()} if "momentum" in st else dict(st)
            for i, st in saved["state"].items()
        },
        "param_groups": [
            {k: v for k, v in g.items() if k != "momentum_layout"} for g in saved["param_groups"]
        ],
    }
    for state in (saved, old):
        fresh = make(net())
        fresh.load_state_dict(state)
        for a, b in zip(fresh.momentum_chunks(), want, strict=True):
            assert torch.equal(a, b)
        held = fresh._momenta()
        one = momentum_buffers(fresh.plans, list(fresh.param_groups[0]["params"]))
        assert [tuple(h.shape) for h in held] == [tuple(h.shape) for h in one]
        assert len({h.untyped_storage().data_ptr() for h in held}) < len(held)  # classes share buffers
    bad = {**saved, "state": {**saved["state"], 0: {**saved["state"][0], "momentum": torch.zeros(3, 5)}}}
    fresh = make(net())
    with pytest.raises(ValueError, match="momentum"):
        fresh.load_state_dict(bad)
