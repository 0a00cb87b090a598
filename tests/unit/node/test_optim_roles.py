"""Tensor roles from the model's structure (``optim/roles.py``), and the optimizer applying them."""

from __future__ import annotations

import hashlib

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distronet.node.exchange.memory import MemoryHub
from distronet.node.models.build import build_model
from distronet.node.models.gpt import GPT
from distronet.node.models.spec import ModelSpec
from distronet.node.optim.config import DistroConfig, UpdateRule, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import Role, tensor_roles
from distronet.node.optim.update import apply_rule
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

E, H, V, HID = Role.EMBEDDING, Role.HEAD, Role.VECTOR, Role.HIDDEN
OLD_ORTHO_SKIP = ("wte", "wpe", "lm_head", "embed", "head")  # the name parts the rule once used
SMALL = {"depth": 2, "width": 32, "heads": 2, "context": 16, "vocab": 48, "seed": 3, "seq_len": 8}


def _gpt(tie: bool) -> GPT:
    return build_model(ModelSpec.from_run({**SMALL, "tie_weights": tie}), torch.device("cpu"))


def _want_gpt(tie: bool, depth: int = 2) -> list[Role]:
    """The built-in GPT's roles in parameter order (bias=True): what the name rule gave it."""
    block = [V, V, HID, V, HID, V, V, V, HID, V, HID, V]  # ln_1, attn (c_attn, c_proj), ln_2, mlp
    return [E, E, *block * depth, V, V, *([] if tie else [H])]


class _Mix(nn.Module):
    """Causal self-attention, re-implemented under other names (same maths as ``gpt.py``)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.n = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n, C // self.n).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: Tensor = self.out(y.transpose(1, 2).contiguous().view(B, T, C))
        return out


class _Layer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.n1 = nn.LayerNorm(width)
        self.mix = _Mix(width, heads)
        self.n2 = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mix(self.n1(x))
        out: Tensor = x + self.ff(self.n2(x))
        return out


class _Renamed(nn.Module):
    """The built-in GPT's architecture with no parameter name sharing a part with the old rule's."""

    def __init__(self, src: GPT) -> None:
        super().__init__()
        c = src.cfg
        self.tok = nn.Embedding(c.vocab, c.width)
        self.pos = nn.Embedding(c.context, c.width)
        self.layers = nn.ModuleList(_Layer(c.width, c.heads) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width)
        self.proj_out = nn.Linear(c.width, c.vocab, bias=False)
        if c.tie_weights:
            self.proj_out.weight = self.tok.weight
        with torch.no_grad():  # the same weights, parameter by parameter (the same order)
            mine, theirs = list(self.parameters()), list(src.parameters())
            assert [p.shape for p in mine] == [p.shape for p in theirs]
            for a, b in zip(mine, theirs, strict=True):
                a.copy_(b)

    def forward(self, idx: Tensor) -> Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for layer in self.layers:
            x = layer(x)
        out: Tensor = self.proj_out(self.norm(x))
        return out


def test_builtin_gpt_roles() -> None:
    for tie in (False, True):
        roles = tensor_roles(_gpt(tie))
        assert list(roles.values()) == _want_gpt(tie), tie
        assert roles["wte.weight"] is E and roles["wpe.weight"] is E
        assert roles["blocks.0.ln_1.weight"] is V and roles["blocks.1.attn.c_attn.bias"] is V
        assert roles["blocks.1.mlp.c_proj.weight"] is HID and roles["blocks.0.attn.c_proj.weight"] is HID
        assert ("lm_head.weight" in roles) is not tie  # tied: named_parameters yields wte.weight only
        if not tie:
            assert roles["lm_head.weight"] is H


def _step(model: nn.Module, cfg: DistroConfig) -> list[Tensor]:
    """One single-replica step with fixed gradients; returns each parameter's change."""
    ident = Identity.from_seed(hashlib.sha256(b"roles-test").digest())
    opt = DistroOptimizer(
        model.named_parameters(), cfg, MemoryHub().join(ident.peer_id), ident, roles=tensor_roles(model)
    )
    gen = torch.Generator().manual_seed(11)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    assert opt.reports[-1].own_accepted
    return [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]


@pytest.mark.parametrize("tie", [False, True])
def test_renamed_model_gets_the_builtin_roles_and_updates(tie: bool) -> None:
    """Must show: a model whose parameter names share no substring with the old ``ortho_skip``
    gets the same per-tensor roles as the built-in GPT, and the same update."""
    gpt = _gpt(tie)
    other = _Renamed(gpt)
    names = [n for n, _ in other.named_parameters()]
    assert not [n for n in names if any(s in n for s in OLD_ORTHO_SKIP)], names
    assert list(tensor_roles(other).values()) == list(tensor_roles(gpt).values()) == _want_gpt(tie)
    x = torch.randint(0, SMALL["vocab"], (2, 8))
    assert torch.equal(other(x), gpt(x))  # really the same model
    cfg = preset("ours_k32", lr=0.01, warmup_steps=0)
    assert cfg.update.rule is UpdateRule.ORTHO
    for a, b in zip(_step(gpt, cfg), _step(other, cfg), strict=True):
        assert torch.equal(a, b)
        assert a.abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(gpt.parameters(), other.parameters(), strict=True))


