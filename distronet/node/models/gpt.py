"""The built-in GPT: a small decoder-only transformer in the nanoGPT mould.

Reads top to bottom: config → attention → MLP → block → model. Shapes are in the comments
(B batch, T time, C channels = width, nh heads, hs head size = C / nh, V vocabulary).
The model is single-device code; peers and optimizers are applied from outside. It runs on
any torch device (CPU, CUDA, MPS): nothing here names a device.

Initialisation is deterministic from a seed: every parameter is drawn on the CPU from one
``torch.Generator`` in a fixed order, so two machines building ``GPT(cfg, seed=s)`` get
bit-identical weights whatever device they move them to afterwards.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from distronet.node.models.spec import GPTConfig
from distronet.protocol.errors import ConfigError

__all__ = ["GPT", "GPTConfig"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees only positions <= t."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.width, 3 * cfg.width, bias=cfg.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(cfg.width, cfg.width, bias=cfg.bias)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # 3 x (B, T, C)
        hs = C // self.heads
        q = q.view(B, T, self.heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads side by side: (B, T, C)
        out: Tensor = self.resid_drop(self.c_proj(y))  # (B, T, C)
        return out


class MLP(nn.Module):
    """Position-wise feed-forward: C → 4C → C with GELU."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.width, 4 * cfg.width, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.width, cfg.width, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.drop(self.c_proj(F.gelu(self.c_fc(x))))  # (B, T, C)
        return out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        out: Tensor = x + self.mlp(self.ln_2(x))
        return out


class GPT(nn.Module):
    """Decoder-only transformer over a token vocabulary.

    ``forward(idx)`` takes int64 token ids ``(B, T)`` with ``T <= cfg.context`` and returns
    logits ``(B, T, V)``; ``loss(idx, targets)`` returns the mean next-token cross-entropy.
    """

    def __init__(self, cfg: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.checkpointing = False  # recompute each block's activations in backward (training only)
        # torch's default initialisers draw from the global RNG; fork it so building a model
        # leaves the caller's random stream untouched (our own init below uses its own generator)
        with torch.random.fork_rng(devices=[]):
            self._build(cfg)
        self.reset_parameters(seed)

    def _build(self, cfg: GPTConfig) -> None:
        self.wte = nn.Embedding(cfg.vocab, cfg.width)  # token embedding
        self.wpe = nn.Embedding(cfg.context, cfg.width)  # position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.ln_f = nn.LayerNorm(cfg.width, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight  # the same Parameter object: one tensor, two uses

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Draw every parameter from ``seed`` (GPT-2 scheme), in ``named_parameters`` order.

        Linear and embedding weights ~ N(0, 0.02); residual projections ~ N(0, 0.02/sqrt(2·depth))
        so the residual stream's variance does not grow with depth; biases 0; norms weight 1.
        """
        g = torch.Generator(device="cpu").manual_seed(seed)
        resid_std = 0.02 / math.sqrt(2 * self.cfg.depth)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                value = torch.zeros(p.shape)
            elif ".ln_" in name or name.startswith("ln_"):
                value = torch.ones(p.shape)
            else:
                std = resid_std if name.endswith("c_proj.weight") else 0.02
                value = torch.empty(p.shape).normal_(0.0, std, generator=g)
            p.copy_(value.to(dtype=p.dtype, device=p.device))

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied matrix counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: Tensor) -> Tensor:
        t = idx.shape[1]  # idx: (B, T)
        if t > self.cfg.context:
            raise ConfigError(f"sequence of {t} tokens is longer than the model's context {self.cfg.context}")
        pos = torch.arange(t, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C) + (T, C) broadcast
        recompute = self.checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:  # keep only the block's input; its activations are recomputed in backward
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)  # (B, T, C)
        logits: Tensor = self.lm_head(self.ln_f(x))  # (B, T, V)
        return logits

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy of predicting ``targets`` ``(B, T)`` from ``idx`` ``(B, T)``."""
        logits = self(idx)  # (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
