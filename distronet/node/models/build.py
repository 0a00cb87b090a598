"""Building the run's model from its :class:`~distronet.node.models.spec.ModelSpec`: the one place
that maps a spec onto an implementation (the built-in GPT for ``arch = "gpt"``, a Hugging Face
causal LM for ``arch = "hf"``), and the loss the trainer computes with it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distronet.node.models.gpt import GPT
from distronet.node.models.hf import build_hf_model, causal_lm_loss
from distronet.node.models.spec import ModelSpec

__all__ = ["build_model", "model_loss"]


def build_model(spec: ModelSpec, device: torch.device) -> nn.Module:
    """The run's model with its seeded initialisation (identical on every replica), on ``device``.

    Raises ``ConfigError`` for an ``hf`` model without transformers installed or one it refuses."""
    if spec.gpt is not None:
        return GPT(spec.gpt, seed=spec.seed).to(device)
    return build_hf_model(spec, device)


def model_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean next-token loss of ``model`` on ``x`` → ``y``: its own ``loss`` method (the built-in
    GPT), else a Hugging Face causal LM's (:func:`~distronet.node.models.hf.causal_lm_loss`)."""
    own = getattr(model, "loss", None)
    if callable(own):
        out: Tensor = own(x, y)
        return out
    return causal_lm_loss(model, x, y)
