"""The single-node training loop: batch → forward/backward → optimizer step. It knows no peers.

The trainer owns a model, an optimizer and a batch source. ``step()`` runs one training step and
returns what happened; the optimizer it is given decides what a step means (``DistroOptimizer``
publishes and collects through its exchange inside ``step()``). It is synchronous and meant to
run in a worker thread, off the daemon's event loop. The loss and gradients come from a compute
backend (``distronet.node.backends``: torch on CUDA, MPS or CPU, or MLX); the rest is torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch
from blake3 import blake3
from torch import nn

from distronet.node.backends import ComputeBackend, TorchBackend, pick_backend
from distronet.node.models.spec import ModelSpec

__all__ = [
    "ModelSpec",
    "StepResult",
    "Trainer",
    "param_digest",
    "pick_device",
    "replica_digest",
    "tensors_digest",
]

BatchSource = Callable[[int], tuple[np.ndarray, np.ndarray]]
"""``batches(step) -> (x, y)``, each ``(batch, seq_len)`` int64."""


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One finished step: its index, training loss, wall-clock split in seconds, and the CPU
    seconds the step's own thread spent (``cpu_s``: batch, loss, gradients and optimizer;
    ``optimizer_cpu_s``: the optimizer's part, encode + decode + apply)."""

    step: int
    loss: float
    compute_s: float
    exchange_s: float
    cpu_s: float = 0.0
    optimizer_cpu_s: float = 0.0


def pick_device(name: str) -> torch.device:
    """Where the model's torch parameters live for ``--device name`` (``mlx``: the CPU).

    Raises ``ConfigError`` for a device that is absent; see ``backends.pick_backend``.
    """
    return pick_backend(name).device


def param_digest(model: nn.Module) -> str:
    """BLAKE3 over every parameter's bytes in order: equal digests = bit-identical replicas.

    Cost: one BLAKE3 pass over the parameters (~1.1 ms for the default model's 3.5 MB, one
    thread; SHA-256 took ~2.9 ms, and the daemon digests every step); a contiguous CPU
    parameter is hashed in place, without a copy."""
    return tensors_digest(p for _, p in model.named_parameters())


def tensors_digest(tensors: Iterable[torch.Tensor]) -> str:
    """BLAKE3 (32 bytes, hex) over the tensors' bytes, in order (each hashed in place when
    contiguous on CPU)."""
    h = blake3()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def replica_digest(model: nn.Module, optimizer: object) -> str:
    """The digest replicas compare: of ``optimizer.replicated_params()`` where the optimizer has
    it (a ``DistroOptimizer``: the consensus copy in overlap mode, whose parameters may carry
    this peer's own guess; the parameters otherwise, giving :func:`param_digest`'s value), else
    of the model's parameters."""
    replicated = getattr(optimizer, "replicated_params", None)
    if callable(replicated):
        return tensors_digest(replicated())
    return param_digest(model)


class Trainer:
    """Runs steps of ``model`` with ``optimizer`` on ``batches``. Not thread-safe: one caller.

    ``optimizer`` is any ``torch.optim.Optimizer``; with a ``DistroOptimizer`` the ``step`` call
    blocks on the exchange (that time is reported as ``exchange_s``). ``backend`` computes the
    loss and gradients (``backends.pick_backend``); a bare ``torch.device`` means torch on it in
    fp32 (the node's own backend takes bf16 autocast on CUDA: ``TorchBackend``).
    ``model`` must already be on ``backend.device``.

    ``micro_batch`` (0: off) splits a step's windows into forward/backward passes of at most that
    many, each pass's loss weighted by its share of the windows, so the gradients accumulated in
    ``.grad`` and the loss reported are the whole batch's mean (equal up to float rounding): a
    run's tokens per step do not depend on what one card holds.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        batches: BatchSource,
        backend: ComputeBackend | torch.device,
        micro_batch: int = 0,
    ) -> None:
        if micro_batch < 0:
            raise ValueError(f"micro_batch must be >= 0, got {micro_batch}")
        self.model, self.optimizer, self.batches = model, optimizer, batches
        self.backend = backend if isinstance(backend, ComputeBackend) else TorchBackend(backend, "fp32")
        self.device = self.backend.device
        self.micro_batch = micro_batch

    def step(self, step: int) -> StepResult:
        """Train on the batch of ``step``. Raises what the optimizer raises (e.g. ``PeerDead``)."""
        t0, c0 = time.perf_counter(), time.thread_time()
        x, y = self.batches(step)
        self.optimizer.zero_grad(set_to_none=True)
        value = self.accumulate(x, y)
        t1, c1 = time.perf_counter(), time.thread_time()
        self.optimizer.step()
        t2, c2 = time.perf_counter(), time.thread_time()
        return StepResult(step, value, t1 - t0, t2 - t1, c2 - c0, c2 - c1)

    def accumulate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Add the gradient of the mean loss on windows ``x`` → ``y`` to ``.grad``, in passes of at
        most ``micro_batch`` windows (class docstring); return that mean loss."""
        rows = int(x.shape[0])
        mb = self.micro_batch or rows
        value = 0.0
        for start in range(0, rows, mb):
            xt = torch.from_numpy(np.ascontiguousarray(x[start : start + mb])).to(self.device)
            yt = torch.from_numpy(np.ascontiguousarray(y[start : start + mb])).to(self.device)
            loss = self.backend.loss(self.model, xt, yt)
            share = xt.shape[0] / rows
            (loss * share if share != 1.0 else loss).backward()
            value += float(loss.detach()) * share
        return value

    def digest(self) -> str:
        """:func:`replica_digest` of this trainer's model and optimizer."""
        return replica_digest(self.model, self.optimizer)
