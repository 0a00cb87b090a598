"""The compute-backend interface and its torch implementation (see the package docstring)."""

from __future__ import annotations

import abc

import torch
from torch import Tensor, nn

from distronet.node.models.build import model_loss
from distronet.protocol.errors import ConfigError

__all__ = ["PRECISIONS", "ComputeBackend", "TorchBackend", "resolve_precision"]


class ComputeBackend(abc.ABC):
    """Computes a model's loss on a batch; ``loss(...).backward()`` fills every parameter's ``.grad``.

    ``name`` is the ``--device`` value it serves (``cuda``, ``mps``, ``cpu``, ``mlx``); ``device``
    is the torch device where the model's parameters, the optimizer state and the batch live.
    """

    name: str
    device: torch.device

    @abc.abstractmethod
    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """The mean loss of ``model`` on tokens ``x`` and targets ``y`` (``(B, T)`` int64 on ``device``).

        Returns a scalar tensor whose ``backward()`` accumulates the gradient into the torch
        parameters' ``.grad`` as ``model.loss(x, y).backward()`` would.
        """

    precision: str = "fp32"  # what the forward computes in (TorchBackend: bf16 on CUDA)
    checkpointing: bool = True  # whether activation checkpointing can be used (MLX: no)

    def describe(self) -> str:
        """A short human description for logs and the status (e.g. ``torch cuda``)."""
        return f"torch {self.device.type}"


PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(device: torch.device, precision: str = "auto") -> str:
    """The precision a torch backend computes in on ``device``: ``bf16`` (autocast; parameters,
    gradients and the optimizer's state stay float32) only on CUDA, ``auto`` taking it where the
    card supports bf16; ``fp32`` everywhere else. Raises ``ConfigError`` for bf16 off CUDA."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device.type != "cuda":
        if precision == "bf16":
            raise ConfigError(f"precision bf16 is for CUDA devices; {device.type} trains in fp32")
        return "fp32"
    if precision == "auto":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return precision


class TorchBackend(ComputeBackend):
    """torch computes everything on ``device``: the model's own ``loss`` (a Hugging Face model's
    cross-entropy of its logits: ``models.build.model_loss``) and autograd.

    ``precision`` (:func:`resolve_precision`): on CUDA the forward runs under bf16 autocast
    (matmuls in bf16, reductions and the loss in fp32) while the parameters, their gradients and
    the optimizer's momentum stay float32 (the master copy); the CPU always computes in fp32."""

    def __init__(self, device: torch.device, precision: str = "auto") -> None:
        self.device = device
        self.name = device.type
        self.precision = resolve_precision(device, precision)

    def describe(self) -> str:
        return f"torch {self.device.type} {self.precision}"

    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        x, y = x.to(self.device), y.to(self.device)
        if self.precision == "bf16":
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                out = model_loss(model, x, y)
            return out.float()
        return model_loss(model, x, y)
