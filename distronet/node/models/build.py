"""Building the run's model from its :class:`~distronet.node.models.spec.ModelSpec`: the one place
that maps a spec onto an implementation (the built-in GPT for ``arch = "gpt"``, a Hugging Face
causal LM for ``arch = "hf"``), and the loss the trainer computes with it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distronet.node.models.gpt import GPT
from distronet.node.models.hf import build_hf_model, causal_lm_loss
from distronet.node.models.spec import ModelSpec
from distronet.protocol.errors import ConfigError

__all__ = ["build_model", "model_loss", "set_checkpointing"]


def build_model(spec: ModelSpec, device: torch.device) -> nn.Module:
    """The run's model with its seeded initialisation (identical on every replica), on ``device``.

    Raises ``ConfigError`` for an ``hf`` model without transformers installed or one it refuses."""
    if spec.gpt is not None:
        return GPT(spec.gpt, seed=spec.seed).to(device)
    return build_hf_model(spec, device)


def set_checkpointing(model: nn.Module, on: bool = True) -> None:
    """Turn activation checkpointing on (or off) for ``model``: the built-in GPT recomputes each
    block in the backward pass (``torch.utils.checkpoint``, non-reentrant), a Hugging Face model
    through its own ``gradient_checkpointing_enable``. The loss and gradients are unchanged; the
    activations kept fall to each block's input. Raises ``ConfigError`` for a model without it."""
    if isinstance(model, GPT):
        model.checkpointing = on
        return
    # transformers 5.x names it activation_checkpointing_* (the gradient_* names are deprecated)
    prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    enable = getattr(model, f"{prefix}_checkpointing_enable", None)
    disable = getattr(model, f"{prefix}_checkpointing_disable", None)
    supported = getattr(model, "supports_gradient_checkpointing", False)
    if not callable(enable) or not callable(disable) or not supported:
        raise ConfigError(f"activation checkpointing: {type(model).__name__} does not support it")
    if on:
        enable(**{f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}})
    else:
        disable()


def model_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean next-token loss of ``model`` on ``x`` → ``y``: its own ``loss`` method (the built-in
    GPT), else a Hugging Face causal LM's (:func:`~distronet.node.models.hf.causal_lm_loss`)."""
    own = getattr(model, "loss", None)
    if callable(own):
        out: Tensor = own(x, y)
        return out
    return causal_lm_loss(model, x, y)
