"""Index coding for per-chunk top-k positions (pure numpy, vectorised).

FIXED: every index in ``W = bitlen(chunk_numel - 1)`` bits (the minimal fixed width).
ENTROPY: positions are renumbered by a per-tensor *rank map* (identity, transpose or diagonal
order of the s x s block) so low frequencies get small ranks; each chunk's sorted ranks become
gaps, sent with the adaptive bucket code or a Rice code (``coding_bucket``) whose parameters
are shared by all tensors of one chunk size in a payload: class A (each chunk's first gap) and
class B (the others) have their own. A tensor whose gaps would cost more than FIXED falls back to
a fixed-width body. The byte-exact definition is docs/protocol-payload.md.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import BitReader
from distronet.kernels.coding_bucket import (
    Part,
    best_params,
    buckets_of,
    class_parts,
    class_values,
    finish_class,
    start_class,
)
from distronet.protocol.errors import RejectCode, Rejected

__all__ = [
    "MAX_CHUNK_NUMEL",
    "ClassParams",
    "IndexCode",
    "IndexCoding",
    "RankMap",
    "decode_indices",
    "encode_indices",
    "fixed_width",
    "index_parts",
    "rank_tables",
    "square_side",
]

#: Largest chunk supported: buckets (<= 15) must fit the 4-bit b0 parameter.
MAX_CHUNK_NUMEL = 1 << 15
_SAMPLE_CHUNKS = 64
"""Chunks per tensor the encoder looks at to choose a rank map (a tensor of under twice as many
is looked at whole). 64, not 512: the same bytes on the built-in GPT's and the Llama set's real
momentum at k = 4 and 32, and the Llama set's ENTROPY coding 3.05 -> 2.86 ms (machine D): at 512
every tensor of a model that size was planned under all three maps whole."""


class IndexCoding(enum.IntEnum):
    """How indices travel. Numbers are on the wire: never renumber."""

    FIXED = 1
    ENTROPY = 2


class RankMap(enum.IntEnum):
    """Renumbering of a chunk's positions before gap coding (ENTROPY only); 2 bits on the wire."""

    IDENTITY = 0  # rank = p
    TRANSPOSE = 1  # p = u*s + v  ->  rank = v*s + u   (s*s chunks only)
    DIAGONAL = 2  # ranks in order of (u + v, u)       (s*s chunks only)
    FALLBACK = 3  # a fixed-width body follows


@dataclass(frozen=True)
class ClassParams:
    """Bucket-code parameters of class A (first gaps) and class B (other gaps) for one chunk size."""

    b0_a: int = 0
    w_a: int = 0
    b0_b: int = 0
    w_b: int = 0


@dataclass(frozen=True)
class IndexCode:
    """One tensor's indices ready to be written: ``values`` are positions (FIXED/FALLBACK) or gaps."""

    rank_map: RankMap | None  # None: plain FIXED coding
    values: np.ndarray  # int64 (n, k)
    buckets: np.ndarray | None  # int64 (n, k) gap buckets (ENTROPY maps only)


def fixed_width(chunk_numel: int) -> int:
    """Bits per index under FIXED: ceil(log2(chunk_numel)), 0 for a one-element chunk."""
    return (chunk_numel - 1).bit_length()


def square_side(chunk_numel: int) -> int | None:
    """The side of a square chunk (``side * side == chunk_numel``), else None (no 2-D rank map)."""
    s = math.isqrt(chunk_numel)
    return s if s * s == chunk_numel else None


@functools.lru_cache(maxsize=32)
def rank_tables(chunk_numel: int, rank_map: RankMap) -> tuple[np.ndarray, np.ndarray]:
    """(rank_of_position, position_of_rank), int64 arrays of length chunk_numel."""
    p = np.arange(chunk_numel, dtype=np.int64)
    if rank_map == RankMap.IDENTITY:
        return p, p
    s = square_side(chunk_numel)
    assert s is not None
    u, v = np.divmod(p, s)
    if rank_map == RankMap.TRANSPOSE:
        rank = v * s + u
    else:
        rank = np.empty_like(p)
        rank[np.lexsort((u, u + v))] = p
    pos = np.empty_like(p)
    pos[rank] = p
    return rank, pos


def _sorted_ranks(
    idx: np.ndarray, chunk_numel: int, rank_map: RankMap
) -> tuple[np.ndarray, np.ndarray | None]:
    """(ranks ascending per chunk, order or None): ``ranks[i, j] = rank(idx[i, order[i, j]])``."""
    ranks = rank_tables(chunk_numel, rank_map)[0][idx]
    if rank_map == RankMap.IDENTITY:
        return ranks, None
    k = idx.shape[1]
    key = np.sort(ranks * k + np.arange(k), axis=1)  # one sort carries both rank and origin
    return key // k, key % k


def _gaps(ranks: np.ndarray) -> np.ndarray:
    """gap_j = r_j - r_{j-1} - 1 with r_{-1} = -1."""
    out: np.ndarray = np.diff(ranks, axis=1, prepend=-1) - 1
    return out


def _estimate(gaps: np.ndarray, bmax: int) -> int:
    b = buckets_of(gaps)
    return best_params(b[:, 0], bmax)[0] + best_params(b[:, 1:].reshape(-1), bmax)[0]


