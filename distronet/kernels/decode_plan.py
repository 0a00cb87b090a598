"""Where each tensor of a run's layout lives in ONE flat coefficient buffer, and its inverse.

:func:`decode.decode_flat` adds every decoded payload into that buffer and :func:`invert` turns
it into the dense tensors: tensors of at most :data:`SMALL_COEFFICIENTS` coefficients sit in
chunk order, side by side with the other tensors of the same block shape, so one pair of matrix
products inverts them all (``X_n = D_r^T C_n D_c`` for every chunk ``n`` of the group); larger
tensors sit in spatial order and get the usual two-GEMM inverse
(:func:`~distronet.kernels.dct.idct_spatial`), with no chunk-order copy of a big buffer.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from distronet.kernels.dct import dct_basis, idct_spatial, tensor_from_blocks
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch

__all__ = ["SMALL_COEFFICIENTS", "BatchPlan", "invert", "plan_batch"]

SMALL_COEFFICIENTS = 1 << 20
"""Tensors of at most this many coefficients are small: chunk order, inverted by block shape
(the sparse inverse's own size bound is :data:`decode_sparse.SPARSE_SMALL_COEFFICIENTS`)."""


@dataclass(frozen=True)
class _Group:
    """Small tensors of one block shape, chunk order, side by side from ``start``."""

    block: tuple[int, ...]
    start: int
    n_chunks: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class BatchPlan:
    """Where each tensor of a run's layout lives in the flat coefficient buffer.

    ``offset[t]`` is tensor ``t``'s first element; ``chunk_base[t]`` (int64 ``(n_chunks,)``)
    the position of each of its chunks' coefficient 0, and ``local[t]`` (int64
    ``(chunk_numel,)``, big tensors only) the offset of coefficient ``i`` from its chunk base.
    """

    layouts: tuple[ChunkLayout, ...]
    size: int
    offset: tuple[int, ...]
    big: tuple[bool, ...]
    groups: tuple[_Group, ...]
    chunk_base: tuple[np.ndarray, ...]
    local: tuple[np.ndarray | None, ...]
    n_chunks: np.ndarray
    chunk_numel: np.ndarray

    @functools.cached_property
    def scatter_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(chunk bases of all tensors, each tensor's first row there, local tables of the big
        tensors, each one's first row there or -1): :func:`coding_jit_sum.scatter_flat`'s view."""
        cbase_at = np.cumsum([0] + [b.size for b in self.chunk_base])[:-1].astype(np.int64)
        locs = [loc for loc in self.local if loc is not None]
        sizes = [0 if loc is None else loc.size for loc in self.local]
        local_at = np.where([loc is None for loc in self.local], -1, np.cumsum([0, *sizes])[:-1])
        return (
            np.concatenate([*self.chunk_base, np.zeros(0, dtype=np.int64)]),
            cbase_at,
            np.concatenate([*locs, np.zeros(0, dtype=np.int64)]),
            local_at.astype(np.int64).reshape(-1),
        )

    def positions(self, tid: int, idx: np.ndarray) -> np.ndarray:
        """Flat buffer positions of tensor ``tid``'s chunk-order ``idx`` (n_chunks, k)."""
        local = self.local[tid]
        within = idx if local is None else local[idx]
        out: np.ndarray = self.chunk_base[tid][:, None] + within
        return out


def _spatial_tables(layout: ChunkLayout) -> tuple[np.ndarray, np.ndarray]:
    """(chunk base (n,), local (chunk_numel,)) of spatial-order positions (as ``dct.index_tables``)."""
    n = np.arange(layout.n_chunks, dtype=np.int64)
    i = np.arange(layout.chunk_numel, dtype=np.int64)
    if len(layout.block) == 1:
        return n * layout.block[0], i
    (_gr, gc), (br, bc) = layout.grid, layout.block
    return (n // gc) * (br * gc * bc) + (n % gc) * bc, (i // bc) * (gc * bc) + i % bc


@functools.lru_cache(maxsize=16)
def plan_batch(layouts: tuple[ChunkLayout, ...]) -> BatchPlan:
    """The buffer plan of a run's layouts (cached: a run has one layout). Cost O(total chunks)."""
    big = tuple(lay.n_coefficients > SMALL_COEFFICIENTS for lay in layouts)
    by_block: dict[tuple[int, ...], list[int]] = {}
    for t, lay in enumerate(layouts):
        if not big[t]:
            by_block.setdefault(lay.block, []).append(t)
    offset = [0] * len(layouts)
    base: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(layouts)
    local: list[np.ndarray | None] = [None] * len(layouts)
    groups, pos = [], 0
    for block, members in by_block.items():
        start, cn, chunks = pos, layouts[members[0]].chunk_numel, 0
        for t in members:
            offset[t] = pos
            base[t] = pos + cn * np.arange(layouts[t].n_chunks, dtype=np.int64)
            pos += layouts[t].n_coefficients
            chunks += layouts[t].n_chunks
        groups.append(_Group(block, start, chunks, tuple(members)))
    for t, lay in enumerate(layouts):
        if big[t]:
            b, loc = _spatial_tables(lay)
            offset[t], base[t], local[t] = pos, pos + b, loc
            pos += lay.n_coefficients
    return BatchPlan(
        layouts,
        pos,
        tuple(offset),
        big,
        tuple(groups),
        tuple(base),
        tuple(local),
        np.array([lay.n_chunks for lay in layouts], dtype=np.int64),
        np.array([lay.chunk_numel for lay in layouts], dtype=np.int64),
    )


def invert(
    plan: BatchPlan, buf: torch.Tensor, done: Mapping[int, torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The dense tensors (one per layout, ``layout.shape``) of the coefficient buffer ``buf``
    (``(plan.size,)``, laid out by ``plan``): one pair of matrix products per block shape of
    the small tensors, the two-GEMM spatial inverse per big one. Results may share storage.

    ``done``: tensors already decoded (by position), returned as given; a block shape all of
    whose tensors are done, and a big tensor that is, are not inverted."""
    out: list[torch.Tensor | None] = [None] * len(plan.layouts)
    for t, x in (done or {}).items():
        out[t] = x
    dt, dev = buf.dtype, buf.device
    for g in plan.groups:
        if all(out[t] is not None for t in g.members):
            continue
        region = buf[g.start : g.start + g.n_chunks * int(np.prod(g.block))]
        if len(g.block) == 1:  # member by member: a product of few rows (a bias's 2) may take
            # another BLAS kernel than the same rows inside a taller one (AVX-512 MKL: last bits
            # differ), and each member must match ``decode_sum``'s own product bit for bit
            basis, rows = dct_basis(g.block[0], dt, dev), region.view(g.n_chunks, g.block[0])
            x = torch.empty_like(rows)
            row = 0
            for t in g.members:
                n = plan.layouts[t].n_chunks
                torch.mm(rows[row : row + n], basis, out=x[row : row + n])
                row += n
        else:  # both products into scratch: each member's result is its own copy (below)
            br, bc = g.block
            z = scratch(0, (g.n_chunks * br, bc), dt, dev)
            torch.mm(region.view(g.n_chunks * br, bc), dct_basis(bc, dt, dev), out=z)
            x = scratch(2, (g.n_chunks, br, bc), dt, dev)
            torch.matmul(dct_basis(br, dt, dev).T, z.view(g.n_chunks, br, bc), out=x)
        row = 0
        for t in g.members:
            lay = plan.layouts[t]
            if out[t] is not None:
                row += lay.n_chunks
                continue
            y = tensor_from_blocks(x[row : row + lay.n_chunks], lay)
            if len(g.block) > 1 and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
                y = y.clone()  # a view of the scratch product (one column of chunks): never returned
            out[t] = y
            row += lay.n_chunks
    for t, lay in enumerate(plan.layouts):
        if plan.big[t] and out[t] is None:
            region = buf[plan.offset[t] : plan.offset[t] + lay.n_coefficients]
            spatial = (lay.grid[0], lay.block[0]) if len(lay.block) == 1 else (lay.batch, *lay.padded)
            out[t] = idct_spatial(region.view(spatial), lay)
    return [x for x in out if x is not None]
