"""The MLX backend against torch: the same parameters, loss and gradients; the typed errors.

Real MLX (the ``mlx[cpu]`` wheel on Linux). Tests that need it skip locally when it is absent and
fail under CI (``CI`` set), where ``.ci/run`` installs the ``[mlx]`` extra.

Tolerance (float32 on both sides, same parameters and batch): loss within 1e-5, and every
gradient tensor within 1e-4 of its own largest entry (measured: ~1e-6 relative on the CPU).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from distronet.node.backends import mlx_import_error, pick_backend
from distronet.node.config import DEVICES
from distronet.node.daemon.trainer import Trainer, param_digest
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.protocol.errors import ConfigError

CONFIGS = {
    "bias": GPTConfig(depth=2, width=64, heads=4, context=32),  # the default model's features, smaller
    "tied-nobias": GPTConfig(depth=2, width=32, heads=2, context=16, vocab=40, bias=False, tie_weights=True),
}
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def mlx_backend(require_mlx: None) -> Any:
    """A fresh ``MLXBackend``; skips (locally) or fails (under CI) when MLX does not import."""
    return pick_backend("mlx")


def _batch(cfg: GPTConfig, seed: int, b: int = 8, t: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab, (b, t), generator=g), torch.randint(0, cfg.vocab, (b, t), generator=g)


def _torch_loss_and_grads(
    model: GPT, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mlx_gpt_has_the_torch_parameter_names_and_shapes(name: str, mlx_backend: Any) -> None:
    from distronet.node.models.gpt_mlx import GPTMLX, flatten

    cfg = CONFIGS[name]
    twin, model = GPTMLX(cfg), GPT(cfg)
    assert twin.parameter_names() == sorted(n for n, _ in model.named_parameters())
    shapes = {n: tuple(a.shape) for n, a in flatten(twin.parameters()).items()}
    assert shapes == {n: tuple(p.shape) for n, p in model.named_parameters()}
    with pytest.raises(ConfigError, match="does not match"):
        twin.load_torch([("wte.weight", np.zeros((cfg.vocab, cfg.width), np.float32))])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mlx_loss_and_gradients_match_torch(name: str, mlx_backend: Any) -> None:
    cfg = CONFIGS[name]
    model = GPT(cfg, seed=3)
    x, y = _batch(cfg, seed=1)
    want_loss, want = _torch_loss_and_grads(model, x, y)
    before = param_digest(model)

    loss = mlx_backend.loss(model, x, y)
    loss.backward()

    assert param_digest(model) == before  # the backend reads the parameters, never writes them
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert abs(float(loss.detach()) - want_loss) <= LOSS_TOL
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32, n
        err = (p.grad - want[n]).abs().max().item()
        assert err <= GRAD_TOL * want[n].abs().max().item() + 1e-7, (n, err)
    # the gradient is not a lucky constant: another batch gives another loss and gradient
    other_loss, other = _torch_loss_and_grads(model, *_batch(cfg, seed=2))
    assert abs(other_loss - want_loss) > 10 * LOSS_TOL
    assert not torch.allclose(other["wte.weight"], want["wte.weight"])


def test_mlx_trainer_steps_like_torch_in_worker_threads(mlx_backend: Any) -> None:
    """A ``Trainer`` on the MLX backend, one step per fresh thread (as the daemon runs steps),
    beside one on torch (in this thread: torch's pool is slow to start in fresh threads here)."""
    cfg = CONFIGS["tied-nobias"]
    batches = {s: tuple(a.numpy() for a in _batch(cfg, seed=10 + s)) for s in range(3)}
    models = [GPT(cfg, seed=5), GPT(cfg, seed=5)]
    trainers = [
        Trainer(m, torch.optim.SGD(m.parameters(), lr=0.5), batches.__getitem__, backend)
        for m, backend in zip(models, [mlx_backend, torch.device("cpu")], strict=True)
    ]
    assert trainers[0].device == torch.device("cpu") and trainers[1].backend.name == "cpu"
    for step in range(3):
        out: list[Any] = []
        worker = threading.Thread(target=lambda s=step, o=out: o.append(trainers[0].step(s)))
        worker.start()
        worker.join()
        assert len(out) == 1 and abs(out[0].loss - trainers[1].step(step).loss) <= LOSS_TOL
    assert mlx_backend.steps == 3
    start = GPT(cfg, seed=5)
    for (n, a), b, a0 in zip(
        models[0].named_parameters(), models[1].parameters(), start.parameters(), strict=True
    ):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), n
        assert not torch.equal(a, a0), n  # it did train


def test_mlx_refuses_what_it_cannot_run(mlx_backend: Any) -> None:
    with pytest.raises(ConfigError, match="trains the built-in GPT and Llamas, not Linear"):
        mlx_backend.loss(
            nn.Linear(4, 4), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)
        )
    cfg = CONFIGS["tied-nobias"]
    x, y = _batch(cfg, seed=0, t=cfg.context + 1)
    with pytest.raises(ConfigError, match="longer than the model's context"):
        mlx_backend.loss(GPT(cfg), x, y)
    wide = GPT(cfg).to(torch.float64)
    with pytest.raises(ConfigError, match="float32"):
        mlx_backend.loss(wide, *_batch(cfg, seed=0))


def test_device_mlx_without_mlx_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the import is faked away: ``None`` in ``sys.modules`` makes ``import mlx.core`` fail."""
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    assert mlx_import_error() is not None
    with pytest.raises(ConfigError, match=r"--device mlx: MLX is not installed.*distro-node\[mlx\]"):
        pick_backend("mlx")
    assert pick_backend("auto").name != "mlx"  # auto falls back instead of failing
    assert pick_backend("cpu").device == torch.device("cpu")


def test_device_names() -> None:
    assert "mlx" in DEVICES
    with pytest.raises(ConfigError, match="unknown device"):
        pick_backend("tpu")
    if sys.platform != "darwin":  # auto never picks MLX off macOS, installed or not
        assert pick_backend("auto").name in ("cuda", "cpu")
