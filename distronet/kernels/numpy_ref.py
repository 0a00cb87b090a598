"""Plain numpy reference of the chunked DCT, top-k and decode: written for clarity, not speed.

Same contracts as the torch functions of the same names (:mod:`distronet.kernels.dct`,
:mod:`~distronet.kernels.topk`, :mod:`~distronet.kernels.decode`); tests hold the two to parity.
Every chunk is cut out explicitly as ``(batch, block row, block col, br, bc)`` and transformed
with ``einsum`` against the float64 basis of :func:`distronet.kernels.dct.basis_numpy`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distronet.kernels.dct import basis_numpy
from distronet.kernels.layout import ChunkLayout
from distronet.protocol.errors import KernelError

__all__ = ["dct_basis", "dct_chunks", "decode_sum", "idct_chunks", "scatter_sum", "topk_chunks"]


def dct_basis(n: int, dtype: np.dtype | type = np.float64) -> np.ndarray:
    """The ``(n, n)`` orthonormal DCT-II matrix (row ``k`` is basis function ``k``)."""
    return basis_numpy(n).astype(dtype)


def _float_dtype(a: np.ndarray) -> np.dtype:
    if a.dtype not in (np.float32, np.float64):
        raise KernelError(f"the numpy reference needs float32 or float64, got {a.dtype}")
    return a.dtype


def _blocks(x: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """``x`` zero-padded and cut into chunks: ``(n_chunks, *block)``."""
    core = np.zeros((layout.batch, *layout.padded), dtype=x.dtype)
    core[(slice(None), *(slice(0, n) for n in layout.core))] = x.reshape(layout.batch, *layout.core)
    if len(layout.block) == 1:
        return core.reshape(layout.n_chunks, layout.block[0])
    (gr, gc), (br, bc) = layout.grid, layout.block
    return core.reshape(layout.batch, gr, br, gc, bc).transpose(0, 1, 3, 2, 4).reshape(-1, br, bc)


def dct_chunks(x: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """``(n_chunks, chunk_numel)`` DCT coefficients of ``x`` (shape ``layout.shape``)."""
    dt = _float_dtype(np.asarray(x))
    if tuple(np.shape(x)) != layout.shape:
        raise KernelError(f"tensor has shape {np.shape(x)}, the layout expects {layout.shape}")
    blocks = _blocks(np.asarray(x, dtype=np.float64), layout)
    if len(layout.block) == 1:
        out = np.einsum("kj,nj->nk", dct_basis(layout.block[0]), blocks)
    else:
        dr, dc = (dct_basis(b) for b in layout.block)
        out = np.einsum("ui,nij,vj->nuv", dr, blocks, dc)
    result: np.ndarray = out.reshape(layout.n_chunks, layout.chunk_numel).astype(dt)
    return result


def idct_chunks(c: np.ndarray, layout: ChunkLayout) -> np.ndarray:
    """Inverse of :func:`dct_chunks`: a tensor of ``layout.shape``."""
    dt = _float_dtype(np.asarray(c))
    if np.shape(c) != (layout.n_chunks, layout.chunk_numel):
        raise KernelError(
            f"coefficients have shape {np.shape(c)}, expected {layout.n_chunks, layout.chunk_numel}"
        )
    c64 = np.asarray(c, dtype=np.float64)
    if len(layout.block) == 1:
        core = np.einsum("kj,nk->nj", dct_basis(layout.block[0]), c64).reshape(layout.batch, -1)
    else:
        (gr, gc), (br, bc) = layout.grid, layout.block
        dr, dc = (dct_basis(b) for b in layout.block)
        blocks = np.einsum("ui,nuv,vj->nij", dr, c64.reshape(-1, br, bc), dc)
        core = blocks.reshape(layout.batch, gr, gc, br, bc).transpose(0, 1, 3, 2, 4)
        core = core.reshape(layout.batch, *layout.padded)
    core = core[(slice(None), *(slice(0, n) for n in layout.core))]
    result: np.ndarray = core.reshape(layout.shape).astype(dt)
    return result


def topk_chunks(c: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(idx, val)``: the ``k`` largest-|c| entries per row, indices sorted ascending."""
    if c.ndim != 2 or not 1 <= k <= c.shape[1]:
        raise KernelError(f"need 2-D coefficients and 1 <= k <= {c.shape[-1]}, got {c.shape}, k={k}")
    order = np.argsort(-np.abs(c), axis=1, kind="stable")[:, :k]
    idx = np.sort(order, axis=1).astype(np.int64)
    return idx, np.take_along_axis(c, idx, axis=1)


def scatter_sum(layout: ChunkLayout, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Sum of all parts in coefficient space, float64 ``(n_chunks, chunk_numel)``."""
    buf = np.zeros((layout.n_chunks, layout.chunk_numel), dtype=np.float64)
    rows = np.arange(layout.n_chunks)[:, None]
    for idx, val in parts:
        if idx.shape != val.shape or idx.ndim != 2 or idx.shape[0] != layout.n_chunks:
            raise KernelError(f"idx {idx.shape} and val {val.shape} must both be ({layout.n_chunks}, k)")
        if idx.size and (idx.min() < 0 or idx.max() >= layout.chunk_numel):
            raise KernelError(f"an index is outside [0, {layout.chunk_numel})")
        np.add.at(buf, (np.broadcast_to(rows, idx.shape), idx), val)
    return buf


def decode_sum(layout: ChunkLayout, parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The float64 tensor of ``layout.shape`` that the sum of all parts encodes."""
    return idct_chunks(scatter_sum(layout, parts), layout)
