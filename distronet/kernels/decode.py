"""Coefficients to dense tensors: one tensor's packets (:func:`decode_sum`), or every tensor of
every decoded payload at once (:func:`decode_flat`).

**One tensor** (:func:`decode_sum`).

A part is ``(idx, val)``: ``idx`` int64 ``(n_chunks, k)`` with every entry in
``[0, chunk_numel)``, ``val`` floating ``(n_chunks, k)``; ``k`` may differ between parts.
Entries at the same position (in one part or across parts) add up. Decoding is linear, so
``decode_sum(parts) == sum(decode_sum([p]) for p in parts)`` up to rounding.

Two inverses, chosen by the total ``K = sum(k)`` per chunk (see :func:`choose_method`):

* ``dense``: the first product of the inverse (``Z = Y D_c``) built from the entries, each adding
  ``val * D_c[v, :]`` into its row of a zeroed spatial-order buffer (``w`` multiply-adds an
  entry: ``dct.spread_rows``), then the second product ``D_r^T Z`` (one large batched product;
  nothing for 1-D blocks);
* ``sparse``: each chunk as a sum of ``K`` basis products, ``X_n = A_n^T B_n`` with
  ``A_n = val * D_r[u, :]`` and ``B_n = D_c[v, :]`` (one batched matrix product,
  ``2 * n_coefficients * K`` flops), then one copy into place.

On CUDA, ``index_add_`` accumulates with atomics, so the last bits of a sum may differ from run
to run; on CPU the result is deterministic. On CPU with float32 values, once the compiled
decoder is warm (:func:`jit_state.use_jit`), the entries land by one compiled loop per part
(:func:`decode_jit.spread_part`) instead of tensor operations: the same float32 products and
additions in the same order, so the result is bit-identical to the tensor path's
(``test_kernels_decode_fast.py``).

**Every tensor of every payload** (:func:`decode_flat`). A model has dozens of small tensors,
and per call fixed costs (stacking, range checks, a dozen tensor operations, an inverse per
tensor) would cost more than the arithmetic. A :class:`BatchPlan` (cached per run layout) gives
every tensor a region of ONE flat buffer: tensors of at most :data:`SMALL_COEFFICIENTS`
coefficients sit side by side with the other tensors of the same block shape, so one product
finishes them all; larger tensors get their own (:func:`~distronet.kernels.dct.idct_rows`). Once
the compiled decoder is warm, one compiled pass writes every region block row by block row
(zeroed, then every payload's entries of that block row added, payload by payload:
:func:`decode_jit.spread_flat`), so nothing is scattered or zeroed beforehand; else one
``index_add_`` per tensor and payload (``dct.spread_rows``). Both add entry by entry in payload
order, so results are bit-identical. Results may share one storage (disjoint views), so in-place
edits of one never touch another.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from distronet.kernels.coding_payload import FlatPayload
from distronet.kernels.dct import (
    basis_numpy,
    dct_basis,
    idct_rows,
    index_tables,
    spread_rows,
    tensor_from_blocks,
    work_dtype,
)
from distronet.kernels.decode_plan import SMALL_COEFFICIENTS, BatchPlan, invert, plan_batch
from distronet.kernels.decode_sparse import (
    SPARSE_MAX_K_BIG,
    SPARSE_MAX_K_SMALL,
    sparse_blocks,
    sparse_limit,
    sparse_tensors,
)
from distronet.kernels.fanout import map_in_order
from distronet.kernels.jit_state import use_jit
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = [
    "SMALL_COEFFICIENTS",
    "SPARSE_MAX_K_BIG",
    "SPARSE_MAX_K_SMALL",
    "BatchPlan",
    "Method",
    "Part",
    "choose_method",
    "decode_flat",
    "decode_flat_methods",
    "decode_sum",
    "plan_batch",
    "scatter_sum",
    "spread_entries",
]

Part = tuple[torch.Tensor, torch.Tensor]
Method = Literal["auto", "dense", "sparse"]

Group = tuple[torch.Tensor, torch.Tensor]
"""Parts of one ``k`` stacked: ``idx`` int64 ``(P, n_chunks, k)`` and ``val`` ``(P, n_chunks, k)``."""


def _check_shapes(layout: ChunkLayout, parts: Sequence[Part]) -> None:
    for i, (idx, val) in enumerate(parts):
        if idx.dtype != torch.int64:
            raise KernelError(f"part {i}: indices must be int64, got {idx.dtype}")
        if idx.dim() != 2 or idx.shape[0] != layout.n_chunks or tuple(val.shape) != tuple(idx.shape):
            raise KernelError(
                f"part {i}: idx {tuple(idx.shape)} and val {tuple(val.shape)} must both be "
                f"({layout.n_chunks}, k)"
            )
        work_dtype(val.dtype)


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack``; on CPU through numpy, a plain copy (measured: torch's CPU stack of 16
    packets' (4096, 32) indices took ~80x numpy's on a loaded 2-core machine)."""
    if len(tensors) == 1:
        return tensors[0].unsqueeze(0)
    if all(t.device.type == "cpu" and t.dtype != torch.bfloat16 for t in tensors):
        return torch.from_numpy(np.stack([t.detach().numpy() for t in tensors]))
    return torch.stack(tensors)