class _Toy(nn.Module):
    """An embedding, a hidden matrix as wide as the vocabulary, a head (tied or not)."""

    def __init__(self, tie: bool, vocab: int = 24) -> None:
        super().__init__()
        self.a = nn.Embedding(vocab, vocab)
        self.b = nn.Linear(vocab, vocab)  # out_features == vocab, but not the last such Linear
        self.c = nn.Parameter(torch.zeros(3, 5))  # a bare matrix: hidden
        self.d = nn.Linear(vocab, vocab, bias=True)
        if tie:
            self.d.weight = self.a.weight


def test_untied_and_tied_heads() -> None:
    assert tensor_roles(_Toy(tie=False)) == {
        "a.weight": E,
        "b.weight": HID,
        "b.bias": V,
        "c": HID,
        "d.weight": H,
        "d.bias": V,
    }
    assert tensor_roles(_Toy(tie=True)) == {
        "a.weight": E,
        "b.weight": HID,
        "b.bias": V,
        "c": HID,
        "d.bias": V,
    }
    # no embedding: no vocabulary, so no head; every matrix is hidden
    plain = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 4))
    assert tensor_roles(plain) == {"0.weight": HID, "0.bias": V, "2.weight": HID, "2.bias": V}


class _HFLike(_Toy):
    """A model with Hugging Face's accessors: they decide, not the Linear rule."""

    def __init__(self, head: str | None) -> None:
        super().__init__(tie=False)
        self.head_name = head

    def get_input_embeddings(self) -> nn.Module:
        return self.a

    def get_output_embeddings(self) -> nn.Module | None:
        return None if self.head_name is None else getattr(self, self.head_name)


def test_hugging_face_accessors_name_the_head() -> None:
    assert tensor_roles(_HFLike("b"))["b.weight"] is H
    assert tensor_roles(_HFLike("b"))["d.weight"] is HID
    assert H not in tensor_roles(_HFLike(None)).values()


def test_ortho_orthogonalises_only_hidden_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under an ORTHO preset the hidden matrices get the orthogonalised update, every other role
    the fallback; the parameter moves by exactly lr x that direction."""
    seen: dict[str, tuple[UpdateRule, Tensor, Tensor]] = {}
    orig = DistroOptimizer._direction

    def spy(self: DistroOptimizer, plan, p, d):  # type: ignore[no-untyped-def]
        u = orig(self, plan, p, d)
        seen[plan.name] = (self._rule_for(plan), d.clone(), u.clone())
        return u

    monkeypatch.setattr(DistroOptimizer, "_direction", spy)
    lr = 0.01
    cfg = preset("ours_k32", lr=lr, warmup_steps=0, weight_decay=0.0)
    assert (cfg.update.rule, cfg.update.fallback) == (UpdateRule.ORTHO, UpdateRule.ADAM)
    gpt = _gpt(tie=False)
    roles = tensor_roles(gpt)
    deltas = _step(gpt, cfg)
    assert set(seen) == set(roles)
    for (name, role), delta in zip(roles.items(), deltas, strict=True):
        rule, d, u = seen[name]
        assert rule is (UpdateRule.ORTHO if role is HID else UpdateRule.ADAM), name
        torch.testing.assert_close(delta, lr * u.reshape(delta.shape), rtol=1e-5, atol=1e-7)
        if role is HID:
            assert torch.equal(u, apply_rule(UpdateRule.ORTHO, d))
            assert not torch.allclose(u, apply_rule(UpdateRule.RMS, d), atol=1e-3)  # really changed


def test_roles_are_required_for_ortho_and_checked() -> None:
    gpt = _gpt(tie=False)
    ident = Identity.from_seed(b"\x07" * 32)
    ex = MemoryHub().join(ident.peer_id)
    with pytest.raises(ConfigError, match="roles"):
        DistroOptimizer(gpt.named_parameters(), preset("ours_k32"), ex, ident)
    DistroOptimizer(gpt.named_parameters(), preset("psyche"), ex, ident)  # one rule for all: no roles needed
    roles = tensor_roles(gpt)
    with pytest.raises(ConfigError, match="missing"):
        DistroOptimizer(
            gpt.named_parameters(), preset("psyche"), ex, ident, roles=dict(list(roles.items())[1:])
        )
    with pytest.raises(ConfigError, match="cannot have role"):
        DistroOptimizer(
            gpt.named_parameters(), preset("ours_k32"), ex, ident, roles={**roles, "ln_f.weight": HID}
        )
    with pytest.raises(ConfigError, match="cannot have role"):
        DistroOptimizer(
            gpt.named_parameters(), preset("ours_k32"), ex, ident, roles={**roles, "wte.weight": V}
        )
