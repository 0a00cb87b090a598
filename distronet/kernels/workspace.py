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

__all__ = ["MIN_SCRATCH_NUMEL", "ZeroBuffer", "release", "scratch", "zero_buffer"]

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
    """Free this thread's scratch buffers (zero buffers included)."""
    _local.__dict__.pop("bufs", None)
    _local.__dict__.pop("zero", None)


class ZeroBuffer:
    """This thread's buffer for ``(dtype, device)`` that is all zeros between uses (:func:`zero_buffer`).

    ``tensor`` is the first ``numel`` elements, zero on hand-out. The user adds into a few
    positions and, once done, writes zeros back at exactly those and calls :meth:`clean`; until
    then the buffer counts as dirty, and the next hand-out zeroes it whole (so an exception on
    the way costs a full zeroing, never a wrong result)."""

    def __init__(self, tensor: torch.Tensor, key: tuple[torch.dtype, torch.device]) -> None:
        self.tensor, self._key = tensor, key

    def clean(self) -> None:
        """Every position the user wrote is zero again."""
        state = _local.__dict__.get("zero", {}).get(self._key)
        if state is not None and state[0].data_ptr() == self.tensor.data_ptr():
            state[1] = True


def zero_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> ZeroBuffer:
    """A ZeroBuffer of ``numel`` elements: zeroed here only when it was grown, or not given back
    clean. For a sparse sum into a large buffer (a round's decode: ~3 % of the coefficients
    written), writing the few positions back to zero costs far less than zeroing it whole
    (21 MB for the Llama set: ~1.6 ms inside a training step, machine D)."""
    bufs: dict[tuple[torch.dtype, torch.device], list] = _local.__dict__.setdefault("zero", {})  # type: ignore[type-arg]
    key = (dtype, device)
    state = bufs.get(key)
    if state is None or state[0].numel() < numel:
        bufs.pop(key, None)  # free the old one before growing
        state = bufs[key] = [torch.zeros(numel, dtype=dtype, device=device), True]
    if not state[1]:
        state[0].zero_()
    state[1] = False  # dirty until the user gives it back clean
    return ZeroBuffer(state[0][:numel], key)