def _groups(layout: ChunkLayout, parts: Sequence[Part], dt: torch.dtype, dev: torch.device) -> list[Group]:
    """Parts stacked by ``k`` (usually one group), indices range-checked once per group.

    Few large tensor operations instead of several per part: per-operation overhead, not
    arithmetic, is what many small packets would otherwise cost.
    """
    by_k: dict[int, list[int]] = {}
    for i, (idx, _val) in enumerate(parts):
        by_k.setdefault(int(idx.shape[1]), []).append(i)
    groups = []
    for members in by_k.values():
        idx = _stack([parts[i][0] for i in members]).to(dev)
        val = _stack([parts[i][1] for i in members]).to(device=dev, dtype=dt)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= layout.chunk_numel):
            bad = next(
                i
                for i in members
                if int(parts[i][0].min()) < 0 or int(parts[i][0].max()) >= layout.chunk_numel
            )
            raise KernelError(f"part {bad}: an index is outside [0, {layout.chunk_numel})")
        groups.append((idx, val))
    return groups


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
    _check_shapes(layout, parts)
    dt, dev = _result_dtype(parts, dtype), _result_device(parts, device)
    buf = torch.zeros((layout.n_chunks, layout.chunk_numel), dtype=dt, device=dev)
    rows = torch.arange(layout.n_chunks, device=dev).unsqueeze(1) * layout.chunk_numel
    with torch.no_grad():
        for idx, val in _groups(layout, parts, dt, dev):
            buf.view(-1).scatter_add_(0, (rows + idx).reshape(-1), val.reshape(-1))
    return buf


def choose_method(layout: ChunkLayout, total_k: int) -> Literal["dense", "sparse"]:
    """The inverse ``auto`` uses for ``total_k`` coefficients per chunk (limits in
    :mod:`decode_sparse`)."""
    return "sparse" if total_k <= sparse_limit(layout) else "dense"


def _spatial_shape(layout: ChunkLayout) -> tuple[int, ...]:
    return (layout.grid[0], layout.block[0]) if len(layout.block) == 1 else (layout.batch, *layout.padded)


def _dense(layout: ChunkLayout, groups: Sequence[Group], dt: torch.dtype, dev: torch.device) -> torch.Tensor:
    z = scratch(1, _spatial_shape(layout), dt, dev).zero_()
    for idx, val in groups:
        spread_rows(z, layout, idx, val)
    return idct_rows(z, layout)


