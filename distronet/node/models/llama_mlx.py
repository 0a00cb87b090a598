"""The Llama architecture in MLX, with Hugging Face's parameter names: an Apple volunteer's twin of
an ``arch = "hf"`` Llama run (``model_type = "llama"``).

Like ``gpt_mlx.py``, only the forward and backward pass run here: ``backends/mlx_backend.py`` copies
the torch model's parameters in by name before each step (MLX's ``Linear`` stores ``(out, in)`` as
torch does: no transposes) and hands the gradients back, so the update every replica applies is
the torch optimizer's. The maths follows ``transformers``' ``LlamaForCausalLM`` for the configs a
run may name: RMSNorm (``rms_norm_eps``), rotary embeddings on the two halves of each head
(``rope_theta``, the default rope type only), grouped-query attention (``num_key_value_heads``),
a SwiGLU MLP (``hidden_act = "silu"``), no biases, an untied or tied head. Anything else
(attention or MLP biases, another rope type or activation) is refused with a ``ConfigError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from distronet.protocol.errors import ConfigError

__all__ = ["LlamaMLX", "LlamaShape"]


class LlamaShape:
    """The few numbers of a Hugging Face ``LlamaConfig`` this model needs, checked."""

    def __init__(self, config: Any) -> None:
        def get(key: str, default: Any = None) -> Any:
            return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)

        if get("model_type") != "llama":
            raise ConfigError(f"the MLX Llama trains model_type 'llama', not {get('model_type')!r}")
        if get("attention_bias", False) or get("mlp_bias", False) or get("hidden_act", "silu") != "silu":
            raise ConfigError("the MLX Llama has no attention or MLP biases and a silu MLP only")
        rope = get("rope_parameters") or get("rope_scaling") or {}
        if rope.get("rope_type", "default") != "default":
            raise ConfigError(f"the MLX Llama has the default rope only, not {rope.get('rope_type')!r}")
        self.width = int(get("hidden_size"))
        self.depth = int(get("num_hidden_layers"))
        self.heads = int(get("num_attention_heads"))
        self.kv_heads = int(get("num_key_value_heads") or self.heads)
        self.head_dim = int(get("head_dim") or self.width // self.heads)
        self.ffn = int(get("intermediate_size"))
        self.vocab = int(get("vocab_size"))
        self.eps = float(get("rms_norm_eps", 1e-6))
        self.theta = float(rope.get("rope_theta", get("rope_theta", 10000.0)))
        self.tied = bool(get("tie_word_embeddings", False))


class _Attention(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = s.heads, s.kv_heads, s.head_dim
        self.q_proj = nn.Linear(s.width, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.width, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.width, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.width, bias=False)
        self.rope = nn.RoPE(s.head_dim, traditional=False, base=s.theta)  # halves, as HF rotates

    def __call__(self, x: mx.array) -> mx.array:
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.heads, self.head_dim).transpose(0, 2, 1, 3)
        k = self.k_proj(x).reshape(B, T, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, T, self.kv_heads, self.head_dim).transpose(0, 2, 1, 3)
        q, k = self.rope(q), self.rope(k)
        y = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(self.head_dim), mask="causal")
        out: mx.array = self.o_proj(y.transpose(0, 2, 1, 3).reshape(B, T, -1))
        return out


class _MLP(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(s.width, s.ffn, bias=False)
        self.up_proj = nn.Linear(s.width, s.ffn, bias=False)
        self.down_proj = nn.Linear(s.ffn, s.width, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        out: mx.array = self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class _Layer(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.self_attn = _Attention(s)
        self.mlp = _MLP(s)
        self.input_layernorm = nn.RMSNorm(s.width, eps=s.eps)
        self.post_attention_layernorm = nn.RMSNorm(s.width, eps=s.eps)

    def __call__(self, x: mx.array) -> mx.array:
        x = x + self.self_attn(self.input_layernorm(x))
        out: mx.array = x + self.mlp(self.post_attention_layernorm(x))
        return out


class _Body(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.width)
        self.layers = [_Layer(s) for _ in range(s.depth)]
        self.norm = nn.RMSNorm(s.width, eps=s.eps)


class LlamaMLX(nn.Module):
    """``LlamaForCausalLM``'s forward in MLX: ``model.*`` and ``lm_head.weight`` (untied) by HF name."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.shape = LlamaShape(config)
        self.model = _Body(self.shape)
        if not self.shape.tied:
            self.lm_head = nn.Linear(self.shape.width, self.shape.vocab, bias=False)

    def load_torch(self, named: Iterable[tuple[str, np.ndarray]]) -> None:
        """Replace every parameter with ``named`` (name, float array) pairs from the torch model.

        Raises ``ConfigError`` when a name is missing or extra, or a shape differs."""
        try:
            self.load_weights([(name, mx.array(a)) for name, a in named], strict=True)
        except ValueError as e:
            raise ConfigError(f"the MLX Llama does not match the torch model's parameters: {e}") from e

    def __call__(self, idx: mx.array) -> mx.array:
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        x = self.model.norm(x)
        logits: mx.array = self.model.embed_tokens.as_linear(x) if self.shape.tied else self.lm_head(x)
        return logits

    def loss(self, idx: mx.array, targets: mx.array) -> mx.array:
        """Mean cross-entropy of predicting ``targets`` ``(B, T)`` from ``idx`` ``(B, T)``; a scalar."""
        out: mx.array = nn.losses.cross_entropy(self(idx), targets, reduction="mean")
        return out
