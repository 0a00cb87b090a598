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

from distronet.kernels.dct import work_dtype
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
    """``[decode_sum(layouts[t], parts[t]) for t]`` in one pass (one scatter, one inverse per block shape).

    ``parts[t]`` are tensor ``t``'s ``(idx, val)`` parts (any number, any k; see
    :mod:`distronet.kernels.decode`). Equal to the per-tensor decode up to rounding; always
    ``index_add_`` (never the compiled scatter).

    Raises:
        KernelError: ``parts`` and ``layouts`` differ in length, a part has the wrong shape or
            dtype, or an index lies outside ``[0, chunk_numel)``.
    """
    if len(parts) != len(layouts):
        raise KernelError(f"{len(parts)} part lists for {len(layouts)} layouts")
    plan = plan_batch(tuple(layouts))
    dt, dev = work_dtype(dtype), torch.device(device)
    idx_all: list[np.ndarray] = []
    val_all: list[np.ndarray] = []
    base_all: list[np.ndarray] = []
    cn_all: list[tuple[int, int]] = []
    big: list[tuple[int, int]] = []
    for t, tparts in enumerate(parts):
        lay = plan.layouts[t]
        bases: dict[int, np.ndarray] = {}  # per k: each coefficient's chunk base
        for part in tparts:
            idx, val = _part_numpy(lay, t, part)
            k = idx.shape[1]
            if k not in bases:
                bases[k] = np.repeat(plan.chunk_base[t], k)
            if plan.local[t] is not None:
                big.append((len(idx_all), t))
            idx_all.append(idx.reshape(-1))
            val_all.append(val.reshape(-1))
            base_all.append(bases[k])
            cn_all.append((lay.chunk_numel, idx.size))
    with torch.no_grad():
        buf = scratch(1, (plan.size,), dt, dev).zero_()
        if idx_all:
            idx = np.concatenate(idx_all)
            cn = np.repeat(*(np.array(c, dtype=np.int64) for c in zip(*cn_all, strict=True)))
            bad = (idx < 0) | (idx >= cn)
            if bool(bad.any()):
                at = int(np.argmax(bad))
                raise KernelError(f"an index ({int(idx[at])}) is outside [0, {int(cn[at])})")
            within = list(idx_all)
            for i, t in big:  # big tensors: spatial order inside a chunk (indices checked above)
                local = plan.local[t]
                assert local is not None
                within[i] = local[idx_all[i]]
            pos = np.concatenate(base_all) + (idx if not big else np.concatenate(within))
            vals = torch.from_numpy(np.concatenate(val_all))
            buf.index_add_(0, torch.from_numpy(pos).to(dev), vals.to(device=dev, dtype=dt))
        return invert(plan, buf)
