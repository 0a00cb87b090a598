"""DCT + top-k of many tensors at once: one transform and one selection per block shape.

:func:`dct_topk_groups` is ``[dct_topk(x, layout, k) for each tensor]`` with the per-tensor
fixed costs paid once per block shape, as :func:`decode_plan.invert` does on the way back:
tensors of at most :data:`~distronet.kernels.decode_plan.SMALL_COEFFICIENTS` coefficients are
copied, chunk by chunk, into ONE chunk-order buffer per ``(block shape, k)`` (one permuted copy
each), transformed there by one pair of matrix products (``C_n = D_r X_n D_c^T`` for every chunk
``n``) and selected by one ``topk_chunks``; larger tensors keep the two-GEMM spatial transform
and the fused selection of :func:`~distronet.kernels.topk.dct_topk`. The result is a list of
:class:`TopkGroup`, each a stacked ``(N, k)`` pair ready for the payload coder
(:func:`distronet.kernels.coding_batch.encode_groups`), with no per-tensor split or restack.

Same coefficients as the per-tensor transform up to float rounding (a product over a batch of
chunks may take another BLAS kernel than one over a tensor's slab), so the same selection except
where two coefficients are within rounding of each other; the wire format does not depend on it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from distronet.kernels.dct import dct_basis, work_dtype
from distronet.kernels.decode_plan import SMALL_COEFFICIENTS
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.topk import _select, check_k, dct_topk, topk_chunks, topk_magnitude
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = ["TopkGroup", "dct_topk_groups"]


@dataclass(frozen=True)
class TopkGroup:
    """Tensors ``members`` (positions in the caller's list) stacked: member ``j`` owns rows
    ``sum(rows[:j]) .. sum(rows[:j + 1])`` of ``idx`` int64 ``(N, k)`` and ``val`` ``(N, k)``
    (``dct_topk``'s contract per row)."""

    members: tuple[int, ...]
    rows: tuple[int, ...]
    chunk_numel: int
    idx: torch.Tensor
    val: torch.Tensor


def _into_rows(x: torch.Tensor, layout: ChunkLayout, out: torch.Tensor) -> None:
    """Copy a rank <= 1 tensor's chunks (zero-padded) into ``out`` ``(n_chunks, b)``."""
    (g,), (b,) = layout.grid, layout.block
    v = x.reshape(-1)
    if layout.is_padded:
        v = F.pad(v, (0, g * b - v.numel()))
    out.copy_(v.view(g, b))


def _into_slab(x: torch.Tensor, layout: ChunkLayout, out: torch.Tensor) -> None:
    """Copy a rank >= 2 tensor's block rows (zero-padded) side by side into ``out`` ``(br, n_chunks * bc)``:
    block row ``s`` (over batch and grid rows) at columns ``s * Cp ..``, so its chunk ``n`` sits at
    columns ``n * bc .. n * bc + bc``."""
    (gr, _gc), (br, _bc) = layout.grid, layout.block
    (r, c), (rp, cp) = layout.core, layout.padded
    x3 = x.reshape(layout.batch, r, c)
    if layout.is_padded:
        x3 = F.pad(x3, (0, cp - c, 0, rp - r))
    out.view(br, layout.batch * gr, cp).copy_(x3.reshape(layout.batch * gr, br, cp).transpose(0, 1))


@functools.lru_cache(maxsize=64)
def _slab_tables(n: int, br: int, bc: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Position in a ``(br, n * bc)`` slab of chunk ``n``'s coefficient ``i``: base[n] + local[i]."""
    i = torch.arange(br * bc, device=device)
    return (torch.arange(n, device=device) * bc).unsqueeze(1), (i // bc) * (n * bc) + i % bc


def _group_topk(
    xs: Sequence[torch.Tensor], layouts: Sequence[ChunkLayout], block: tuple[int, ...], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the DCT of every chunk of tensors of one block shape, stacked ``(N, k)``.

    Rank <= 1: the chunks as rows, one product. Rank >= 2: every tensor's block rows side by side
    in one ``(br, N * bc)`` slab, so the column transform (``slab.view(-1, bc) @ D_c^T``) and the
    row transform (``D_r @ slab``) are one large product each, and the selection reads the slab
    in place (``topk._select``'s chunk tables), as ``dct_topk`` reads one tensor's spatial order.
    """
    dt, dev = work_dtype(xs[0].dtype), xs[0].device
    n = sum(lay.n_chunks for lay in layouts)
    if len(block) == 1:
        buf = torch.empty((n, block[0]), dtype=dt, device=dev)
        row = 0
        for x, lay in zip(xs, layouts, strict=True):
            _into_rows(x.detach().to(dt), lay, buf[row : row + lay.n_chunks])
            row += lay.n_chunks
        return topk_chunks(torch.mm(buf, dct_basis(block[0], dt, dev).T), k)
    br, bc = block
    slab = scratch(1, (br, n * bc), dt, dev)
    col = 0
    for x, lay in zip(xs, layouts, strict=True):
        _into_slab(x.detach().to(dt), lay, slab[:, col : col + lay.n_chunks * bc])
        col += lay.n_chunks * bc
    z = scratch(0, (n * br, bc), dt, dev)
    torch.mm(slab.view(n * br, bc), dct_basis(bc, dt, dev).T, out=z)
    y = torch.mm(dct_basis(br, dt, dev), z.view(br, n * bc), out=slab)
    tables = _slab_tables(n, br, bc, dev)
    fast = _select(y.view(1, 1, br, n, bc), k, br * bc, tables)
    if fast is not None:
        return fast
    mag = torch.abs(y.view(br, n, bc).transpose(0, 1)).reshape(n, br * bc)
    idx = topk_magnitude(mag, k)
    base, local = tables
    return idx, y.reshape(-1)[base + local[idx]]


def dct_topk_groups(
    tensors: Sequence[torch.Tensor], layouts: Sequence[ChunkLayout], ks: Sequence[int]
) -> list[TopkGroup]:
    """The top-``ks[i]`` DCT coefficients of every chunk of ``tensors[i]`` (``layouts[i].shape``),
    grouped (module doc). Every tensor is in exactly one group; groups are in order of their
    first member. Raises ``KernelError`` as :func:`dct_topk` does."""
    if not len(tensors) == len(layouts) == len(ks):
        raise KernelError(f"{len(tensors)} tensors, {len(layouts)} layouts, {len(ks)} k's")
    small: dict[tuple[tuple[int, ...], int], list[int]] = {}
    order: list[tuple[tuple[int, ...], int] | int] = []
    for i, (x, lay, k) in enumerate(zip(tensors, layouts, ks, strict=True)):
        check_k(k, lay.chunk_numel)
        if tuple(x.shape) != lay.shape:
            raise KernelError(f"tensor {i} has shape {tuple(x.shape)}, the layout expects {lay.shape}")
        if lay.n_coefficients > SMALL_COEFFICIENTS:
            order.append(i)
            continue
        key = (lay.block, k)
        if key not in small:
            small[key] = []
            order.append(key)
        small[key].append(i)
    out = []
    with torch.no_grad():
        for item in order:
            if isinstance(item, int):
                lay = layouts[item]
                idx, val = dct_topk(tensors[item], lay, ks[item])
                out.append(TopkGroup((item,), (lay.n_chunks,), lay.chunk_numel, idx, val))
                continue
            block, k = item
            members = small[item]
            lays = [layouts[i] for i in members]
            idx, val = _group_topk([tensors[i] for i in members], lays, block, k)
            rows = tuple(lay.n_chunks for lay in lays)
            out.append(TopkGroup(tuple(members), rows, lays[0].chunk_numel, idx, val))
    return out
