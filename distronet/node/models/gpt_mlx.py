"""The built-in GPT ported to MLX: the same blocks, parameter names, shapes and maths as ``gpt.py``.

Apple's MLX runs this on the GPU of an Apple-silicon Mac (and on a CPU anywhere, through the
``mlx[cpu]`` wheel). Only the forward and backward pass run here: the node keeps its parameters,
optimizer and codec in torch (``distronet.node.backends.mlx``), loads them into this model before
each step and hands the gradients back, so replicas stay bit-identical whatever computed them.

Every parameter has the name and shape of its twin in ``GPT.named_parameters()`` (a tied output
head is ``wte.weight`` alone, as in torch), and MLX's ``Linear`` stores its weight ``(out, in)``
like torch, so a state moves across by name with no transposes. There is no initialiser of our
own: ``load_torch`` copies the torch model's parameters in; the modules' own random draws are
never used. Shapes in comments as in ``gpt.py`` (B, T, C, nh, hs, V).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from distronet.node.models.gpt import GPTConfig
from distronet.protocol.errors import ConfigError

__all__ = ["GPTMLX", "flatten"]


def flatten(tree: Any) -> dict[str, mx.array]:
    """A nested MLX parameter (or gradient) tree as ``{dotted name: array}`` (``blocks.0.ln_1.weight``)."""
    return dict(cast(list[tuple[str, mx.array]], tree_flatten(tree)))


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees only positions <= t."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = nn.Linear(cfg.width, 3 * cfg.width, bias=cfg.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.width, cfg.width, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def __call__(self, x: mx.array) -> mx.array:
        B, T, C = x.shape
        hs = C // self.heads
        q, k, v = mx.split(self.c_attn(x), 3, axis=2)  # 3 x (B, T, C)
        q = q.reshape(B, T, self.heads, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        k = k.reshape(B, T, self.heads, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        v = v.reshape(B, T, self.heads, hs).transpose(0, 2, 1, 3)  # (B, nh, T, hs)
        # no attention dropout: MLX's fused kernel has none (torch's draws differ anyway)
        y = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(hs), mask="causal")
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # heads side by side: (B, T, C)
        out: mx.array = self.resid_drop(self.c_proj(y))
        return out


class MLP(nn.Module):
    """Position-wise feed-forward: C → 4C → C with exact (erf) GELU, as torch's ``F.gelu``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.width, 4 * cfg.width, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.width, cfg.width, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def __call__(self, x: mx.array) -> mx.array:
        out: mx.array = self.drop(self.c_proj(nn.gelu(self.c_fc(x))))  # (B, T, C)
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.width, bias=cfg.bias)  # eps 1e-5, as torch
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        out: mx.array = x + self.mlp(self.ln_2(x))
        return out


class GPTMLX(nn.Module):
    """Decoder-only transformer; ``loss(idx, targets)`` is the mean next-token cross-entropy.

    ``idx`` and ``targets`` are integer ``(B, T)`` arrays with ``T <= cfg.context``.
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)  # token embedding
        self.wpe = nn.Embedding(cfg.context, cfg.width)  # position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = [Block(cfg) for _ in range(cfg.depth)]
        self.ln_f = nn.LayerNorm(cfg.width, bias=cfg.bias)
        if not cfg.tie_weights:
            self.lm_head = nn.Linear(cfg.width, cfg.vocab, bias=False)

    def parameter_names(self) -> list[str]:
        """Every parameter's dotted name (``blocks.0.attn.c_attn.weight``), sorted."""
        return sorted(flatten(self.parameters()))

    def load_torch(self, named: Iterable[tuple[str, np.ndarray]]) -> None:
        """Replace every parameter with ``named`` (name, float array) pairs, e.g. from torch.

        Raises ``ConfigError`` when a name is missing or extra, or a shape differs.
        """
        arrays = [(name, mx.array(a)) for name, a in named]
        try:
            self.load_weights(arrays, strict=True)
        except ValueError as e:
            raise ConfigError(f"the MLX GPT does not match the torch GPT's parameters: {e}") from e

    def __call__(self, idx: mx.array) -> mx.array:
        t = idx.shape[1]  # idx: (B, T)
        if t > self.cfg.context:
            raise ConfigError(f"sequence of {t} tokens is longer than the model's context {self.cfg.context}")
        x = self.drop(self.wte(idx) + self.wpe(mx.arange(t)))  # (B, T, C) + (T, C) broadcast
        for block in self.blocks:
            x = block(x)  # (B, T, C)
        x = self.ln_f(x)
        logits: mx.array = self.wte.as_linear(x) if self.cfg.tie_weights else self.lm_head(x)  # (B, T, V)
        return logits

    def loss(self, idx: mx.array, targets: mx.array) -> mx.array:
        """Mean cross-entropy of predicting ``targets`` ``(B, T)`` from ``idx`` ``(B, T)``; a scalar."""
        logits = self(idx)  # (B, T, V)
        out: mx.array = nn.losses.cross_entropy(logits, targets, reduction="mean")
        return out
