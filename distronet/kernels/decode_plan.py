"""Where each tensor of a run's layout lives in ONE flat buffer, and the rest of its inverse.

:func:`decode.decode_flat` writes the first product of the inverse of every decoded payload's sum
into that buffer (``Z = Y D_c``, built from the entries: :mod:`decode_jit`, ``dct.spread_rows``)
and :func:`invert` finishes it into the dense tensors. Tensors of at most
:data:`SMALL_COEFFICIENTS` coefficients sit side by side with the other tensors of the same block
shape: 1-D blocks in chunk order (their first product is the whole inverse), 2-D blocks in
spatial order, each tensor's ``(batch * padded rows, padded cols)`` buffer stacked on the others
of the same padded column count, so one batched ``D_r^T`` product finishes the whole stack and
every result is a view of it. Larger tensors sit in spatial order too and get
:func:`~distronet.kernels.dct.idct_rows` alone.

Spatial order, not chunk order, for the small 2-D tensors: chunk order needs a permuted copy of
every result (``tensor_from_blocks``), about 2-3 ms of the 8.0 ms inverse of the 5.3M-parameter
Llama set (2 threads). The products are ``idct_rows``' own (same ``(br, cp)`` per batched
product, stacked only along rows), so each tensor comes out bit for bit as
:func:`decode.decode_sum` inverts it alone.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distronet.kernels.dct import basis_numpy, dct_basis, idct_rows
from distronet.kernels.layout import ChunkLayout

__all__ = ["SMALL_COEFFICIENTS", "BatchPlan", "invert", "plan_batch"]

SMALL_COEFFICIENTS = 1 << 20
"""Tensors of at most this many coefficients are small: inverted together by block shape
(the sparse inverse's own size bound is :data:`decode_sparse.SPARSE_SMALL_COEFFICIENTS`)."""


_SpreadTables = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
]  # fmt: skip


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
    def block_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Per tensor, its block rows (a tensor of 1-D blocks, in chunk order, counts as one) and
        the floats of one: how :func:`decode_jit.spread_flat` walks its region."""
        one_d = [len(lay.block) == 1 for lay in self.layouts]
        rows = [1 if o else lay.batch * lay.grid[0] for o, lay in zip(one_d, self.layouts, strict=True)]
        size = [
            lay.n_coefficients if o else lay.block[0] * lay.padded[1]
            for o, lay in zip(one_d, self.layouts, strict=True)
        ]
        return np.array(rows, dtype=np.int64).reshape(-1), np.array(size, dtype=np.int64).reshape(-1)

    @functools.cached_property
    def spread_tables(self) -> _SpreadTables:
        """:func:`decode_jit.spread_flat`'s view of the plan, per tensor: region start, floats a
        block row, chunks a block row, row width, its basis's start in the basis table; then that
        table (every width's float32 basis, flat), the chunk bases of all tensors, each tensor's
        first one there, the local tables of the tensors in spatial order, each one's first there
        or -1."""
        cpr = [lay.n_chunks if len(lay.block) == 1 else lay.grid[1] for lay in self.layouts]
        width = [lay.block[-1] for lay in self.layouts]
        at: dict[int, int] = {}
        for w in width:
            at.setdefault(w, sum(x * x for x in at))
        basis = [basis_numpy(w).astype(np.float32).reshape(-1) for w in at]
        cbase_at = np.cumsum([0] + [b.size for b in self.chunk_base])[:-1]
        locs = [loc for loc in self.local if loc is not None]
        sizes = [0 if loc is None else loc.size for loc in self.local]
        local_at = np.where([loc is None for loc in self.local], -1, np.cumsum([0, *sizes])[:-1])
        region, cpr_a, width_a, basis_at = (
            np.array(a, dtype=np.int64).reshape(-1) for a in (self.offset, cpr, width, [at[w] for w in width])
        )
        return (
            region,
            self.block_rows[1],
            cpr_a,
            width_a,
            basis_at,
            np.concatenate([*basis, np.zeros(0, dtype=np.float32)]),
            np.concatenate([*self.chunk_base, np.zeros(0, dtype=np.int64)]),
            cbase_at.astype(np.int64),
            np.concatenate([*locs, np.zeros(0, dtype=np.int64)]),
            local_at.astype(np.int64).reshape(-1),
        )

    def spread_pieces(self, need: Sequence[bool], pieces: int) -> list[np.ndarray]:
        """The block rows of the tensors ``need`` names as at most ``pieces`` lists of ``(tensor,
        first block row, end)`` (int64 ``(m, 3)``), about equal in floats, in buffer order."""
        rows, size = self.block_rows
        todo = [t for t in range(len(self.layouts)) if need[t]]
        total = sum(int(rows[t] * size[t]) for t in todo)
        target = max(1, -(-total // max(1, pieces)))
        out: list[np.ndarray] = []
        cur: list[tuple[int, int, int]] = []
        filled = 0
        for t in todo:
            r = 0
            while r < rows[t]:
                take = max(1, min(int(rows[t]) - r, (target - filled) // int(size[t])))
                cur.append((t, r, r + take))
                r, filled = r + take, filled + take * int(size[t])
                if filled >= target:
                    out.append(np.array(cur, dtype=np.int64).reshape(-1, 3))
                    cur, filled = [], 0
        if cur:
            out.append(np.array(cur, dtype=np.int64).reshape(-1, 3))
        return out

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
    plan: BatchPlan, z: torch.Tensor, done: Mapping[int, torch.Tensor] | None = None
) -> list[torch.Tensor]:
    """The dense tensors (one per layout, ``layout.shape``) of the flat buffer ``z``
    (``(plan.size,)``, laid out by ``plan``) holding the first product of their inverse: a copy
    per tensor of 1-D blocks, one ``D_r^T`` product per run of the small 2-D tensors (block shape
    and padded column count; each result a view of the run's fresh product, padding sliced off),
    :func:`~distronet.kernels.dct.idct_rows` per big tensor. Results never share ``z``'s storage.

    ``done``: tensors already decoded (by position), returned as given; a 2-D run all of whose
    tensors are done, and any other done tensor, is not inverted (its region is not read)."""
    out: list[torch.Tensor | None] = [None] * len(plan.layouts)
    for t, x in (done or {}).items():
        out[t] = x
    for g in plan.groups:
        if len(g.block) > 1:
            _invert_runs(plan, g, z, out)
            continue
        if any(out[t] is None for t in g.members):  # the first product is the inverse: a copy
            region = z[g.start : g.start + g.n_chunks * g.block[0]].clone()
            for t, x in zip(g.members, split_1d(plan, g.members, region), strict=True):
                out[t] = x if out[t] is None else out[t]
    for t, lay in enumerate(plan.layouts):
        if plan.big[t] and out[t] is None:
            out[t] = idct_rows(z[plan.offset[t] : plan.offset[t] + lay.n_coefficients], lay)
    return [x for x in out if x is not None]


def split_1d(plan: BatchPlan, members: Sequence[int], flat: torch.Tensor) -> list[torch.Tensor]:
    """Tensors ``members`` (1-D blocks, chunk order, side by side in ``flat``) as views of it,
    padding dropped: one split for them all, a view per tensor only where its shape needs one."""
    sizes: list[int] = []
    for t in members:
        lay = plan.layouts[t]
        sizes += [lay.numel, lay.n_coefficients - lay.numel]
    pieces = flat.reshape(-1).split(sizes)
    out = []
    for j, t in enumerate(members):
        x, shape = pieces[2 * j], plan.layouts[t].shape
        out.append(x if tuple(x.shape) == shape else x.view(shape))
    return out


def _invert_runs(plan: BatchPlan, g: _Group, z: torch.Tensor, out: list[torch.Tensor | None]) -> None:
    """The small 2-D tensors of ``g`` into ``out`` (those still None): per run, ``idct_rows``'
    product over the whole stack, into a fresh tensor that the results view."""
    br = g.block[0]
    for run in g.runs:
        if all(out[t] is not None for t in run.members):
            continue
        region = z[run.start : run.start + run.rows * run.cols]
        d_r = dct_basis(br, z.dtype, z.device)
        x = torch.matmul(d_r.T, region.view(run.rows // br, br, run.cols)).view(run.rows, run.cols)
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
