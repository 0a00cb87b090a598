"""``arch = "hf"``: a Hugging Face causal LM built from the run's config, never from the hub.

:func:`build_hf_model` turns :meth:`ModelSpec.hf_config` into a ``transformers`` config
(``AutoConfig.for_model``) and the model (``AutoModelForCausalLM.from_config``) with eager
attention (deterministic on the CPU), every dropout 0 and no KV cache. The model is returned
as is, no wrapper: its ``named_parameters()`` and ``state_dict()`` names are Hugging Face's own
(``model.layers.0.self_attn.q_proj.weight``...), and ``get_input_embeddings`` /
``get_output_embeddings`` are there for the optimizer's roles (``optim/roles.py``). The trainer
computes its loss with :func:`causal_lm_loss` (``models.build.model_loss`` picks it for any
model without a ``loss`` method).

Initialisation, identical on every replica: construction runs inside ``torch.random.fork_rng``
(so the caller's RNG stream is untouched, whatever it was), and then every parameter is drawn
again on the CPU from a generator of its own, seeded by ``(seed, parameter name)``
(:func:`reset_hf_parameters`): matrices (embeddings, projections, head) ~ N(0,
``initializer_range``), biases 0, other vectors (norm weights) 1. So the weights depend on the
seed, the names and the shapes only, not on construction order or on transformers' own init
code from one version to the next.

``transformers`` is an optional dependency (the ``hf`` extra), imported on first build; without
it the build raises ``ConfigError`` naming the extra.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distronet.node.models.spec import HF_EXTRA_HINT, ModelSpec
from distronet.protocol.errors import ConfigError

__all__ = ["build_hf_model", "causal_lm_loss", "reset_hf_parameters"]


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        why = f"arch = 'hf' needs transformers, which fails to import ({type(e).__name__}: {e})"
        raise ConfigError(f"{why}; {HF_EXTRA_HINT}") from e
    return transformers


def build_hf_model(spec: ModelSpec, device: torch.device) -> nn.Module:
    """The run's Hugging Face model (module docstring), float32, in train mode, on ``device``.

    Raises ``ConfigError`` when transformers is missing or refuses the config."""
    tf = _transformers()
    cfg = spec.hf_config()
    model_type = cfg.pop("model_type")
    for key in [k for k in cfg if k in ("dtype", "torch_dtype")]:
        del cfg[key]  # float32 only (spec checked it); set below, without version-specific keywords
    try:
        config = tf.AutoConfig.for_model(model_type, **cfg)
        for key, value in config.to_dict().items():  # gpt2's defaults are 0.1: no dropout here
            if key.endswith(("dropout", "pdrop")) and isinstance(value, float):
                setattr(config, key, 0.0)
        config.use_cache = False
        with torch.random.fork_rng(devices=[]):
            model: nn.Module = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ConfigError(f"run model.hf: transformers cannot build this {model_type!r} config: {e}") from e
    model = model.to(torch.float32)
    reset_hf_parameters(model, spec.seed, float(getattr(config, "initializer_range", 0.02)))
    model.train()
    return model.to(device)


def _param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"distronet-hf-init/{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def reset_hf_parameters(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Draw every parameter from a CPU generator seeded by ``(seed, name)`` (module docstring).

    Rank >= 2 ~ N(0, ``std``); a rank-1 ``bias`` 0; every other rank-1 or rank-0 tensor 1
    (norm weights). A tied tensor is drawn once, under the name ``named_parameters`` gives it."""
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            g = torch.Generator(device="cpu").manual_seed(_param_seed(seed, name))
            value = torch.empty(p.shape, dtype=torch.float32).normal_(0.0, std, generator=g)
        elif name.rsplit(".", 1)[-1] == "bias":
            value = torch.zeros(p.shape)
        else:
            value = torch.ones(p.shape)
        p.copy_(value.to(dtype=p.dtype, device=p.device))


def causal_lm_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy of predicting ``y`` ``(B, T)`` from ``x`` ``(B, T)`` (already shifted by
    one, as the trainer's batches are) with a Hugging Face causal LM's logits."""
    logits: Tensor = model(input_ids=x, use_cache=False).logits  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
