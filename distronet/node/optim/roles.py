"""Tensor roles: what each parameter *is* in the model, found from its structure, never its name.

The optimizer treats tensors by role (``DistroOptimizer``: the ``ORTHO`` rule orthogonalises
``HIDDEN`` matrices only, every other role takes ``update.fallback``). :func:`tensor_roles` decides
each parameter's role from module types, shapes and tying, in this order (the first that holds):

1. ``EMBEDDING``: the ``weight`` of an ``nn.Embedding`` (or ``nn.EmbeddingBag``) module, and any
   module's parameter that is the same ``Parameter`` object (a tied output head: ``named_parameters``
   yields a tied tensor once, under its first name, and it keeps the embedding's role).
2. ``HEAD``: the output projection's ``weight``, found as
   a. a model with ``get_output_embeddings()`` (Hugging Face ``PreTrainedModel``): the module it
      returns (``None``: the model has no head; ``NotImplementedError``: as if it had no such method);
   b. otherwise: the vocabulary ``V`` is the ``num_embeddings`` of the input embedding (
      ``get_input_embeddings()`` where the model has it, else the first ``nn.Embedding`` in
      ``named_modules()`` order — the token embedding comes first in GPT-2/nanoGPT/Llama layouts),
      and the head is the *last* ``nn.Linear`` in ``named_modules()`` order whose ``out_features``
      is ``V`` (the last, so a hidden projection that happens to be ``V`` wide is not taken for
      it). No embedding, or no such ``Linear``: no head.
3. ``VECTOR``: rank != 2 (norm weights, biases, a head's bias, and any rank-0/3/4 tensor).
4. ``HIDDEN``: every other rank-2 matrix (attention, MLP, any bare 2-D ``Parameter``).

Every replica of a run builds the same model from the run's spec, so every replica gets the same
roles. The MLX node needs nothing of its own: its backend computes gradients only, for the torch
model whose ``DistroOptimizer`` (built in ``daemon/training.py`` with these roles) applies the
update, the same code path as a torch node's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

from torch import nn

__all__ = ["Role", "tensor_roles"]


class Role(str, enum.Enum):
    """A parameter's role in the model (module docstring)."""

    EMBEDDING = "embedding"
    HEAD = "head"
    VECTOR = "vector"
    HIDDEN = "hidden"


def tensor_roles(model: nn.Module) -> dict[str, Role]:
    """Each parameter's role, keyed by the names ``model.named_parameters()`` gives, in its order."""
    embeddings = list(_embeddings(model))
    embedded = {id(m.weight) for m in embeddings}
    head = _head(model, embeddings)
    head_id = id(head.weight) if head is not None else None
    roles: dict[str, Role] = {}
    for name, p in model.named_parameters():
        if id(p) in embedded:
            roles[name] = Role.EMBEDDING
        elif id(p) == head_id:
            roles[name] = Role.HEAD
        elif p.dim() != 2:
            roles[name] = Role.VECTOR
        else:
            roles[name] = Role.HIDDEN
    return roles


def _embeddings(model: nn.Module) -> Iterator[nn.Embedding | nn.EmbeddingBag]:
    for m in model.modules():
        if isinstance(m, nn.Embedding | nn.EmbeddingBag):
            yield m


def _hf_module(model: nn.Module, method: str) -> tuple[bool, nn.Module | None]:
    """``(True, model.method())`` when the model has that accessor (Hugging Face), else ``(False, None)``."""
    fn = getattr(model, method, None)
    if not callable(fn):
        return False, None
    try:
        out = fn()
    except NotImplementedError:
        return False, None
    return True, out if isinstance(out, nn.Module) else None


def _head(model: nn.Module, embeddings: list[nn.Embedding | nn.EmbeddingBag]) -> nn.Module | None:
    """The output projection (rule 2 of the module docstring), or None; only one with a
    ``weight`` Parameter counts."""
    has, out = _hf_module(model, "get_output_embeddings")
    if has:
        return out if out is not None and isinstance(getattr(out, "weight", None), nn.Parameter) else None
    has, inp = _hf_module(model, "get_input_embeddings")
    vocab_src = inp if has else (embeddings[0] if embeddings else None)
    vocab = getattr(vocab_src, "num_embeddings", None)
    if not isinstance(vocab, int):
        return None
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == vocab]
    return linears[-1] if linears else None
