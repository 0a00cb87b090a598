"""``models.fit``: the parameter shapes it reads off a config are the built model's; the verdict."""

from __future__ import annotations

import math

import pytest
import torch

from distronet.node.bench.converge_llama import LlamaShape
from distronet.node.models import fit
from distronet.node.models.build import build_model
from distronet.node.models.spec import ModelSpec
from distronet.protocol.errors import ConfigError

_BASE = {"vocab_size": 300, "max_position_embeddings": 64, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip

SPECS = {
    "gpt": {"arch": "gpt", "seq_len": 32},
    "gpt-tied-nobias": {"arch": "gpt", "seq_len": 32, "tie_weights": True, "bias": False, "width": 96},
    "llama": {"arch": "hf", "hf": {**_BASE, "model_type": "llama"}, "seq_len": 32},
    "llama-bench": {"arch": "hf", "hf": LlamaShape().hf_config(), "seq_len": 32},
    "llama-bias-tied": {"arch": "hf", "seq_len": 32, "hf": {**_BASE, "model_type": "llama",
                        "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}},
    "mistral": {"arch": "hf", "hf": {**_BASE, "model_type": "mistral"}, "seq_len": 32},
    "qwen2": {"arch": "hf", "hf": {**_BASE, "model_type": "qwen2"}, "seq_len": 32},
    "qwen3": {"arch": "hf", "hf": {**_BASE, "model_type": "qwen3", "head_dim": 32}, "seq_len": 32},
    "gpt2": {"arch": "hf", "seq_len": 32, "hf": {"model_type": "gpt2", "vocab_size": 300, "n_positions": 64,
             "n_embd": 64, "n_layer": 2, "n_head": 4}},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SPECS))
def test_param_shapes_are_the_built_models(name: str) -> None:
    pytest.importorskip("transformers")
    spec = ModelSpec.from_run(SPECS[name])
    model = build_model(spec, torch.device("cpu"))
    built = sorted(tuple(p.shape) for p in model.parameters())
    assert sorted(fit.param_shapes(spec)) == built
    est = fit.estimate(spec)
    assert est.n_parameters == sum(math.prod(s) for s in built)
    assert est.parameters == est.gradients == 4 * est.n_parameters


def test_estimate_grows_with_the_pass_and_checkpointing_cuts_it() -> None:
    spec = ModelSpec.from_run({"arch": "hf", "hf": LlamaShape().hf_config(), "seq_len": 128, "batch": 32})
    small, big = fit.estimate(spec, micro_batch=4), fit.estimate(spec, micro_batch=32)
    assert big.activations > 7 * small.activations  # linear in the pass, plus the fixed parts
    assert big.micro_batch == 32 and small.micro_batch == 4
    ckpt = fit.estimate(spec, micro_batch=32, checkpointing=True)
    assert ckpt.checkpointing and ckpt.activations < big.activations / 2
    peak = max(big.activations + big.allocator, big.codec)
    assert big.total == big.parameters + big.gradients + big.optimizer + peak + big.runtime


def test_check_fit_names_the_largest_micro_batch_that_fits() -> None:
    spec = ModelSpec.from_run({"arch": "gpt", "seq_len": 128, "batch": 64})
    need = fit.estimate(spec).total
    ok = fit.check_fit(spec, fit.UsableMemory(need, "test"))
    assert ok.fits
    verdict = fit.check_fit(spec, fit.UsableMemory(need // 2, "test"))
    assert not verdict.fits
    mb = verdict.largest_micro_batch
    assert 1 <= mb < 64
    assert (
        fit.estimate(spec, micro_batch=mb).total <= need // 2 < fit.estimate(spec, micro_batch=mb + 1).total
    )
    msg = verdict.message()
    assert f"--micro-batch {mb}" in msg and "test" in msg and "--no-fit-check" in msg
    room = fit.UsableMemory(fit.estimate(spec, checkpointing=True).total, "test")
    with_ckpt = fit.check_fit(spec, room)
    assert not with_ckpt.fits and with_ckpt.fits_with_checkpointing
    assert "--activation-checkpointing" in with_ckpt.message()
    none = fit.check_fit(spec, fit.UsableMemory(1000, "test"))
    assert none.largest_micro_batch == 0 and "--micro-batch" not in none.message()


def test_usable_memory_cap_and_sizes() -> None:
    host = fit.usable_memory("cpu")
    assert host.bytes > 0
    capped = fit.usable_memory("cpu", cap_bytes=1000)
    assert capped.bytes == 1000 and "--memory-cap" in capped.source
    assert fit.parse_size("512MiB") == 512 * 2**20 and fit.parse_size("1.5GB") == 1_500_000_000
    for bad in ("", "12XB", "-1GB", "GB"):
        with pytest.raises(ConfigError):
            fit.parse_size(bad)
    with pytest.raises(ConfigError):
        fit.usable_memory("cpu", cap_bytes=-1)


def test_heap_share_follows_passes_checkpointing_and_device() -> None:
    spec = ModelSpec.from_run({"arch": "gpt", "seq_len": 128, "batch": 64})
    one = fit.estimate(spec)
    assert one.allocator == int(fit.HEAP_RETENTION * one.activations)
    two = fit.estimate(spec, micro_batch=32)  # two passes a step
    assert two.allocator == int(fit.HEAP_RETENTION_PASSES * two.activations)
    ckpt = fit.estimate(spec, checkpointing=True)  # no tensor of 32 MiB here: all heap-resident
    assert ckpt.allocator == int(fit.HEAP_RETENTION_CHECKPOINTED * one.activations)
    cuda = fit.estimate(spec, device="cuda", precision="bf16")
    assert cuda.allocator == 0 and cuda.activations < one.activations


def test_checkpointed_heap_share_leaves_out_tensors_glibc_mmaps() -> None:
    # the bench Llama at 32 x 128 tokens: its vocabulary-wide tensors are 64 MiB (mmapped, never
    # retained), its blocks' tensors all under 32 MiB; at 8 windows every tensor is heap-sized
    spec = ModelSpec.from_run({"arch": "hf", "hf": LlamaShape().hf_config(), "seq_len": 128, "batch": 32})
    vocab = fit.model_shape(spec).vocab
    for rows, mmapped in ((32, 3 * vocab), (8, 0)):
        full = fit.estimate(spec, micro_batch=rows, checkpointing=False)
        ckpt = fit.estimate(spec, micro_batch=rows, checkpointing=True)
        churn = full.activations - 4 * rows * 128 * mmapped
        assert abs(ckpt.allocator - fit.HEAP_RETENTION_CHECKPOINTED * churn) <= 1
        # the start of backward (head, its gradients) is the checkpointed peak here, not a block
        assert ckpt.activations < full.activations / 2
