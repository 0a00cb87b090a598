"""The compute-backend interface and its torch implementation (see the package docstring)."""

from __future__ import annotations

import abc

import torch
from torch import Tensor, nn

from distronet.node.models.build import model_loss

__all__ = ["ComputeBackend", "TorchBackend"]


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

    def describe(self) -> str:
        """A short human description for logs and the status (e.g. ``torch cuda``)."""
        return f"torch {self.device.type}"


class TorchBackend(ComputeBackend):
    """torch computes everything on ``device``: the model's own ``loss`` (a Hugging Face model's
    cross-entropy of its logits: ``models.build.model_loss``) and autograd."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.name = device.type

    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        return model_loss(model, x.to(self.device), y.to(self.device))
