"""Decode every tensor of every packet in one pass: one scatter, one inverse per block shape.

:func:`~distronet.kernels.decode.decode_sum` decodes one tensor; a model has dozens of small
tensors, and per call fixed costs (stacking, range checks, a dozen tensor operations, an inverse
transform per tensor) then cost more than the arithmetic. Here a :class:`BatchPlan` (cached per
run layout) gives every tensor a region of ONE flat coefficient buffer:

* tensors of at most :data:`~distronet.kernels.decode.SMALL_COEFFICIENTS` coefficients sit in
  chunk order, side by side with the other tensors of the same block shape, so one pair of matrix
  products inverts them all (``X_n = D_r^T C_n D_c`` for every chunk ``n`` of the group);
* larger tensors sit in spatial order and get the usual two-GEMM inverse
  (:func:`~distronet.kernels.dct.idct_spatial`), with no chunk-order copy of a big buffer.

A packet's coefficients land by one compiled loop over its entries (chunk base plus index, or
the big tensors' spatial table; :func:`coding_jit_sum.scatter_flat`) once the compiled decoder
is warm (:func:`coding_fast.use_jit`), else by one ``index_add_``; both add entry by entry in
payload order, so results are bit-identical. Decoding P packets costs one zeroing and one
inverse per block shape plus P scatters: the per-packet cost is the scatter alone. The inverse
is always the dense one (two GEMMs per group): batched over all tensors it costs less than
per-tensor sparse products even for a single packet at small k.

Results are float32 (or ``dtype``) tensors of each layout's shape; the tensors of one call may
share one storage (disjoint views), so in-place edits of one never touch another.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distronet.kernels.coding_fast import use_jit
from distronet.kernels.coding_flat import FlatPayload
from distronet.kernels.dct import dct_basis, idct_spatial, work_dtype
from distronet.kernels.decode import SMALL_COEFFICIENTS, Part
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = ["BatchPlan", "decode_flat", "decode_sum_many", "plan_batch"]


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


_BASES: OrderedDict[tuple[int, bytes], np.ndarray] = OrderedDict()
_BASES_KEEP = 8


def _coefficient_base(plan: BatchPlan, flat: FlatPayload) -> np.ndarray:
    """Per coefficient of ``flat``, its chunk's base position (cached per packet structure)."""
    key = (id(plan), flat.structure)
    hit = _BASES.get(key)
    if hit is not None:
        _BASES.move_to_end(key)
        return hit
    bases = [plan.chunk_base[t] for t in flat.tensor_ids.tolist()]
    chunk_base = np.concatenate(bases) if bases else np.zeros(0, dtype=np.int64)
    out = np.repeat(chunk_base, np.repeat(flat.k, flat.n))
    _BASES[key] = out
    if len(_BASES) > _BASES_KEEP:
        _BASES.popitem(last=False)
    return out


def _flat_positions(plan: BatchPlan, flat: FlatPayload) -> np.ndarray:
    base = _coefficient_base(plan, flat)
    big = [(j, t) for j, t in enumerate(flat.tensor_ids.tolist()) if plan.local[t] is not None]
    if not big:
        out: np.ndarray = base + flat.idx
        return out
    pos = np.empty_like(base)
    edges = flat.offsets.tolist()
    last = 0
    for j, t in big:  # big tensors: spatial order inside a chunk
        a, b = edges[j], edges[j + 1]
        np.add(base[last:a], flat.idx[last:a], out=pos[last:a])
        local = plan.local[t]
        assert local is not None
        np.add(base[a:b], local[flat.idx[a:b]], out=pos[a:b])
        last = b
    np.add(base[last:], flat.idx[last:], out=pos[last:])
    return pos


def _invert(plan: BatchPlan, buf: torch.Tensor) -> list[torch.Tensor]:
    out: list[torch.Tensor | None] = [None] * len(plan.layouts)
    dt, dev = buf.dtype, buf.device
    for g in plan.groups:
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
            y = _from_chunks(x[row : row + lay.n_chunks], lay)
            if len(g.block) > 1 and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
                y = y.clone()  # a view of the scratch product (one column of chunks): never returned
            out[t] = y
            row += lay.n_chunks
    for t, lay in enumerate(plan.layouts):
        if plan.big[t]:
            region = buf[plan.offset[t] : plan.offset[t] + lay.n_coefficients]
            spatial = (lay.grid[0], lay.block[0]) if len(lay.block) == 1 else (lay.batch, *lay.padded)
            out[t] = idct_spatial(region.view(spatial), lay)
    return [x for x in out if x is not None]


