"""The kernel-only decode `bench codec` times: per-tensor ``(idx, val)`` parts to dense tensors.

:func:`decode_sum_many` is ``[decode_sum(layouts[t], parts[t]) for t]`` in one pass over
:func:`distronet.kernels.decode_plan.plan_batch`'s flat buffer: what the aggregation step adds
per peer once packets have been checked, with no payload in between (the bench's
``kernel_decode_ms`` and ``kernel_decode_16_over_1`` columns). The node itself decodes payloads
with :func:`distronet.kernels.decode.decode_flat`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distronet.kernels.dct import spread_rows, work_dtype
from distronet.kernels.decode import Part
from distronet.kernels.decode_plan import invert, plan_batch
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = ["decode_sum_many"]


def _part_numpy(lay: ChunkLayout, tid: int, part: Part) -> tuple[np.ndarray, np.ndarray]:
    """A part as CPU numpy arrays (idx int64, val float32), shapes and dtypes checked."""
    idx, val = part
    try:
        i, v = idx.numpy(), val.numpy()
    except (RuntimeError, TypeError):  # on a device, requiring grad, or bfloat16
        work_dtype(val.dtype)
        i, v = idx.detach().cpu().numpy(), val.detach().cpu().to(torch.float32).numpy()
    if i.dtype != np.int64 or i.ndim != 2 or i.shape[0] != lay.n_chunks or v.shape != i.shape:
        raise KernelError(
            f"tensor {tid}: idx must be int64 ({lay.n_chunks}, k) and val the same shape, "
            f"got {idx.dtype} {tuple(idx.shape)} and {tuple(val.shape)}"
        )
    if v.dtype != np.float32:
        work_dtype(val.dtype)
        v = v.astype(np.float32)
    return i, v


def decode_sum_many(
    layouts: Sequence[ChunkLayout],
    parts: Sequence[Sequence[Part]],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """``[decode_sum(layouts[t], parts[t]) for t]`` in one pass (one ``index_add_`` a part into one
    flat buffer, one second product per block shape).

    ``parts[t]`` are tensor ``t``'s ``(idx, val)`` parts (any number, any k; see
    :mod:`distronet.kernels.decode`). Equal to the per-tensor decode up to rounding; always
    the tensor path (never the compiled one).

    Raises:
        KernelError: ``parts`` and ``layouts`` differ in length, a part has the wrong shape or
            dtype, or an index lies outside ``[0, chunk_numel)``.
    """
    if len(parts) != len(layouts):
        raise KernelError(f"{len(parts)} part lists for {len(layouts)} layouts")
    plan = plan_batch(tuple(layouts))
    dt, dev = work_dtype(dtype), torch.device(device)
    checked: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for t, tparts in enumerate(parts):
        lay = plan.layouts[t]
        for part in tparts:
            idx, val = _part_numpy(lay, t, part)
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= lay.chunk_numel):
                bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
                raise KernelError(f"an index ({bad}) is outside [0, {lay.chunk_numel})")
            checked.append((t, torch.from_numpy(idx).to(dev), torch.from_numpy(val).to(device=dev, dtype=dt)))
    with torch.no_grad():
        z = scratch(1, (plan.size,), dt, dev).zero_()
        for t, idx_t, val_t in checked:
            lay = plan.layouts[t]
            spread_rows(z[plan.offset[t] : plan.offset[t] + lay.n_coefficients], lay, idx_t, val_t)
        return invert(plan, z)
