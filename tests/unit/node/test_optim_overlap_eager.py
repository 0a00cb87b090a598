"""``overlap_predict="eager"``: the last round with this peer's part swapped for its fresh packet.

Tiny deterministic problems (a 2-layer MLP, a fixed batch per peer and step): with one peer the
eager guess is the own-packet guess bit for bit; with two peers the parameters are the consensus
minus α·lr(t)·rule((other's packet of t − 1 + own packet of t) / 2), written out by hand; the
consensus of every replica stays bit-identical.
"""

from __future__ import annotations

import copy
import hashlib
import math

import torch
from tiny_net import tiny_grads, tiny_model
from torch import nn

from distronet.kernels.decode import decode_sum
from distronet.node.exchange.memory import MemoryHub
from distronet.node.optim.config import DistroConfig, UpdateRule, lr_at, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.update import newton_schulz
from distronet.protocol.identity import Identity

_IDS = [Identity.from_seed(hashlib.sha256(b"overlap-eager %d" % i).digest()) for i in range(3)]


def _cfg(**kw: object) -> DistroConfig:
    fields: dict[str, object] = {"weight_decay": 0.1, "overlap": True, "overlap_scale": 0.7, **kw}
    return preset("ours_k32", lr=0.02, warmup_steps=3, total_steps=12, **fields)


def _swarm(cfg: DistroConfig, n: int) -> tuple[list[nn.Module], list[DistroOptimizer]]:
    hub = MemoryHub()
    models = [tiny_model() for _ in range(n)]
    opts = [
        DistroOptimizer(m.named_parameters(), cfg, hub.join(i.peer_id), i)
        for m, i in zip(models, _IDS[:n], strict=True)
    ]
    return models, opts


def _step(models: list[nn.Module], opts: list[DistroOptimizer], t: int) -> None:
    for i, (m, o) in enumerate(zip(models, opts, strict=True)):
        tiny_grads(m, i, t)
        o.begin_step()
    for o in opts:
        o.finish_step()


def test_one_peer_eager_is_own_bit_for_bit() -> None:
    """One peer: the last round is its own packet alone, so swapping it out leaves the fresh one."""
    own_m, own_o = _swarm(_cfg(overlap_predict="own"), 1)
    eag_m, eag_o = _swarm(_cfg(overlap_predict="eager"), 1)
    for t in range(10):
        _step(own_m, own_o, t)
        _step(eag_m, eag_o, t)
        for a, b in zip(own_m[0].parameters(), eag_m[0].parameters(), strict=True):
            assert torch.equal(a, b), t


def _decoded(opt: DistroOptimizer, step: int) -> list[torch.Tensor]:
    return [
        decode_sum(pl.layout, [(s.idx, s.val)], dtype=torch.float32)
        for pl, s in zip(opt.plans, opt._pending[step].sent, strict=True)
    ]


def test_two_peers_eager_guess_is_other_stale_plus_own_fresh() -> None:
    cfg = _cfg(overlap_predict="eager", weight_decay=0.0)
    models, opts = _swarm(cfg, 2)
    history: list[list[list[torch.Tensor]]] = []  # history[t][peer]: decoded packet of step t
    for t in range(8):
        for i, (m, o) in enumerate(zip(models, opts, strict=True)):
            tiny_grads(m, i, t)
            o.begin_step()
        history.append([_decoded(o, t) for o in opts])
        for o in opts:
            o.finish_step()
        if t == 0:
            continue
        alpha = cfg.overlap_scale * lr_at(cfg, t)  # round t - 1 applied, round t in flight
        for i, (m, o) in enumerate(zip(models, opts, strict=True)):
            other = 1 - i
            for j, (pl, p) in enumerate(zip(o.plans, m.parameters(), strict=True)):
                d = (history[t - 1][other][j] + history[t][i][j]) / 2.0
                if o._rule_for(pl) is UpdateRule.ORTHO:
                    guess = newton_schulz(d, cfg.ns_steps, cfg.eps) * math.sqrt(max(d.shape))
                else:  # the Adam-normalised rule with the current second moment, unchanged
                    st = o.state[p]
                    v_hat = st["v"] / (1.0 - cfg.beta2 ** st["n"])
                    guess = d / (v_hat.sqrt() + cfg.adam_eps)
                expect = o.state[p]["consensus"] - alpha * guess.reshape(p.shape)
                torch.testing.assert_close(p.detach(), expect, rtol=1e-5, atol=1e-6)
    for a, b in zip(opts[0].replicated_params(), opts[1].replicated_params(), strict=True):
        assert torch.equal(a, b)


def test_eager_replicas_share_the_consensus_and_flush_to_it() -> None:
    models, opts = _swarm(_cfg(overlap_predict="eager", overlap_start=2), 3)
    for t in range(9):
        _step(models, opts, t)
        cons = [o.replicated_params() for o in opts]
        assert all(torch.equal(a, b) for c in cons[1:] for a, b in zip(cons[0], c, strict=True)), t
    assert not all(
        torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True)
    )  # each peer's guess carries its own fresh packet
    before = copy.deepcopy([list(o.replicated_params()) for o in opts])
    for o in opts:
        o.flush()
    assert not all(torch.equal(a, b) for a, b in zip(before[0], opts[0].replicated_params(), strict=True))
    for m in models[1:]:
        assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), m.parameters(), strict=True))
