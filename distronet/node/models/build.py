"""Building the run's model from its :class:`~distronet.node.models.spec.ModelSpec`: the one place
that maps a spec onto an implementation (today the built-in GPT)."""

from __future__ import annotations

import torch

from distronet.node.models.gpt import GPT
from distronet.node.models.spec import ModelSpec

__all__ = ["build_model"]


def build_model(spec: ModelSpec, device: torch.device) -> GPT:
    """The run's model with its seeded initialisation (identical on every replica), on ``device``."""
    return GPT(spec.gpt, seed=spec.seed).to(device)