@functools.lru_cache(maxsize=256)
def _cpu_tables(layout: ChunkLayout) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dct.index_tables` on the CPU as numpy: (chunk base ``(n_chunks,)``, local
    ``(chunk_numel,)``)."""
    base, local = index_tables(layout, torch.device("cpu"))
    return base.reshape(-1).numpy(), local.numpy()


def _part_arrays(part: Part) -> tuple[np.ndarray, np.ndarray] | None:
    """A CPU float32 part as C-contiguous numpy (idx int64, val float32); None for any other
    (on a device, requiring grad, another dtype: the tensor path takes those)."""
    try:
        idx, val = part[0].numpy(), part[1].numpy()
    except (RuntimeError, TypeError):
        return None
    if val.dtype != np.float32:
        return None
    if not idx.flags.c_contiguous:
        idx = np.ascontiguousarray(idx)
    if not val.flags.c_contiguous:
        val = np.ascontiguousarray(val)
    return idx, val


def _dense_compiled(
    layout: ChunkLayout, parts: Sequence[Part], dt: torch.dtype, dev: torch.device
) -> torch.Tensor | None:
    """:func:`_dense` with the entries' loop compiled (module doc), bit-identical; None where it does not
    apply (not CPU float32, compiled code not loaded, an index out of range: the tensor path then
    decides, with its exact error). Parts are added in :func:`_groups`' order: by ``k`` in order of
    first appearance, then in part order."""
    if dev.type != "cpu" or dt != torch.float32 or not use_jit():
        return None
    by_k: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for part in parts:
        arrays = _part_arrays(part)
        if arrays is None:
            return None
        by_k.setdefault(arrays[0].shape[1], []).append(arrays)
    from distronet.kernels.decode_jit import spread_part

    z = scratch(1, _spatial_shape(layout), dt, dev)
    flat = z.view(-1).numpy()
    flat.fill(0.0)  # as _dense's zero_(), without a tensor operation's dispatch
    base, local = _cpu_tables(layout)
    w = layout.block[-1]
    basis = _basis_flat(w)
    for members in by_k.values():
        for idx, val in members:
            if not spread_part(flat, idx, val, base, local, w, basis):
                return None
    return idct_rows(z, layout)


@functools.lru_cache(maxsize=16)
def _basis_flat(w: int) -> np.ndarray:
    """The ``(w, w)`` float32 DCT basis, flat (what ``dct_basis`` holds, as numpy)."""
    out: np.ndarray = basis_numpy(w).astype(np.float32).reshape(-1)
    return out


def _sparse(layout: ChunkLayout, groups: Sequence[Group], dt: torch.dtype, dev: torch.device) -> torch.Tensor:
    bc = layout.block[-1]
    basis_c = dct_basis(bc, dt, dev)
    basis_r = dct_basis(layout.block[0], dt, dev)
    blocks: torch.Tensor | None = None
    for idx, val in groups:
        # (P, N, k) -> (N, P * k): every chunk's coefficients from every part, side by side.
        idx = idx.permute(1, 0, 2).reshape(layout.n_chunks, -1)
        val = val.permute(1, 0, 2).reshape(layout.n_chunks, -1)
        if blocks is None:  # the product decode_flat's sparse inverse makes (decode_sparse)
            blocks = sparse_blocks(layout.block, idx, val)
            continue
        n, kk = idx.shape
        # Chunk n = sum_j val_j * outer(D_r[u_j, :], D_c[v_j, :]) = A_n^T B_n (for 1-D: u_j = 0).
        if len(layout.block) == 1:
            a = val.unsqueeze(-1)  # (N, K, 1)
        else:
            a = (
                torch.index_select(basis_r, 0, (idx // bc).reshape(-1))
                .view(n, kk, -1)
                .mul_(val.unsqueeze(-1))
            )
        b = torch.index_select(basis_c, 0, (idx % bc).reshape(-1)).view(n, kk, bc)
        blocks.baddbmm_(a.transpose(1, 2), b)
    assert blocks is not None
    return tensor_from_blocks(blocks, layout)


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
    _check_shapes(layout, parts)
    dt, dev = _result_dtype(parts, dtype), _result_device(parts, device)
    if not parts:
        return torch.zeros(layout.shape, dtype=dt, device=dev)
    if method == "auto":
        method = choose_method(layout, sum(int(p[0].shape[1]) for p in parts))
    with torch.no_grad():
        if method == "dense":
            fast = _dense_compiled(layout, parts, dt, dev)
            if fast is not None:
                return fast
        groups = _groups(layout, parts, dt, dev)
        return (_sparse if method == "sparse" else _dense)(layout, groups, dt, dev)


def _spread_compiled(
    plan: BatchPlan, z: torch.Tensor, payloads: Sequence[FlatPayload], need: np.ndarray
) -> None:
    """Every region of ``z`` (CPU float32) that ``need`` names, written whole from every
    payload's entries, payload by payload (:func:`spread_entries`)."""
    n_t = len(plan.layouts)
    kk = np.zeros((len(payloads), n_t), dtype=np.int64)
    oo = np.zeros((len(payloads), n_t), dtype=np.int64)
    at = 0
    for p, flat in enumerate(payloads):
        kk[p, flat.tensor_ids] = flat.k
        oo[p, flat.tensor_ids] = at + flat.offsets[:-1]
        at += flat.idx.size
    idx = np.concatenate([np.zeros(0, np.int64), *(flat.idx for flat in payloads)], dtype=np.int64)
    val = np.concatenate([np.zeros(0, np.float32), *(flat.val for flat in payloads)], dtype=np.float32)
    spread_entries(plan, z, kk, oo, idx, val, need)


def spread_entries(
    plan: BatchPlan,
    z: torch.Tensor,
    kk: np.ndarray,
    oo: np.ndarray,
    idx: np.ndarray,
    val: np.ndarray,
    need: np.ndarray,
) -> None:
    """Every region of ``z`` (CPU float32, ``(plan.size,)``) that ``need`` (bool per tensor)
    names, written whole by :func:`decode_jit.spread_flat`: each block row summed from the
    entries of every packet ``p`` (``kk[p, t]`` a chunk of tensor ``t`` from ``oo[p, t]`` of
    ``idx``/``val``; int64 ``(P, T)`` each), packet by packet. Needs the compiled code warm; the
    caller checked the indices. Pieces of about equal size run on this thread and torch's other
    threads' worth of helpers (:func:`fanout.map_in_order`; the compiled loop holds no GIL); a
    piece run twice (the caller redoing one a helper has not finished) writes the same values."""
    from distronet.kernels.decode_jit import spread_flat

    out, tables = z.numpy(), plan.spread_tables
    threads = torch.get_num_threads()
    pieces = plan.spread_pieces(need.tolist(), SPREAD_PIECES_PER_THREAD * threads if threads > 1 else 1)
    longest = int(plan.block_rows[1].max(initial=0))

    def piece(i: int) -> None:
        spread_flat(out, _tile(longest), pieces[i], *tables, kk, oo, idx, val)

    map_in_order(piece, len(pieces), threads)


SPREAD_PIECES_PER_THREAD = 4
""":func:`_spread_compiled` cuts a round's block rows into this many pieces per torch thread."""

_tiles = threading.local()


def _tile(n: int) -> np.ndarray:
    """This thread's float32 scratch of at least ``n`` elements (kept: grown, never shrunk)."""
    tile: np.ndarray | None = getattr(_tiles, "tile", None)
    if tile is None or tile.size < n:
        tile = _tiles.tile = np.empty(max(n, 1), dtype=np.float32)
    return tile


def _spread_tensors(
    plan: BatchPlan, z: torch.Tensor, payloads: Sequence[FlatPayload], need: np.ndarray
) -> None:
    """:func:`_spread_compiled` by tensor operations (any device and dtype): ``z`` zeroed, then
    per tensor ``need`` names, each payload's entries by ``dct.spread_rows``, payload by payload."""
    z.zero_()
    dev, dt = z.device, z.dtype
    for flat in payloads:
        for j, tid in enumerate(flat.tensor_ids.tolist()):
            if not need[tid]:
                continue
            lay = plan.layouts[tid]
            a, b = int(flat.offsets[j]), int(flat.offsets[j + 1])
            shape = (int(flat.n[j]), int(flat.k[j]))
            idx = torch.from_numpy(flat.idx[a:b].reshape(shape)).to(dev)
            val = torch.from_numpy(flat.val[a:b].reshape(shape)).to(device=dev, dtype=dt)
            spread_rows(z[plan.offset[tid] : plan.offset[tid] + lay.n_coefficients], lay, idx, val)


def decode_flat(
    layouts: Sequence[ChunkLayout],
    payloads: Sequence[FlatPayload],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Sum of decoded payloads (``coding.decode_payload`` results against ``layouts``), per tensor.

    Returns one tensor per layout (zeros where no payload carries it). The payloads' indices were
    checked by the payload decoder; their ``(n_chunks, chunk_numel)`` must be the layouts'.
    Cost: one pass writing the first product of the inverse from all payloads' entries, one
    second product per block shape;
    tensors whose summed ``k`` is small are rebuilt from their coefficients instead
    (:mod:`decode_sparse`: one batched product per block shape).

    Raises:
        KernelError: a payload does not fit ``layouts``.
    """
    return decode_flat_methods(layouts, payloads, dtype=dtype, device=device)[0]


def decode_flat_methods(
    layouts: Sequence[ChunkLayout],
    payloads: Sequence[FlatPayload],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[list[torch.Tensor], list[Literal["dense", "sparse"]]]:
    """:func:`decode_flat`, and per tensor the inverse it took. A tensor inverted ``sparse`` here
    is bit for bit what :func:`decode_sum` gives (which then chooses ``sparse`` too); one
    inverted ``dense`` is, where :func:`choose_method` says ``dense`` for its summed ``k``."""
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
        live = [flat for flat in payloads if flat.idx.size]
        done = sparse_tensors(plan, live, dt, dev)
        methods: list[Literal["dense", "sparse"]] = [
            "sparse" if t in done else "dense" for t in range(len(layouts))
        ]
        if len(done) == len(layouts):
            return [done[t] for t in range(len(layouts))], methods
        need = np.array([t not in done for t in range(len(layouts))], dtype=np.bool_)
        z = scratch(1, (plan.size,), dt, dev)
        if dev.type == "cpu" and dt == torch.float32 and use_jit():
            _spread_compiled(plan, z, live, need)
        else:
            _spread_tensors(plan, z, live, need)
        return invert(plan, z, done), methods
