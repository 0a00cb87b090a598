"""``MLXBackend``: the model's forward and backward pass in MLX (the built-in GPT, ``gpt_mlx.py``, or
an ``arch = "hf"`` Llama, ``llama_mlx.py``), everything else in torch.

Each step the backend copies the torch parameters into an MLX twin of the model
(``GPTMLX``, same names and shapes), computes loss and gradients there, and hands the gradients
back through a ``torch.autograd.Function``: ``backend.loss(model, x, y)`` is a torch scalar whose
``backward()`` fills ``p.grad`` exactly as torch's own autograd would. The optimizer, the codec
and the parameter copy stay torch tensors on the CPU, so the update a replica applies does not
depend on which backend computed its gradient. The copy each way is one pass over the
parameters (about 4 MB for the default model; on Apple silicon's unified memory, a memcpy).

MLX streams are per thread since mlx 0.31.2 (a stream made on one thread cannot run work on
another), and the daemon runs each step in a worker thread; so every thread computes on a stream
of its own, made on first use.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as mnn
import numpy as np
import torch
from torch import Tensor, nn

from distronet.node.backends.base import ComputeBackend
from distronet.node.models.gpt import GPT
from distronet.node.models.gpt_mlx import GPTMLX, flatten
from distronet.node.models.llama_mlx import LlamaMLX
from distronet.protocol.errors import ConfigError

__all__ = ["MLXBackend"]


class MLXBackend(ComputeBackend):
    """MLX computes the loss and gradients of a torch ``GPT`` (or Hugging Face Llama) whose
    parameters stay on the CPU.

    ``steps`` counts the forward/backward passes MLX has run. Raises ``ConfigError`` for a model
    that is neither the built-in GPT nor a Llama, or whose parameters are not float32.
    """

    name = "mlx"
    checkpointing = False  # no activation checkpointing in the MLX twins: refused (models.build)

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.steps = 0
        self._twins: weakref.WeakKeyDictionary[nn.Module, GPTMLX | LlamaMLX] = weakref.WeakKeyDictionary()
        self._local = threading.local()

    def describe(self) -> str:
        return f"mlx {mx.default_device()}"

    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        params = [p for _, p in model.named_parameters()]
        out: Tensor = _MLXLoss.apply(self, model, x, y, *params)
        return out

    def loss_and_grads(self, model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Loss (a float32 scalar) and each parameter's gradient, in ``named_parameters`` order."""
        named = list(model.named_parameters())
        twin = self._twin(model)
        with mx.stream(self._stream()):
            twin.load_torch((name, p.detach().cpu().numpy()) for name, p in named)
            twin.train(model.training)
            step = mnn.value_and_grad(twin, twin.loss)
            loss, grads = step(_tokens(x), _tokens(y))
            mx.eval(loss, grads)
            flat = flatten(grads)
            out = [torch.from_numpy(np.array(flat[name], copy=True)) for name, _ in named]
            value = torch.from_numpy(np.array(loss, copy=True))
        self.steps += 1
        return value, out

    def _twin(self, model: nn.Module) -> GPTMLX | LlamaMLX:
        twin = self._twins.get(model)
        if twin is None:
            config = getattr(model, "config", None)
            llama = getattr(config, "model_type", None) == "llama"
            if not isinstance(model, GPT) and not llama:
                raise ConfigError(
                    f"--device mlx trains the built-in GPT and Llamas, not {type(model).__name__}"
                )
            bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
            if bad:
                raise ConfigError(f"--device mlx needs float32 parameters; not: {', '.join(bad)}")
            with mx.stream(self._stream()):
                twin = GPTMLX(model.cfg) if isinstance(model, GPT) else LlamaMLX(config)
            self._twins[model] = twin
        return twin

    def _stream(self) -> mx.Stream:
        stream: mx.Stream | None = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = mx.new_stream(mx.default_device())
        return stream


def _tokens(t: Tensor) -> mx.array:
    """A torch int64 ``(B, T)`` batch as an MLX int32 array (token ids and vocabularies < 2**31)."""
    return mx.array(t.detach().cpu().numpy().astype(np.int32))


class _MLXLoss(torch.autograd.Function):
    """Forward: MLX computes loss and gradients at once. Backward: hands the gradients to torch."""

    @staticmethod
    def forward(
        ctx: Any, backend: MLXBackend, model: nn.Module, x: Tensor, y: Tensor, *params: Tensor
    ) -> Tensor:
        loss, grads = backend.loss_and_grads(model, x, y)
        ctx.grads = grads
        return loss

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grads: list[Tensor] = ctx.grads
        ctx.grads = None
        return (None, None, None, None, *(grad_out * g for g in grads))
