"""Chunked orthonormal DCT-II and its exact inverse, torch backend (CPU, CUDA, MPS).

Chunking follows :mod:`distronet.kernels.layout`. Each chunk is transformed with the
orthonormal DCT-II basis ``D`` (``D[k, j] = a_k cos(pi (2j + 1) k / 2b)``, ``a_0 = sqrt(1/b)``,
``a_k = sqrt(2/b)``): a 1-D run ``x`` becomes ``D x``, a 2-D block ``X`` becomes ``D_r X D_c^T``.
The inverse applies the transposes. Both are exact up to floating-point rounding.

Two orders of coefficient storage appear here:

* **chunk order** ``(n_chunks, chunk_numel)``, the public one (what top-k and the wire use);
* **spatial order**, internal: coefficients kept where their block sits in the padded tensor,
  shape ``(B, Rp, Cp)`` for rank >= 2 and ``(g, b)`` for rank <= 1. The transforms work in
  spatial order with two large matrix products and no copy; converting to chunk order costs
  one permuted copy, which the fused paths in ``topk``/``decode`` avoid.

Floating dtypes float32 and float64 are computed in their own precision; float16 and bfloat16
inputs are computed (and returned) in float32.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = [
    "chunks_from_spatial",
    "dct_accumulate",
    "dct_basis",
    "dct_chunks",
    "dct_spatial",
    "forward_chunks",
    "forward_spatial",
    "idct_chunks",
    "idct_rows",
    "idct_spatial",
    "index_tables",
    "spatial_from_chunks",
    "spatial_index",
    "spatial_shape",
    "spread_by_product",
    "spread_rows",
    "tensor_from_blocks",
    "work_dtype",
]


def basis_numpy(n: int) -> np.ndarray:
    """The ``(n, n)`` orthonormal DCT-II matrix in float64 (row ``k`` is basis function ``k``)."""
    j = np.arange(n, dtype=np.float64)
    d = np.cos(np.pi * (2.0 * j[None, :] + 1.0) * j[:, None] / (2.0 * n))
    d[0] *= math.sqrt(1.0 / n)
    d[1:] *= math.sqrt(2.0 / n)
    return d


@functools.lru_cache(maxsize=64)
def dct_basis(n: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> torch.Tensor:
    """The cached ``(n, n)`` orthonormal DCT-II matrix for ``(n, dtype, device)``. Do not modify it."""
    return torch.tensor(basis_numpy(n), dtype=dtype, device=device)


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the transforms compute in for an input of ``dtype``.

    Raises:
        KernelError: ``dtype`` is not a floating dtype.
    """
    if dtype in (torch.float32, torch.float64):
        return dtype
    if dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    raise KernelError(f"the DCT needs a floating tensor, got {dtype}")