def encode_indices(
    idx: np.ndarray, chunk_numel: int, coding: IndexCoding
) -> tuple[IndexCode | None, np.ndarray | None]:
    """Prepare sorted, unique, in-range ``idx`` int64 (n, k) for the wire.

    Returns (code or None for a dense tensor, wire order or None for "as given"): values travel
    in ``take_along_axis(val, order, 1)``. ENTROPY picks the rank map that is cheapest on up to
    512 strided chunks and falls back to a fixed-width body when that is no larger.
    Cost O(n k log k).
    """
    if idx.shape[1] == chunk_numel:
        return None, None
    if coding == IndexCoding.FIXED:
        return IndexCode(None, idx, None), None
    bmax = fixed_width(chunk_numel)
    maps = [RankMap.IDENTITY]
    if square_side(chunk_numel) is not None:
        maps += [RankMap.TRANSPOSE, RankMap.DIAGONAL]
    sample = idx[:: max(1, idx.shape[0] // _SAMPLE_CHUNKS)] if len(maps) > 1 else idx
    costs = [_estimate(_gaps(_sorted_ranks(sample, chunk_numel, m)[0]), bmax) for m in maps]
    rank_map = maps[int(np.argmin(costs))]
    ranks, order = _sorted_ranks(idx, chunk_numel, rank_map)
    gaps = _gaps(ranks)
    if _estimate(gaps, bmax) >= idx.size * bmax:
        return IndexCode(RankMap.FALLBACK, idx, None), None
    return IndexCode(rank_map, gaps, buckets_of(gaps)), order


def index_parts(code: IndexCode, chunk_numel: int, params: ClassParams) -> list[Part]:
    """The bit fields of one tensor's index code, in wire order (params: its chunk size's)."""
    width = fixed_width(chunk_numel)
    head: list[Part] = []
    if code.rank_map is not None:
        head.append((np.array([int(code.rank_map)]), np.array([2])))
    if code.buckets is None:
        v = code.values.reshape(-1)
        return [*head, (v, np.full(v.size, width, dtype=np.int64))]
    n, k = code.values.shape
    p = params
    fa, ea, (va, wa) = class_parts(code.values[:, 0], p.b0_a, p.w_a, width)
    fb, eb, (vb, wb) = class_parts(code.values[:, 1:].reshape(-1), p.b0_b, p.w_b, width)
    mant_v = np.concatenate([va[:, None], vb.reshape(n, k - 1)], axis=1).reshape(-1)
    mant_w = np.concatenate([wa[:, None], wb.reshape(n, k - 1)], axis=1).reshape(-1)
    return [*head, fa, fb, ea, eb, (mant_v, mant_w)]


def _read_fixed(reader: BitReader, n: int, k: int, chunk_numel: int) -> np.ndarray:
    """FIXED body; INDEX_OUT_OF_RANGE, then DUPLICATE_INDEX, then MALFORMED (not ascending)."""
    idx = reader.fields(n * k, fixed_width(chunk_numel)).reshape(n, k)
    if idx.size and int(idx.max()) >= chunk_numel:
        raise Rejected(RejectCode.INDEX_OUT_OF_RANGE, f"index {int(idx.max())} >= chunk of {chunk_numel}")
    if (np.diff(idx, axis=1) <= 0).any():
        if (np.diff(np.sort(idx, axis=1), axis=1) == 0).any():
            raise Rejected(RejectCode.DUPLICATE_INDEX, "an index repeats within a chunk")
        raise Rejected(RejectCode.MALFORMED, "indices not in ascending order within a chunk")
    return idx


def decode_indices(
    reader: BitReader, coding: IndexCoding, n: int, k: int, chunk_numel: int, params: ClassParams | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read one tensor's indices: (idx int64 (n, k) ascending and unique per chunk, order or None).

    ``val_sorted = take_along_axis(val_wire, order, 1)`` pairs the sent values with ``idx``.
    The caller has checked 1 <= k <= chunk_numel <= MAX_CHUNK_NUMEL and n * k against limits.
    Raises Rejected (TRUNCATED, MALFORMED, INDEX_OUT_OF_RANGE, DUPLICATE_INDEX).
    """
    if k == chunk_numel:
        return np.broadcast_to(np.arange(k, dtype=np.int64), (n, k)).copy(), None
    if coding == IndexCoding.FIXED:
        return _read_fixed(reader, n, k, chunk_numel), None
    rank_map = RankMap(int(reader.fields(1, 2)[0]))
    if rank_map == RankMap.FALLBACK:
        return _read_fixed(reader, n, k, chunk_numel), None
    if rank_map != RankMap.IDENTITY and square_side(chunk_numel) is None:
        raise Rejected(RejectCode.MALFORMED, f"rank map {rank_map.name} for a chunk of {chunk_numel}")
    assert params is not None
    bmax, p = fixed_width(chunk_numel), params
    fa = start_class(reader, n, p.b0_a, p.w_a)
    fb = start_class(reader, n * (k - 1), p.b0_b, p.w_b)
    pa, wa = finish_class(reader, fa, p.b0_a, p.w_a, bmax)
    pb, wb = finish_class(reader, fb, p.b0_b, p.w_b, bmax)
    widths = np.concatenate([wa[:, None], wb.reshape(n, k - 1)], axis=1)
    mant = reader.varwidth(widths.reshape(-1)).reshape(n, k)
    gaps = np.concatenate(
        [
            class_values(pa, mant[:, 0], p.b0_a, p.w_a)[:, None],
            class_values(pb, mant[:, 1:].reshape(-1), p.b0_b, p.w_b).reshape(n, k - 1),
        ],
        axis=1,
    )
    ranks = np.cumsum(gaps + 1, axis=1) - 1
    if int(ranks[:, -1].max()) >= chunk_numel:
        raise Rejected(RejectCode.INDEX_OUT_OF_RANGE, f"index rank beyond a chunk of {chunk_numel}")
    idx = rank_tables(chunk_numel, rank_map)[1][ranks]
    if rank_map == RankMap.IDENTITY:
        return idx, None
    key = np.sort(idx * k + np.arange(k), axis=1)
    return key // k, key % k
