"""Compute backends: what computes a step's loss and gradients on this machine (``--device``).

::

    ComputeBackend              the interface the trainer calls: loss(model, x, y) -> Tensor
    ├── TorchBackend(device)    torch on CUDA, MPS or CPU: the model's own forward and backward
    └── MLXBackend()            Apple's MLX (Apple GPU; CPU on Linux via ``mlx[cpu]``): forward and
                                backward of an MLX port of the GPT, gradients handed back to torch

Whatever the backend, the parameters, the DisTrO optimizer, the codec and the applied update stay
torch tensors on ``backend.device``: a backend only fills each parameter's ``.grad``. So replicas
stay bit-identical whichever device computed each peer's gradient, and packets are the same bytes.

``pick_backend(name)`` maps ``--device`` onto a backend. ``auto`` takes CUDA, then MPS, then MLX
(only on macOS, only when torch sees neither accelerator and ``mlx`` imports: e.g. a torch build
without MPS), then the CPU. On Linux ``auto`` never picks MLX: MLX's CPU backend is there for
tests and parity, not speed. Raises ``ConfigError`` for a device that is absent.
"""

from __future__ import annotations

import sys

import torch

from distronet.node.backends.base import ComputeBackend, TorchBackend
from distronet.protocol.errors import ConfigError

__all__ = ["ComputeBackend", "TorchBackend", "mlx_import_error", "pick_backend"]

MLX_HINT = "install it with: pip install 'distro-node[mlx]' (mlx on macOS, mlx[cpu] on Linux)"


def mlx_import_error() -> str | None:
    """``None`` when ``mlx.core`` imports, else why it does not (the import's own message)."""
    try:
        import mlx.core  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: the wheel is there but its native library is not
        return f"{type(e).__name__}: {e}"
    return None


def pick_backend(name: str, precision: str = "auto") -> ComputeBackend:
    """The backend for ``--device name`` (module docstring), computing in ``precision`` where it
    is torch's (``base.resolve_precision``: bf16 autocast on CUDA, fp32 elsewhere; MLX: fp32).
    Raises ``ConfigError`` if the device is absent or the precision is not for it."""
    if name == "auto":
        if torch.cuda.is_available():
            return TorchBackend(torch.device("cuda"), precision)
        if torch.backends.mps.is_available():
            return TorchBackend(torch.device("mps"), precision)
        if sys.platform == "darwin" and mlx_import_error() is None:
            return _mlx_backend()
        return TorchBackend(torch.device("cpu"), precision)
    if name == "mlx":
        if precision == "bf16":
            raise ConfigError("--device mlx trains in fp32: precision bf16 is for CUDA devices")
        why = mlx_import_error()
        if why is not None:
            raise ConfigError(f"--device mlx: MLX is not installed here ({why}); {MLX_HINT}")
        return _mlx_backend()
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("--device mps: MPS is not available on this machine")
    if name not in ("cuda", "mps", "cpu"):
        raise ConfigError(f"unknown device {name!r}: use auto, cuda, mps, mlx or cpu")
    return TorchBackend(torch.device(name), precision)


def _mlx_backend() -> ComputeBackend:
    from distronet.node.backends.mlx_backend import MLXBackend  # imports mlx: only once it is known to load

    return MLXBackend()