def _check_shape(t: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != shape:
        raise KernelError(f"{what} has shape {tuple(t.shape)}, the layout expects {shape}")


def _bases(layout: ChunkLayout, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    return [dct_basis(b, dtype, device) for b in layout.block]


def forward_spatial(x: torch.Tensor, layout: ChunkLayout, *, into_scratch: bool = False) -> torch.Tensor:
    """:func:`dct_spatial`; with ``into_scratch`` the result lives in scratch slot 1 (internal use)."""
    _check_shape(x, layout.shape, "tensor")
    x = x.to(work_dtype(x.dtype))
    bases = _bases(layout, x.dtype, x.device)
    if len(layout.block) == 1:
        (g,), (b,) = layout.grid, layout.block
        v = x.reshape(-1)
        if layout.is_padded:
            v = F.pad(v, (0, g * b - v.numel()))
        out = scratch(1, (g, b), x.dtype, x.device) if into_scratch else None
        return torch.mm(v.view(g, b), bases[0].T, out=out)
    (gr, _gc), (br, _bc) = layout.grid, layout.block
    rp, cp = layout.padded
    z = _column_transform(x, layout)
    # Row transform: D_r @ (br, Cp) slab per block row, one batched GEMM.
    y = scratch(1, (layout.batch * gr, br, cp), x.dtype, x.device) if into_scratch else None
    return torch.matmul(bases[0], z.view(layout.batch * gr, br, cp), out=y).view(layout.batch, rp, cp)


def _column_transform(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """``X D_c^T`` of every block of a rank >= 2 tensor (zero-padded) at once, one product over
    rows of ``bc``: ``(batch * rp * cp / bc, bc)`` in spatial order, in scratch slot 0."""
    (r, c), (rp, cp) = layout.core, layout.padded
    bc = layout.block[1]
    x3 = x.reshape(layout.batch, r, c)
    if layout.is_padded:
        x3 = F.pad(x3, (0, cp - c, 0, rp - r))
    z = scratch(0, (layout.batch * rp * cp // bc, bc), x.dtype, x.device)
    return torch.mm(x3.reshape(-1, bc), dct_basis(bc, x.dtype, x.device).T, out=z)


def _into_chunks(x: torch.Tensor, layout: ChunkLayout, out: torch.Tensor) -> None:
    """Copy a rank >= 2 tensor's blocks (zero-padded) into ``out`` ``(n_chunks, br, bc)``, chunk order."""
    (gr, gc), (br, bc) = layout.grid, layout.block
    (r, c), (rp, cp) = layout.core, layout.padded
    x3 = x.reshape(layout.batch, r, c)
    if layout.is_padded:
        x3 = F.pad(x3, (0, cp - c, 0, rp - r))
    out.view(layout.batch, gr, gc, br, bc).copy_(x3.view(layout.batch, gr, br, gc, bc).permute(0, 1, 3, 2, 4))


def forward_chunks(xs: Sequence[torch.Tensor], layouts: Sequence[ChunkLayout]) -> torch.Tensor:
    """DCT of every chunk of the rank >= 2 tensors ``xs`` (``layouts[i].shape``, all of one block
    shape ``(br, bc)``), stacked in chunk order: ``(sum of n_chunks, br, bc)``, tensor after tensor.

    One permuted copy of each tensor into a chunk-order buffer, then one product for the columns
    of every chunk (``X_n D_c^T``) and one batched product for the rows (``D_r (X_n D_c^T)``), so
    the coefficients come out where a selection reads them chunk by chunk, contiguously (a
    spatial-order buffer, :func:`forward_spatial`, strides each chunk's rows across the tensor).
    The result lives in scratch slot 1 (internal use: valid until the next call on this thread).

    Raises:
        KernelError: a tensor does not have its layout's shape, is not floating, or the layouts'
            blocks differ or are not 2-D.
    """
    if not xs or len(xs) != len(layouts):
        raise KernelError(f"{len(xs)} tensors for {len(layouts)} layouts")
    block = layouts[0].block
    if len(block) != 2 or any(lay.block != block for lay in layouts):
        raise KernelError(f"forward_chunks needs one 2-D block shape, got {[lay.block for lay in layouts]}")
    dt, dev = work_dtype(xs[0].dtype), xs[0].device
    br, bc = block
    n = sum(lay.n_chunks for lay in layouts)
    buf = scratch(1, (n, br, bc), dt, dev)
    row = 0
    for x, lay in zip(xs, layouts, strict=True):
        _check_shape(x, lay.shape, "tensor")
        _into_chunks(x.detach().to(dt), lay, buf[row : row + lay.n_chunks])
        row += lay.n_chunks
    z = scratch(2, (n, br, bc), dt, dev)
    torch.mm(buf.view(n * br, bc), dct_basis(bc, dt, dev).T, out=z.view(n * br, bc))
    return torch.matmul(dct_basis(br, dt, dev), z, out=buf)


def dct_spatial(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """DCT of every chunk of ``x`` (shape ``layout.shape``), coefficients in spatial order.

    Returns ``(g, b)`` for rank <= 1, ``(B, Rp, Cp)`` for rank >= 2. Cost: two matrix products,
    ``2 * n_coefficients * sum(block)`` flops; a padded copy only when the layout pads.

    Raises:
        KernelError: ``x`` does not have ``layout.shape`` or is not floating.
    """
    with torch.no_grad():
        return forward_spatial(x, layout)


def idct_spatial(y: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Inverse of :func:`dct_spatial`: spatial-order coefficients to a tensor of ``layout.shape``.

    Padding is dropped. Cost: as :func:`dct_spatial`. ``y`` must not be in scratch slot 0.
    """
    with torch.no_grad():
        y = y.to(work_dtype(y.dtype))
        bases = _bases(layout, y.dtype, y.device)
        if len(layout.block) == 1:
            _check_shape(y, (layout.grid[0], layout.block[0]), "coefficients")
            v = (y @ bases[0]).reshape(-1)
            return v[: layout.numel].reshape(layout.shape)
        bc, (rp, cp) = layout.block[1], layout.padded
        _check_shape(y, (layout.batch, rp, cp), "coefficients")
        z = scratch(0, (layout.batch * rp * cp // bc, bc), y.dtype, y.device)
        torch.mm(y.reshape(-1, bc), bases[1], out=z)
        return idct_rows(z, layout)


def spread_rows(z: torch.Tensor, layout: ChunkLayout, idx: torch.Tensor, val: torch.Tensor) -> None:
    """Add the first product of the inverse of coefficients ``idx``/``val`` (chunk order,
    ``(..., n_chunks, k)``) into ``z`` (the layout's spatial-order buffer, any shape of that many
    elements, float). ``z`` zero to start with, then :func:`idct_rows`, is the inverse of the
    coefficients' sum, up to rounding.

    On the CPU each entry adds ``val * D_w[v, :]`` to its row (``w`` the block's last size, ``v =
    idx % w`` the entry's column), entry by entry in order (``index_add_``, serial there), so
    ``kernels.decode_jit`` matches it bit for bit. On other devices (whose ``index_add_`` adds
    with atomics anyway) the coefficients are scattered and multiplied by ``D_w`` once: a
    coefficient buffer of temporary memory where the rows would take ``w`` floats an entry."""
    if z.device.type != "cpu":
        spread_by_product(z, layout, idx, val)
        return
    w = layout.block[-1]
    basis = dct_basis(w, z.dtype, z.device)
    v = idx % w
    rows = torch.div(spatial_index(idx, layout) - v, w, rounding_mode="floor").reshape(-1)
    z.view(-1, w).index_add_(0, rows, basis[v.reshape(-1)].mul_(val.reshape(-1, 1).to(z.dtype)))


def spread_by_product(z: torch.Tensor, layout: ChunkLayout, idx: torch.Tensor, val: torch.Tensor) -> None:
    """:func:`spread_rows` on devices other than the CPU: the coefficients scattered into a zeroed
    buffer, then ``z += C D_w`` (one product; equal to the CPU's sums up to rounding)."""
    w = layout.block[-1]
    coef = torch.zeros(z.numel(), dtype=z.dtype, device=z.device)
    coef.scatter_add_(0, spatial_index(idx, layout).reshape(-1), val.reshape(-1).to(z.dtype))
    z.view(-1, w).addmm_(coef.view(-1, w), dct_basis(w, z.dtype, z.device))


def idct_rows(z: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """The inverse's rest once its first product is in ``z`` (spatial order, the layout's
    ``n_coefficients`` elements, any shape; :func:`spread_rows`): for 2-D blocks the product by
    ``D_r^T`` of every block row, a fresh tensor; for 1-D blocks nothing but a copy. Padding dropped;
    the result never shares ``z``'s storage."""
    if len(layout.block) == 1:
        return z.reshape(-1)[: layout.numel].reshape(layout.shape).clone()
    (gr, _gc), br = layout.grid, layout.block[0]
    (r, c), (rp, cp) = layout.core, layout.padded
    d_r = _bases(layout, z.dtype, z.device)[0]
    x3 = torch.matmul(d_r.T, z.view(layout.batch * gr, br, cp)).view(layout.batch, rp, cp)
    if layout.is_padded:
        x3 = x3[:, :r, :c]
    return x3.reshape(layout.shape)


def _block_view(y: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """``(B, Rp, Cp)`` spatial coefficients viewed as ``(B, gr, gc, br, bc)`` (no copy)."""
    (gr, gc), (br, bc) = layout.grid, layout.block
    return y.view(layout.batch, gr, br, gc, bc).permute(0, 1, 3, 2, 4)


def chunks_from_spatial(y: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Spatial-order coefficients to chunk order ``(n_chunks, chunk_numel)`` (one copy for rank >= 2)."""
    if len(layout.block) == 1:
        return y
    return _block_view(y, layout).reshape(layout.n_chunks, layout.chunk_numel)


def spatial_from_chunks(c: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Chunk-order coefficients to spatial order (one copy for rank >= 2)."""
    _check_shape(c, (layout.n_chunks, layout.chunk_numel), "coefficients")
    if len(layout.block) == 1:
        return c
    (gr, gc), (br, bc) = layout.grid, layout.block
    blocks = c.reshape(layout.batch, gr, gc, br, bc).permute(0, 1, 3, 2, 4)
    return blocks.reshape(layout.batch, *layout.padded)


@functools.lru_cache(maxsize=256)
def index_tables(layout: ChunkLayout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(base (n_chunks, 1), local (chunk_numel,))``: spatial position = base[n] + local[i]."""
    n = torch.arange(layout.n_chunks, device=device)
    i = torch.arange(layout.chunk_numel, device=device)
    if len(layout.block) == 1:
        return (n * layout.block[0]).unsqueeze(1), i
    (_gr, gc), (br, bc) = layout.grid, layout.block
    base = (n // gc) * (br * gc * bc) + (n % gc) * bc  # n // gc runs over (batch, block row)
    return base.unsqueeze(1), (i // bc) * (gc * bc) + i % bc


def spatial_index(idx: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Flat spatial-order positions of chunk-order indices ``idx`` ``(n_chunks, k)`` (int64)."""
    base, local = index_tables(layout, idx.device)
    return base + local[idx]


def dct_chunks(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Orthonormal DCT-II of every chunk of ``x``: ``(n_chunks, chunk_numel)``, chunk order.

    Raises:
        KernelError: ``x`` does not have ``layout.shape`` or is not floating.
    """
    with torch.no_grad():
        y = forward_spatial(x, layout, into_scratch=len(layout.block) > 1)
        return chunks_from_spatial(y, layout)


def dct_accumulate(
    m: torch.Tensor, x: torch.Tensor, layout: ChunkLayout, beta: float, alpha: float, *, spatial: bool = False
) -> None:
    """``m = beta * m + alpha * DCT(x)`` in place, ``m`` float32 contiguous: the momentum update
    of a step. ``m`` is ``(n_chunks, chunk_numel)`` in chunk order, or with ``spatial`` (2-D
    blocks only) the spatial coefficients ``(batch * padded rows, padded cols)``
    (:func:`spatial_shape`).

    Chunk order reads the transform's coefficients where it leaves them (spatial order, through a
    permuted view), with no chunk-order copy: that copy, a fresh tensor the size of the parameter,
    cost more than the transform's two products (Llama set: 8.1 against 11.8 ms). Spatial order
    folds the update into the second product (``baddbmm``: ``beta * m + alpha * D_r Z`` written
    once), with no separate scale and add pass: the Llama set's 2-D tensors 6.4-6.9 against
    8.8-9.7 ms (2 threads, machine D).

    Raises:
        KernelError: ``x`` does not have ``layout.shape``, is not floating, or ``m`` does not have
            the shape of its order (``spatial`` with a 1-D block included).
    """
    if spatial:
        if len(layout.block) != 2:
            raise KernelError(f"a spatial momentum needs 2-D blocks, the layout has {layout.block}")
        _check_shape(m, spatial_shape(layout), "momentum")
        _check_shape(x, layout.shape, "tensor")
        with torch.no_grad():
            x = x.to(work_dtype(x.dtype))
            (gr, _gc), (br, _bc) = layout.grid, layout.block
            cp = layout.padded[1]
            z = _column_transform(x, layout)
            d_r = dct_basis(br, x.dtype, x.device).expand(layout.batch * gr, br, br)
            m.view(layout.batch * gr, br, cp).baddbmm_(
                d_r, z.view(layout.batch * gr, br, cp), beta=beta, alpha=alpha
            )
        return
    _check_shape(m, (layout.n_chunks, layout.chunk_numel), "momentum")
    with torch.no_grad():
        y = forward_spatial(x, layout, into_scratch=True)
        if len(layout.block) == 2:
            (gr, gc), (br, bc) = layout.grid, layout.block
            y = y.view(layout.batch, gr, br, gc, bc).permute(0, 1, 3, 2, 4)
            m = m.view(layout.batch, gr, gc, br, bc)
        m.mul_(beta).add_(y, alpha=alpha)


def spatial_shape(layout: ChunkLayout) -> tuple[int, int]:
    """The 2-D shape of a 2-D-block layout's spatial coefficients: ``(batch * padded rows, padded
    cols)``; chunk ``n`` is the block at block row ``n // gc``, block column ``n % gc``.

    Raises:
        KernelError: the layout's blocks are 1-D.
    """
    if len(layout.block) != 2:
        raise KernelError(f"spatial coefficients of 2-D blocks only, the layout has {layout.block}")
    return layout.batch * layout.padded[0], layout.padded[1]


def idct_chunks(c: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Exact inverse of :func:`dct_chunks`: ``(n_chunks, chunk_numel)`` to ``layout.shape``.

    Raises:
        KernelError: ``c`` is not ``(n_chunks, chunk_numel)`` or is not floating.
    """
    work_dtype(c.dtype)
    return idct_spatial(spatial_from_chunks(c, layout), layout)


def tensor_from_blocks(x: torch.Tensor, layout: ChunkLayout) -> torch.Tensor:
    """Decoded chunk-order blocks ``(n_chunks, *block)`` (or any view of that many elements) to
    a tensor of ``layout.shape``, padding dropped (a view where the layout allows one)."""
    if len(layout.block) == 1:
        return x.reshape(-1)[: layout.numel].reshape(layout.shape)
    (gr, gc), (br, bc) = layout.grid, layout.block
    x3 = x.view(layout.batch, gr, gc, br, bc).permute(0, 1, 3, 2, 4).reshape(layout.batch, *layout.padded)
    if layout.is_padded:
        r, c = layout.core
        x3 = x3[:, :r, :c]
    return x3.reshape(layout.shape)
