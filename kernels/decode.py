"""Sum any number of sparse packets into one dense tensor: one scatter, one inverse transform.

A part is ``(idx, val)``: ``idx`` int64 ``(n_chunks, k)`` with every entry in
``[0, chunk_numel)``, ``val`` floating ``(n_chunks, k)``; ``k`` may differ between parts.
Entries at the same position (in one part or across parts) add up. Decoding is linear, so
``decode_sum(parts) == sum(decode_sum([p]) for p in parts)`` up to rounding.

Two inverses, chosen by the total ``K = sum(k)`` per chunk (see :func:`choose_method`):

* ``dense``: scatter into a spatial-order coefficient buffer, then the full inverse DCT
  (two large matrix products, ``2 * n_coefficients * (br + bc)`` flops);
* ``sparse``: the column inverse as a sum of ``K`` scaled basis rows per chunk
  (``index_add``, ``n_chunks * K * bc`` adds), then the dense row inverse (half the dense cost).

On CUDA, scatter/index-add accumulate with atomics, so the last bits of a sum may differ from
run to run; on CPU the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from distronet.kernels.dct import dct_basis, idct_spatial, spatial_index, work_dtype
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = ["SPARSE_MAX_FRACTION", "Method", "Part", "choose_method", "decode_sum", "scatter_sum"]

Part = tuple[torch.Tensor, torch.Tensor]
Method = Literal["auto", "dense", "sparse"]

SPARSE_MAX_FRACTION = 0.5
"""``auto`` picks the sparse inverse while ``K <= SPARSE_MAX_FRACTION * bc`` (measured, see
docs/benchmarks.md "Codec")."""


def _check_parts(layout: ChunkLayout, parts: Sequence[Part]) -> None:
    for i, (idx, val) in enumerate(parts):
        if idx.dtype != torch.int64:
            raise KernelError(f"part {i}: indices must be int64, got {idx.dtype}")
        if idx.dim() != 2 or idx.shape[0] != layout.n_chunks or tuple(val.shape) != tuple(idx.shape):
            raise KernelError(
                f"part {i}: idx {tuple(idx.shape)} and val {tuple(val.shape)} must both be "
                f"({layout.n_chunks}, k)"
            )
        work_dtype(val.dtype)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= layout.chunk_numel):
            raise KernelError(f"part {i}: an index is outside [0, {layout.chunk_numel})")


def _result_dtype(parts: Sequence[Part], dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return work_dtype(dtype)
    return work_dtype(parts[0][1].dtype) if parts else torch.float32


def _result_device(parts: Sequence[Part], device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return parts[0][1].device if parts else torch.device("cpu")


def scatter_sum(
    layout: ChunkLayout,
    parts: Sequence[Part],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Sum of all parts in coefficient space, chunk order ``(n_chunks, chunk_numel)``.

    ``dtype``/``device`` default to the first part's values' (float32/CPU when there are none).

    Raises:
        KernelError: a part has the wrong shape or dtype, or an index out of range.
    """
    _check_parts(layout, parts)
    dt, dev = _result_dtype(parts, dtype), _result_device(parts, device)
    buf = torch.zeros((layout.n_chunks, layout.chunk_numel), dtype=dt, device=dev)
    for idx, val in parts:
        buf.scatter_add_(1, idx.to(dev), val.to(device=dev, dtype=dt))
    return buf


def choose_method(layout: ChunkLayout, total_k: int) -> Literal["dense", "sparse"]:
    """The inverse ``auto`` uses for ``total_k`` coefficients per chunk."""
    return "sparse" if total_k <= SPARSE_MAX_FRACTION * layout.block[-1] else "dense"


def _dense(layout: ChunkLayout, parts: Sequence[Part], dt: torch.dtype, dev: torch.device) -> torch.Tensor:
    spatial = (layout.grid[0], layout.block[0]) if len(layout.block) == 1 else (layout.batch, *layout.padded)
    buf = scratch(1, spatial, dt, dev).zero_()
    if parts:
        # One scatter for all parts, entries grouped by chunk: each chunk's writes stay local.
        idx = torch.cat([p[0].to(dev) for p in parts], dim=1)
        val = torch.cat([p[1].to(device=dev, dtype=dt) for p in parts], dim=1)
        buf.view(-1).scatter_add_(0, spatial_index(idx, layout).view(-1), val.view(-1))
    return idct_spatial(buf, layout)


def _sparse(layout: ChunkLayout, parts: Sequence[Part], dt: torch.dtype, dev: torch.device) -> torch.Tensor:
    bc = layout.block[-1]
    basis_c = dct_basis(bc, dt, dev)
    # Column inverse, sparsely: row (chunk, u) of T gains val * D_c[v, :] for each (u, v) sent.
    t = scratch(1, (layout.n_coefficients // bc, bc), dt, dev).zero_()
    for idx, val in parts:
        idx = idx.to(dev)
        rows = spatial_index(idx, layout) // bc  # the spatial row of (chunk, u)
        src = scratch(2, (idx.numel(), bc), dt, dev)
        torch.index_select(basis_c, 0, (idx % bc).view(-1), out=src)
        src.mul_(val.to(device=dev, dtype=dt).reshape(-1, 1))
        t.index_add_(0, rows.view(-1), src)
    if len(layout.block) == 1:
        return t.view(-1)[: layout.numel].reshape(layout.shape).clone()
    # Row inverse, dense: D_r^T @ (br, Cp) slab per block row.
    (gr, _gc), (br, _bc) = layout.grid, layout.block
    (r, c), (rp, cp) = layout.core, layout.padded
    basis_r = dct_basis(br, dt, dev)
    x3 = torch.matmul(basis_r.T, t.view(layout.batch * gr, br, cp)).view(layout.batch, rp, cp)
    if layout.is_padded:
        x3 = x3[:, :r, :c]
    return x3.reshape(layout.shape)


def decode_sum(
    layout: ChunkLayout,
    parts: Sequence[Part],
    *,
    method: Method = "auto",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The dense tensor (``layout.shape``) that the sum of all parts encodes.

    ``method`` picks the inverse (module doc); every method gives the same result up to rounding.
    No parts decode to zeros.

    Raises:
        KernelError: a part has the wrong shape or dtype, an index is out of range, or an
            unknown ``method``.
    """
    if method not in ("auto", "dense", "sparse"):
        raise KernelError(f"unknown decode method {method!r}")
    _check_parts(layout, parts)
    dt, dev = _result_dtype(parts, dtype), _result_device(parts, device)
    if method == "auto":
        method = choose_method(layout, sum(int(p[0].shape[1]) for p in parts))
    with torch.no_grad():
        return (_sparse if method == "sparse" else _dense)(layout, parts, dt, dev)
