"""Where each tensor of a run's layout lives in ONE flat coefficient buffer, and its inverse.

:func:`decode.decode_flat` adds every decoded payload into that buffer and :func:`invert` turns
it into the dense tensors. Tensors of at most :data:`SMALL_COEFFICIENTS` coefficients sit side by
side with the other tensors of the same block shape: 1-D blocks in chunk order (one product
``C D`` for them all), 2-D blocks in spatial order, each tensor's ``(batch * padded rows, padded
cols)`` buffer stacked on the others of the same padded column count, so one ``mm`` by ``D_c``
and one batched ``D_r^T`` product invert the whole stack and every result is a view of it.
Larger tensors sit in spatial order too and get :func:`~distronet.kernels.dct.idct_spatial`.

Spatial order, not chunk order, for the small 2-D tensors: chunk order needs a permuted copy of
every result (``tensor_from_blocks``), about 2-3 ms of the 8.0 ms inverse of the 5.3M-parameter
Llama set (2 threads); in spatial order the inverse takes 6.1 ms. The products are
``idct_spatial``'s own (same ``(br, cp)`` per batched product, stacked only along rows), so each
tensor comes out bit for bit as :func:`decode.decode_sum` inverts it alone.
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
"""Tensors of at most this many coefficients are small: inverted together by block shape
(the sparse inverse's own size bound is :data:`decode_sparse.SPARSE_SMALL_COEFFICIENTS`)."""


@dataclass(frozen=True)
class _Run:
    """Small tensors of one 2-D block shape and padded column count ``cols``: their spatial
    buffers ``(batch * padded rows, cols)`` stacked from ``start``, ``rows`` rows in all."""

    start: int
    rows: int
    cols: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class _Group:
    """Small tensors of one block shape, ``n_chunks`` chunks in all, side by side from ``start``:
    1-D blocks in chunk order (``runs`` empty), 2-D blocks in spatial order, ``runs`` one after
    another (``members`` is theirs, in that order)."""

    block: tuple[int, ...]
    start: int
    n_chunks: int
    members: tuple[int, ...]
    runs: tuple[_Run, ...] = ()


@dataclass(frozen=True)
class BatchPlan:
    """Where each tensor of a run's layout lives in the flat coefficient buffer.

    ``offset[t]`` is tensor ``t``'s first element; ``chunk_base[t]`` (int64 ``(n_chunks,)``)
    the position of each of its chunks' coefficient 0, and ``local[t]`` (int64
    ``(chunk_numel,)``, tensors in spatial order: big ones and small 2-D ones) the offset of
    coefficient ``i`` from its chunk base; None for small 1-D ones (chunk order: ``i`` itself).
    ``groups``: the small tensors by block shape; ``big``: which tensors are not in a group.
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
        """(chunk bases of all tensors, each tensor's first row there, local tables of the tensors
        in spatial order, each one's first row there or -1): :func:`coding_jit_sum.scatter_flat`'s
        view."""
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
    by_block: dict[tuple[int, ...], dict[int, list[int]]] = {}  # block -> padded cols (2-D) -> tensors
    for t, lay in enumerate(layouts):
        if not big[t]:
            cols = lay.padded[1] if len(lay.block) > 1 else 0
            by_block.setdefault(lay.block, {}).setdefault(cols, []).append(t)
    offset = [0] * len(layouts)
    base: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(layouts)
    local: list[np.ndarray | None] = [None] * len(layouts)
    groups, pos = [], 0
    for block, by_cols in by_block.items():
        start, chunks, runs = pos, 0, []
        for cols, members in by_cols.items():
            run_start = pos
            for t in members:
                lay = layouts[t]
                offset[t] = pos
                if len(block) == 1:
                    base[t] = pos + lay.chunk_numel * np.arange(lay.n_chunks, dtype=np.int64)
                else:
                    b, loc = _spatial_tables(lay)
                    base[t], local[t] = pos + b, loc
                pos += lay.n_coefficients
                chunks += lay.n_chunks
            if len(block) > 1:
                runs.append(_Run(run_start, (pos - run_start) // cols, cols, tuple(members)))
        members = [t for ts in by_cols.values() for t in ts]
        groups.append(_Group(block, start, chunks, tuple(members), tuple(runs)))
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
    (``(plan.size,)``, laid out by ``plan``): one product per 1-D block shape, one pair per run
    of the small 2-D tensors (block shape and padded column count; each result a view of the
    run's fresh product, padding sliced off), the two-GEMM spatial inverse per big tensor.
    Results may share storage (disjoint views), never a scratch slot's.

    ``done``: tensors already decoded (by position), returned as given; a 1-D block shape or a
    2-D run all of whose tensors are done, and a big tensor that is, are not inverted."""
    out: list[torch.Tensor | None] = [None] * len(plan.layouts)
    for t, x in (done or {}).items():
        out[t] = x
    dt, dev = buf.dtype, buf.device
    for g in plan.groups:
        if len(g.block) > 1:
            _invert_runs(plan, g, buf, out)
            continue
        if all(out[t] is not None for t in g.members):
            continue
        # member by member: a product of few rows (a bias's 2) may take another BLAS kernel than
        # the same rows inside a taller one (AVX-512 MKL: last bits differ), and each member
        # must match ``decode_sum``'s own product bit for bit
        (b,) = g.block
        basis, rows = dct_basis(b, dt, dev), buf[g.start : g.start + g.n_chunks * b].view(g.n_chunks, b)
        x = torch.empty_like(rows)
        row = 0
        for t in g.members:
            lay = plan.layouts[t]
            if out[t] is None:
                torch.mm(rows[row : row + lay.n_chunks], basis, out=x[row : row + lay.n_chunks])
                out[t] = tensor_from_blocks(x[row : row + lay.n_chunks], lay)
            row += lay.n_chunks
    for t, lay in enumerate(plan.layouts):
        if plan.big[t] and out[t] is None:
            region = buf[plan.offset[t] : plan.offset[t] + lay.n_coefficients]
            spatial = (lay.grid[0], lay.block[0]) if len(lay.block) == 1 else (lay.batch, *lay.padded)
            out[t] = idct_spatial(region.view(spatial), lay)
    return [x for x in out if x is not None]


def _invert_runs(plan: BatchPlan, g: _Group, buf: torch.Tensor, out: list[torch.Tensor | None]) -> None:
    """The small 2-D tensors of ``g`` into ``out`` (those still None): per run, ``idct_spatial``'s
    two products over the whole stack, the second into a fresh tensor that the results view."""
    dt, dev = buf.dtype, buf.device
    br, bc = g.block
    for run in g.runs:
        if all(out[t] is not None for t in run.members):
            continue
        region = buf[run.start : run.start + run.rows * run.cols]
        z = scratch(0, (run.rows * run.cols // bc, bc), dt, dev)
        torch.mm(region.view(-1, bc), dct_basis(bc, dt, dev), out=z)
        x = torch.matmul(dct_basis(br, dt, dev).T, z.view(run.rows // br, br, run.cols))
        x = x.view(run.rows, run.cols)
        row = 0
        for t in run.members:
            lay = plan.layouts[t]
            rows = lay.batch * lay.padded[0]
            if out[t] is None:
                y = x[row : row + rows].view(lay.batch, *lay.padded)
                if lay.is_padded:
                    y = y[:, : lay.core[0], : lay.core[1]]
                out[t] = y.reshape(lay.shape)
            row += rows
