"""``[model] arch = "hf"``: Hugging Face causal LMs built from a config (spec, build, roles, replicas)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from distronet.coordinator.config import load_run_file
from distronet.coordinator.errors import RunConfigError
from distronet.node.bench.swarm_sim import param_digest, run_swarm
from distronet.node.daemon.trainer import Trainer
from distronet.node.models.build import build_model, model_loss
from distronet.node.models.spec import ModelSpec, check_hf_config
from distronet.node.optim.config import preset
from distronet.node.optim.roles import Role, tensor_roles
from distronet.protocol.errors import ConfigError

pytest.importorskip("transformers")

CPU = torch.device("cpu")
_SHAPE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 64, "vocab_size": 300, "max_position_embeddings": 64}  # fmt: skip
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_SHAPE, "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", **_SHAPE, "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", **_SHAPE, "head_dim": 8, "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", **_SHAPE, "sliding_window": None, "tie_word_embeddings": False},
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 300,
        "n_positions": 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}


def _spec(name: str = "llama", seed: int = 0, seq_len: int = 16, **hf: Any) -> ModelSpec:
    return ModelSpec.from_run(
        {"arch": "hf", "seed": seed, "batch": 4, "seq_len": seq_len, "hf": {**CONFIGS[name], **hf}}
    )


def _bytes_batch(step: int, batch: int = 4, seq_len: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)  # the same windows every step: the loss must fall on them
    text = rng.integers(0, 256, size=(batch, seq_len + 1), dtype=np.int64)
    text[:, 1::2] = (text[:, 0::2][:, : text[:, 1::2].shape[1]] + 1) % 256  # learnable: odd = even + 1
    return text[:, :-1], text[:, 1:]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_each_model_type_builds_and_its_loss_falls_through_the_trainer(name: str) -> None:
    spec = _spec(name)
    model = build_model(spec, CPU)
    assert model.training and all(p.dtype == torch.float32 for p in model.parameters())
    assert model.config._attn_implementation == "eager" and model.config.use_cache is False
    drops = {k: v for k, v in model.config.to_dict().items() if k.endswith(("dropout", "pdrop"))}
    assert all(v == 0.0 for v in drops.values()), drops
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, _bytes_batch, CPU)
    losses = [trainer.step(s).loss for s in range(6)]
    assert all(math.isfinite(v) for v in losses)
    assert math.log(spec.vocab) - 1.0 < losses[0] < math.log(spec.vocab) + 1.0  # a fresh model: ~uniform
    assert losses[-1] < 0.9 * losses[0], losses


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_same_seed_bit_identical_whatever_the_rng_state_and_another_seed_differs() -> None:
    torch.manual_seed(1)
    a = build_model(_spec(seed=7), CPU)
    torch.manual_seed(999)
    torch.rand(1000)  # the caller's RNG state must not matter
    state = torch.random.get_rng_state()
    b = build_model(_spec(seed=7), CPU)
    assert torch.equal(torch.random.get_rng_state(), state)  # and the build leaves it untouched
    c = build_model(_spec(seed=8), CPU)
    pa, pb, pc = _params(a), _params(b), _params(c)
    assert list(pa) == list(pb) and all(torch.equal(pa[n], pb[n]) for n in pa)
    assert param_digest(a) == param_digest(b) != param_digest(c)
    matrices = [n for n in pa if pa[n].dim() == 2]
    assert matrices and all(not torch.equal(pa[n], pc[n]) for n in matrices)
    norms = [n for n in pa if n.endswith("norm.weight")]
    assert norms and all(torch.equal(pa[n], torch.ones_like(pa[n])) for n in norms)
    emb = pa["model.embed_tokens.weight"]
    assert abs(float(emb.std()) - 0.02) < 0.004  # initializer_range


def test_tied_head_is_the_embedding_once() -> None:
    model = build_model(_spec("qwen2"), CPU)
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def _run_file(folder: Path, model: str) -> Path:
    shards = [{"id": "a", "path": "a.bin", "sha256": "0" * 64, "tokens": 10, "bytes": 10}]
    doc = {"version": 1, "tokenizer": "byte", "dtype": "uint16", "shards": shards}
    (folder / "m.json").write_text(json.dumps(doc))
    path = folder / f"run{len(list(folder.glob('run*.toml')))}.toml"
    path.write_text(f'id = "r1"\n[data]\nmanifest = "m.json"\n[model]\n{model}\n')
    return path


def _refused(hf: Any, match: str, **model: Any) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelSpec.from_run({"arch": "hf", "seq_len": 16, "hf": hf, **model})


def test_spec_refuses_bad_configs_naming_the_problem() -> None:
    good = CONFIGS["llama"]
    _refused({**good, "model_type": "bert"}, "model_type must be one of llama, qwen2, qwen3, mistral, gpt2")
    _refused({**good, "rope_scaling": {"a": {"b": {"c": 1}}}}, "nested deeper than 3 levels")
    _refused({**good, "junk": object()}, r"model\.hf\.junk: object is not a JSON value")
    _refused({**good, "junk": float("nan")}, "must be a finite number")
    _refused({**good, "junk": "x" * 1000}, "string longer than")
    _refused({**good, "junk": list(range(600))}, "more than 512 keys and items")
    _refused({**good, "auto_map": {"AutoModel": "x.Y"}}, "auto_map are not allowed")
    _refused({**good, "attention_dropout": 0.1}, "attention_dropout must be 0")
    _refused({k: v for k, v in good.items() if k != "vocab_size"}, "vocab_size must be a positive integer")
    _refused(good, r"seq_len <= context \(64\)", seq_len=65)
    _refused({**CONFIGS["gpt2"], "n_positions": 8}, r"seq_len <= context \(8\)")
    _refused(good, "unknown key.*depth.*\\[model.hf\\]", depth=4)
    _refused("config.json", "is a path, but the run came without its files")
    with pytest.raises(ConfigError, match="arch must be 'gpt' or 'hf'"):
        ModelSpec.from_run({"arch": "rwkv"})
    assert check_hf_config(good) == good and check_hf_config(good) is not good


def test_spec_is_derived_from_the_config_and_batch_fits_the_positions() -> None:
    spec = _spec("gpt2", seq_len=64)
    assert (spec.arch, spec.vocab, spec.context, spec.seq_len, spec.gpt) == ("hf", 300, 64, 64, None)
    assert spec.hf_config()["model_type"] == "gpt2"
    assert ModelSpec.from_run({"arch": "gpt", "depth": 2}).arch == "gpt"


def test_config_path_is_read_inside_the_run_folder_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "models").mkdir(parents=True)
    (run / "models" / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    (tmp_path / "outside.json").write_text(json.dumps(CONFIGS["llama"]))
    (run / "link.json").symlink_to(tmp_path / "outside.json")
    spec = ModelSpec.from_run({"arch": "hf", "seq_len": 16, "hf": "models/config.json"}, run_dir=run)
    assert spec.hf_config() == CONFIGS["llama"]
    for rel, match in [("../outside.json", "without '..'"), (str(tmp_path / "outside.json"), "without '..'"),
                       ("link.json", "leads outside"), ("missing.json", "cannot read")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            ModelSpec.from_run({"arch": "hf", "seq_len": 16, "hf": rel}, run_dir=run)
    # the coordinator inlines the path when it loads the run file, with the same rules
    raw, _ = load_run_file(_run_file(run, 'arch = "hf"\nseq_len = 16\nhf = "models/config.json"'))
    assert raw["model"]["hf"] == CONFIGS["llama"]
    assert ModelSpec.from_run(raw["model"]).hf_config() == CONFIGS["llama"]
    for rel, match in [("../outside.json", "without '..'"), ("link.json", "leads outside")]:
        with pytest.raises(RunConfigError, match=match):
            load_run_file(_run_file(run, f'arch = "hf"\nhf = "{rel}"'))


def test_inline_table_in_a_run_file_reaches_the_node_as_is(tmp_path: Path) -> None:
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in CONFIGS["llama"].items())
    raw, _ = load_run_file(_run_file(tmp_path, f'arch = "hf"\nseq_len = 16\n[model.hf]\n{body}'))
    assert ModelSpec.from_run(raw["model"]).hf_config() == CONFIGS["llama"]


def test_without_transformers_the_build_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec()
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(ConfigError, match=r"needs transformers.*pip install 'distro-node\[hf\]'"):
        build_model(spec, CPU)


def test_roles_of_the_llama_model() -> None:
    roles = tensor_roles(build_model(_spec("llama"), CPU))
    assert roles["model.embed_tokens.weight"] is Role.EMBEDDING
    assert roles["lm_head.weight"] is Role.HEAD
    vectors = {n for n, r in roles.items() if r is Role.VECTOR}
    assert vectors == {n for n in roles if n.endswith("norm.weight")} and len(vectors) == 5
    hidden = {n for n, r in roles.items() if r is Role.HIDDEN}
    assert hidden == {n for n in roles if n.endswith("_proj.weight")} and len(hidden) == 14


@pytest.mark.parametrize("rule", ["sign", "ortho"])
def test_two_replicas_train_a_llama_and_stay_bit_identical(rule: str) -> None:
    spec = _spec("llama", seed=3)

    def batches(peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = _bytes_batch(step)
        return torch.from_numpy(x), torch.from_numpy(y)

    cfg = preset("ours_k4_1bit", lr=3e-3, warmup_steps=0, update=rule)
    res = run_swarm(lambda: build_model(spec, CPU), batches, cfg, 2, 10, share_rounds=False)
    assert param_digest(res.models[0]) == param_digest(res.models[1])
    assert param_digest(res.models[0]) != param_digest(build_model(spec, CPU))  # it did train
    assert all(len(r.accepted) == 2 for opt in res.optimizers for r in opt.reports)
    assert res.mean_loss(9) < res.mean_loss(0)
    x, y = batches(0, 0)
    assert torch.equal(model_loss(res.models[0], x, y), model_loss(res.models[1], x, y))


@pytest.mark.asyncio
async def test_build_training_builds_an_hf_run_and_resumes_its_checkpoint(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from distronet.node.backends import TorchBackend
    from distronet.node.config import NodeConfig
    from distronet.node.daemon.training import build_training, save
    from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig
    from distronet.node.swarm.budget import Bandwidth
    from distronet.protocol.identity import Identity

    cfg = NodeConfig(run_id="r", coordinator="http://127.0.0.1:1", data_dir=str(tmp_path))
    identity = Identity.generate()
    swarm = SimpleNamespace(bandwidth=Bandwidth.from_rates("unlimited", "unlimited"), puller=None,
                            identity=identity, run_id="r")  # fmt: skip
    core = AsyncSwarmExchange(swarm, ExchangeConfig(), None)  # type: ignore[arg-type]
    spec, backend = _spec("llama", seed=5), TorchBackend(CPU)
    dcfg = preset("ours_k4_1bit", update="ortho")
    training = build_training(cfg, spec, dcfg, backend, core, identity)
    model = training.trainer.model
    assert type(model).__name__ == "LlamaForCausalLM"
    assert param_digest(model) == param_digest(build_model(spec, CPU))
    x, y = (torch.from_numpy(a) for a in _bytes_batch(0))
    loss = backend.loss(model, x, y)
    loss.backward()
    assert math.isfinite(float(loss.detach())) and all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)  # a state unlike a fresh build's
    save(training, "r")
    again = build_training(cfg, spec, dcfg, backend, core, identity)
    assert param_digest(again.trainer.model) == param_digest(model) != param_digest(build_model(spec, CPU))
