"""Per-thread scratch buffers for the kernels' large temporaries.

On CPU, torch takes every large tensor fresh from the OS (mmap) and gives it back on free, so
each 64 MiB temporary costs its page faults again on every call: more than the arithmetic for a
memory-bound transform. Kernels therefore keep their temporaries (never their results) in
buffers that live per thread and grow to the largest size asked for. A kernel finishes with a
scratch buffer before it returns, so results never alias one. Memory held: at most a few times
the largest tensor a thread has transformed; :func:`release` frees it.
"""

from __future__ import annotations

import math
import threading

import torch

__all__ = ["MIN_SCRATCH_NUMEL", "release", "scratch"]

MIN_SCRATCH_NUMEL = 1 << 16
"""Temporaries smaller than this are allocated normally (cheap, and not worth holding)."""

_local = threading.local()


def scratch(slot: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``shape`` backed by this thread's buffer ``slot``.

    Valid until the next call with the same ``(slot, dtype, device)`` on this thread.
    """
    n = math.prod(shape)
    if n < MIN_SCRATCH_NUMEL:
        return torch.empty(shape, dtype=dtype, device=device)
    bufs: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = _local.__dict__.setdefault("bufs", {})
    key = (slot, dtype, device)
    buf = bufs.get(key)
    if buf is None or buf.numel() < n:
        bufs.pop(key, None)  # free the old one before growing
        buf = bufs[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(shape)


def release() -> None:
    """Free this thread's scratch buffers."""
    _local.__dict__.pop("bufs", None)
