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

from distronet.kernels.dct import dct_basis, work_dtype
from distronet.kernels.decode import Part, spread_entries
from distronet.kernels.decode_plan import BatchPlan, invert, plan_batch
from distronet.kernels.jit_state import use_jit
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
    """``[decode_sum(layouts[t], parts[t]) for t]`` in one pass (the first product of the inverse from
    the entries, one ``index_add_`` a tensor, into one flat buffer; one second product per block
    shape).

    ``parts[t]`` are tensor ``t``'s ``(idx, val)`` parts (any number, any k; see
    :mod:`distronet.kernels.decode`). Equal to the per-tensor decode up to rounding; part ``p``
    of every tensor is added as packet ``p`` of the node's compiled pass
    (:func:`~distronet.kernels.decode.spread_entries`) once it is warm, else by ``index_add_``.

    Raises:
        KernelError: ``parts`` and ``layouts`` differ in length, a part has the wrong shape or
            dtype, or an index lies outside ``[0, chunk_numel)``.
    """
    if len(parts) != len(layouts):
        raise KernelError(f"{len(parts)} part lists for {len(layouts)} layouts")
    plan = plan_batch(tuple(layouts))
    dt, dev = work_dtype(dtype), torch.device(device)
    checked = [
        [_part_numpy(lay, t, part) for part in tparts]
        for t, (lay, tparts) in enumerate(zip(plan.layouts, parts, strict=True))
    ]
    for lay, tparts in zip(plan.layouts, checked, strict=True):
        for idx, _ in tparts:
            if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= lay.chunk_numel):
                bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
                raise KernelError(f"an index ({bad}) is outside [0, {lay.chunk_numel})")
    with torch.no_grad():
        z = scratch(1, (plan.size,), dt, dev)
        if dev.type == "cpu" and dt == torch.float32 and use_jit():
            _spread_compiled(plan, z, checked)
        else:
            _spread_tensors(plan, z, checked)
        return invert(plan, z)


def _spread_compiled(
    plan: BatchPlan, z: torch.Tensor, checked: list[list[tuple[np.ndarray, np.ndarray]]]
) -> None:
    """Part ``p`` of every tensor as packet ``p`` of :func:`decode.spread_entries`."""
    n_p = max((len(tparts) for tparts in checked), default=0)
    kk = np.zeros((n_p, len(checked)), dtype=np.int64)
    oo = np.zeros_like(kk)
    idx_all, val_all, at = [], [], 0
    for p in range(n_p):
        for t, tparts in enumerate(checked):
            if p < len(tparts):
                idx, val = tparts[p]
                kk[p, t], oo[p, t] = idx.shape[1], at
                idx_all.append(idx.reshape(-1))
                val_all.append(val.reshape(-1))
                at += idx.size
    idx = np.concatenate([np.zeros(0, np.int64), *idx_all])
    val = np.concatenate([np.zeros(0, np.float32), *val_all])
    spread_entries(plan, z, kk, oo, idx, val, np.ones(len(checked), dtype=np.bool_))


def _spread_tensors(
    plan: BatchPlan, z: torch.Tensor, checked: list[list[tuple[np.ndarray, np.ndarray]]]
) -> None:
    """:func:`_spread_compiled` by tensor operations: one ``index_add_`` a tensor
    (``dct.spread_rows``'s sums, the parts concatenated in order)."""
    z.zero_()
    dt, dev = z.dtype, z.device
    for t, tparts in enumerate(checked):
        if not tparts:
            continue
        lay = plan.layouts[t]
        w = lay.block[-1]
        rows, cols = [], []
        for idx, _ in tparts:
            rows.append(((plan.positions(t, idx) - plan.offset[t] - idx % w) // w).reshape(-1))
            cols.append((idx % w).reshape(-1))
        vals = np.concatenate([v.reshape(-1) for _, v in tparts])
        add = dct_basis(w, dt, dev)[torch.from_numpy(np.concatenate(cols)).to(dev)]
        add.mul_(torch.from_numpy(vals).to(device=dev, dtype=dt).unsqueeze(1))
        region = z[plan.offset[t] : plan.offset[t] + lay.n_coefficients].view(-1, w)
        region.index_add_(0, torch.from_numpy(np.concatenate(rows)).to(dev), add)
