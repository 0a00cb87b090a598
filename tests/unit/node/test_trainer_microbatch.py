"""Micro-batches, activation checkpointing and precision: the step's loss and gradients do not
depend on how the batch is split into passes or whether activations are recomputed; the CPU
computes in fp32 whatever is asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distronet.node.backends import pick_backend
from distronet.node.backends.base import TorchBackend, resolve_precision
from distronet.node.daemon.trainer import Trainer
from distronet.node.models.build import build_model, set_checkpointing
from distronet.node.models.spec import GPTConfig, ModelSpec
from distronet.protocol.errors import ConfigError

LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 300,
         "max_position_embeddings": 64, "tie_word_embeddings": False}  # fmt: skip


def _spec(arch: str) -> ModelSpec:
    if arch == "gpt":
        table = {"depth": 2, "width": 32, "heads": 4, "context": 32, "batch": 8, "seq_len": 16}
        return ModelSpec.from_run(table)
    pytest.importorskip("transformers")
    return ModelSpec.from_run({"arch": "hf", "hf": LLAMA, "batch": 8, "seq_len": 16})


def _batch(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, size=(8, 17), dtype=np.int64)
    return tokens[:, :-1], tokens[:, 1:]


def _grads(spec: ModelSpec, micro_batch: int, checkpointing: bool = False, backend: object = None):
    model = build_model(spec, torch.device("cpu"))
    if checkpointing:
        set_checkpointing(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = _batch(spec.vocab)
    trainer = Trainer(model, opt, lambda _: (x, y), backend or torch.device("cpu"), micro_batch)  # type: ignore[arg-type]
    loss = trainer.accumulate(x, y)
    return loss, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("arch", ["gpt", "hf"])
@pytest.mark.parametrize("micro_batch", [1, 3, 8])
def test_micro_batches_give_the_whole_batch_loss_and_gradient(arch: str, micro_batch: int) -> None:
    spec = _spec(arch)
    loss0, g0 = _grads(spec, 0)
    loss, g = _grads(spec, micro_batch)
    assert abs(loss - loss0) < 1e-6
    for a, b in zip(g0, g, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch", ["gpt", "hf"])
def test_activation_checkpointing_keeps_loss_and_gradient(arch: str) -> None:
    spec = _spec(arch)
    loss0, g0 = _grads(spec, 0)
    loss, g = _grads(spec, 4, checkpointing=True)
    assert abs(loss - loss0) < 1e-6
    for a, b in zip(g0, g, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_checkpointing_recomputes_blocks_in_backward() -> None:
    """With checkpointing on, each block's forward runs twice a step (once more in backward)."""
    spec = _spec("gpt")
    model = build_model(spec, torch.device("cpu"))
    calls = [0]
    # a pre-hook: a recompute stops early, before the block's post-hooks run
    model.blocks[0].register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    x, y = (torch.from_numpy(a) for a in _batch(spec.vocab))
    model.loss(x, y).backward()
    assert calls[0] == 1
    set_checkpointing(model)
    model.loss(x, y).backward()
    assert calls[0] == 3


def test_step_runs_the_optimizer_once_over_all_passes() -> None:
    spec = _spec("gpt")
    model = build_model(spec, torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = [0]
    opt.register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    x, y = _batch(spec.vocab)
    res = Trainer(model, opt, lambda _: (x, y), torch.device("cpu"), micro_batch=3).step(0)
    assert steps[0] == 1 and np.isfinite(res.loss)


def test_cpu_stays_fp32() -> None:
    assert resolve_precision(torch.device("cpu"), "auto") == "fp32"
    assert TorchBackend(torch.device("cpu")).precision == "fp32"
    assert pick_backend("cpu").precision == "fp32"
    with pytest.raises(ConfigError, match="bf16 is for CUDA"):
        pick_backend("cpu", "bf16")
    with pytest.raises(ConfigError, match="precision must be"):
        resolve_precision(torch.device("cpu"), "fp8")
    spec = _spec("gpt")
    model = build_model(spec, torch.device("cpu"))
    x, y = (torch.from_numpy(a) for a in _batch(spec.vocab))
    loss = pick_backend("cpu").loss(model, x, y)
    loss.backward()
    assert loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in model.parameters())  # fmt: skip


def test_run_and_node_micro_batch() -> None:
    spec = ModelSpec.from_run({"batch": 8, "seq_len": 16, "micro_batch": 2, "checkpointing": True})
    assert (spec.micro_batch, spec.checkpointing) == (2, True)
    assert spec.micro_batch_for(0) == 2 and spec.micro_batch_for(4) == 4
    assert spec.pass_rows(0) == 2 and ModelSpec.from_run({"batch": 8}).pass_rows(0) == 8
    assert ModelSpec.from_run({"batch": 8, "global_batch": 32}).pass_rows(0) == 32
    with pytest.raises(ConfigError, match="micro_batch"):
        ModelSpec.from_run({"micro_batch": -1})
    with pytest.raises(ConfigError, match="checkpointing"):
        ModelSpec.from_run({"checkpointing": "yes"})
    assert GPTConfig().depth == 4


def test_mlx_micro_batches_and_refuses_checkpointing() -> None:
    pytest.importorskip("mlx.core")
    from distronet.node.backends.mlx_backend import MLXBackend

    spec = _spec("gpt")
    backend = MLXBackend()
    assert backend.checkpointing is False
    loss0, g0 = _grads(spec, 0, backend=backend)
    loss, g = _grads(spec, 3, backend=backend)
    assert abs(loss - loss0) < 1e-5
    for a, b in zip(g0, g, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
