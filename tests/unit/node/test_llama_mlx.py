"""The MLX Llama (``models/llama_mlx.py``) computes what transformers' ``LlamaForCausalLM`` does:
the same loss and gradients for the same parameters (untied and tied head), so an Apple node's
packets are those a torch node would send; configs it does not implement are refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distronet.node.models.build import build_model, model_loss
from distronet.node.models.spec import ModelSpec
from distronet.protocol.errors import ConfigError

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("require_mlx")

LLAMA: dict[str, Any] = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
                         "vocab_size": 300, "max_position_embeddings": 64, "rope_theta": 5000.0}  # fmt: skip


@pytest.mark.parametrize("tied", [False, True])
def test_loss_and_gradients_equal_transformers(tied: bool) -> None:
    from distronet.node.backends.mlx_backend import MLXBackend

    spec = ModelSpec.from_run(
        {"arch": "hf", "seq_len": 16, "seed": 2, "hf": {**LLAMA, "tie_word_embeddings": tied}}
    )
    model = build_model(spec, torch.device("cpu"))
    x = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(0))
    loss = model_loss(model, x[:, :-1], x[:, 1:])
    loss.backward()
    theirs = [p.grad for p in model.parameters()]
    value, ours = MLXBackend().loss_and_grads(model, x[:, :-1], x[:, 1:])
    assert abs(float(value) - float(loss.detach())) < 1e-5
    for (name, _), a, b in zip(model.named_parameters(), theirs, ours, strict=True):
        assert a is not None and torch.allclose(a, b, rtol=1e-4, atol=1e-6 * float(a.abs().max())), name


def test_what_it_does_not_implement_is_refused() -> None:
    from distronet.node.models.llama_mlx import LlamaShape

    for bad, why in (({"attention_bias": True}, "biases"), ({"hidden_act": "gelu"}, "silu"),
                     ({"rope_parameters": {"rope_type": "yarn"}}, "default rope"),
                     ({"model_type": "qwen2"}, "llama")):  # fmt: skip
        with pytest.raises(ConfigError, match=why):
            LlamaShape({**LLAMA, **bad})