def _from_chunks(x: torch.Tensor, lay: ChunkLayout) -> torch.Tensor:
    """Chunk-order decoded blocks ``(n, *block)`` to a tensor of ``lay.shape`` (padding dropped)."""
    if len(lay.block) == 1:
        return x.reshape(-1)[: lay.numel].reshape(lay.shape)
    (gr, gc), (br, bc) = lay.grid, lay.block
    x3 = x.view(lay.batch, gr, gc, br, bc).permute(0, 1, 3, 2, 4).reshape(lay.batch, *lay.padded)
    if lay.is_padded:
        r, c = lay.core
        x3 = x3[:, :r, :c]
    return x3.reshape(lay.shape)


def _buffer(plan: BatchPlan, dt: torch.dtype, dev: torch.device) -> torch.Tensor:
    return scratch(1, (plan.size,), dt, dev).zero_()


def _scatter_compiled(plan: BatchPlan, buf: torch.Tensor, payloads: Sequence[FlatPayload]) -> None:
    """Add every payload's entries into ``buf`` (CPU float32), payload by payload, compiled:
    the additions :func:`decode_flat`'s ``index_add_`` makes, in the same order, no copies."""
    from distronet.kernels.coding_jit_sum import scatter_flat

    out = buf.numpy()
    tables = plan.scatter_tables
    for flat in payloads:
        ids, n, k, offsets, idx = (
            np.ascontiguousarray(a, dtype=np.int64)
            for a in (flat.tensor_ids, flat.n, flat.k, flat.offsets, flat.idx)
        )
        scatter_flat(out, ids, n, k, offsets, idx, np.ascontiguousarray(flat.val, dtype=np.float32), *tables)


def decode_flat(
    layouts: Sequence[ChunkLayout],
    payloads: Sequence[FlatPayload],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Sum of decoded payloads (``decode_payload_flat`` results against ``layouts``), per tensor.

    Returns one tensor per layout (zeros where no payload carries it). The payloads' indices were
    checked by the payload decoder; their ``(n_chunks, chunk_numel)`` must be the layouts'.
    Cost: zeroing the buffer, one scatter of all payloads' entries, one inverse per block shape.

    Raises:
        KernelError: a payload does not fit ``layouts``.
    """
    plan = plan_batch(tuple(layouts))
    dt, dev = work_dtype(dtype), torch.device(device)
    checked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for flat in payloads:
        ids = flat.tensor_ids
        if any(ids is a and flat.n is b and flat.cn is c for a, b, c in checked):
            continue  # the same table arrays as a payload checked above (one plan, one structure)
        if ids.size and (
            int(ids[-1]) >= len(layouts)
            or not np.array_equal(plan.n_chunks[ids], flat.n)
            or not np.array_equal(plan.chunk_numel[ids], flat.cn)
        ):
            raise KernelError("a payload's tensors do not match the layouts")
        checked.append((ids, flat.n, flat.cn))
    with torch.no_grad():
        buf = _buffer(plan, dt, dev)
        live = [flat for flat in payloads if flat.idx.size]
        if live and dev.type == "cpu" and dt == torch.float32 and use_jit():
            _scatter_compiled(plan, buf, live)
            return _invert(plan, buf)
        if len(live) == 1:
            pos_np, val_np = _flat_positions(plan, live[0]), live[0].val
        elif live:  # one scatter for all: entries keep their order (packet by packet)
            pos_np = np.concatenate([_flat_positions(plan, flat) for flat in live])
            val_np = np.concatenate([flat.val for flat in live])
        if live:
            pos = torch.from_numpy(pos_np).to(dev)
            buf.index_add_(0, pos, torch.from_numpy(val_np).to(device=dev, dtype=dt))
        return _invert(plan, buf)


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
    :mod:`distronet.kernels.decode`). Equal to the per-tensor decode up to rounding.

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
        buf = _buffer(plan, dt, dev)
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
        return _invert(plan, buf)
