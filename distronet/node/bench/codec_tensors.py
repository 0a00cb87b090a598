"""The tensors `bench codec` compresses: real momentum of the built-in GPT and of a larger Llama
(``arch = "hf"``), and a big matrix.

The momentum comes from a short DeMo-style run of the built-in GPT on the built-in corpus:
each step ``m <- beta * m + grad``, the top-k (k = 32, chunk 64) of ``DCT(m)`` is "sent",
``m`` keeps the rest (error feedback) and the parameters step along the sign of what was sent.
The benchmark encodes ``m`` as it stands after the last step's gradient is folded in, which is
exactly what a node would transmit at that step.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from distronet.kernels.decode import decode_sum
from distronet.kernels.layout import ChunkLayout, plan_layout
from distronet.kernels.topk import dct_topk
from distronet.node.data import load_builtin_corpus
from distronet.node.models.gpt import GPT, GPTConfig

__all__ = ["LLAMA_CONFIG", "TensorSet", "big_matrix", "gpt_momentum", "llama_model", "llama_momentum"]


@dataclass(frozen=True)
class TensorSet:
    """Named tensors that travel together in one packet, with their layouts."""

    name: str
    names: tuple[str, ...]
    tensors: tuple[torch.Tensor, ...]
    layouts: tuple[ChunkLayout, ...]

    @property
    def numel(self) -> int:
        """Parameters in the set."""
        return sum(t.numel() for t in self.tensors)


def _make_set(name: str, named: list[tuple[str, torch.Tensor]], chunk: int) -> TensorSet:
    return TensorSet(
        name=name,
        names=tuple(n for n, _ in named),
        tensors=tuple(t.detach().float().contiguous() for _, t in named),
        layouts=tuple(plan_layout(tuple(t.shape), chunk) for _, t in named),
    )


LLAMA_CONFIG: dict[str, object] = {
    "model_type": "llama",
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}
"""The larger model of ``bench codec --model llama``: a Llama of ~5.3M parameters (6x the GPT),
38 tensors, through ``[model] arch = "hf"`` (``models/hf.py``)."""


def _momentum(
    name: str,
    model: torch.nn.Module,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    context: int,
    steps: int,
    chunk: int,
    beta: float,
    lr: float,
    seed: int,
) -> TensorSet:
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    layouts = {n: plan_layout(tuple(p.shape), chunk) for n, p in params}
    momentum = {n: torch.zeros_like(p) for n, p in params}
    tokens = load_builtin_corpus().train
    rng = np.random.default_rng(seed)
    for step in range(steps):
        starts = rng.integers(0, len(tokens) - context - 1, size=8)
        win = np.stack([tokens[s : s + context + 1] for s in starts]).astype(np.int64)
        model.zero_grad(set_to_none=True)
        loss(torch.from_numpy(win[:, :-1]), torch.from_numpy(win[:, 1:])).backward()
        with torch.no_grad():
            for n, p in params:
                assert p.grad is not None
                m = momentum[n].mul_(beta).add_(p.grad)
                if step == steps - 1:
                    continue  # the last step's momentum, before its error feedback, is what it sends
                lay = layouts[n]
                sent = decode_sum(lay, [dct_topk(m, lay, min(32, lay.chunk_numel))], method="dense")
                m.sub_(sent)
                p.sub_(lr * sent.sign())
    return _make_set(f"{name}-momentum({steps} steps)", [(n, momentum[n]) for n, _ in params], chunk)


def gpt_momentum(
    steps: int, *, chunk: int = 64, beta: float = 0.999, lr: float = 1e-3, seed: int = 0
) -> TensorSet:
    """Momentum of the default built-in GPT after ``steps`` DeMo-style steps (batch 8 x 128 tokens).

    Cost: ``steps`` forward/backward passes of a ~0.9M-parameter model on CPU.
    """
    cfg = GPTConfig()
    model = GPT(cfg, seed=seed)
    return _momentum("gpt", model, model.loss, cfg.context, steps, chunk, beta, lr, seed)


def llama_model(seed: int = 0) -> torch.nn.Module:
    """The Llama of :data:`LLAMA_CONFIG`, built as a node builds an ``arch = "hf"`` run's model."""
    from distronet.node.models.hf import build_hf_model
    from distronet.node.models.spec import ModelSpec

    spec = ModelSpec(gpt=None, seed=seed, hf_json=json.dumps(LLAMA_CONFIG, sort_keys=True))
    return build_hf_model(spec, torch.device("cpu"))


def llama_momentum(
    steps: int, *, chunk: int = 64, beta: float = 0.999, lr: float = 1e-3, seed: int = 0, context: int = 128
) -> TensorSet:
    """Momentum of the :data:`LLAMA_CONFIG` Llama after ``steps`` DeMo-style steps (batch 8 x
    ``context`` tokens of the built-in corpus: byte tokens, so ids below 256 of its 8,192).

    Cost: ``steps`` forward/backward passes of a ~5.3M-parameter model on CPU.
    """
    from distronet.node.models.hf import causal_lm_loss

    model = llama_model(seed)
    return _momentum(
        "llama", model, lambda x, y: causal_lm_loss(model, x, y), context, steps, chunk, beta, lr, seed
    )


def big_matrix(n: int, *, chunk: int = 64, seed: int = 0) -> TensorSet:
    """An ``n x n`` fp32 Gaussian matrix (the transform-speed workload)."""
    g = torch.Generator().manual_seed(seed)
    return _make_set(f"randn {n}x{n}", [("w", torch.randn(n, n, generator=g))], chunk)
