"""Index coding for per-chunk top-k positions (pure numpy, vectorised).

FIXED: every index in ``bit_length(chunk_numel - 1)`` bits (the minimal fixed width).
ENTROPY: positions are renumbered by a per-tensor *rank map* (identity, transpose or diagonal
order of the s x s block) so low frequencies get small ranks, each chunk's sorted ranks become
gaps, and each gap is an Elias-style bucket (its bit length) plus mantissa bits. Buckets are
coded by a per-tensor adaptive code: a ``w``-bit field holding the bucket's place in a
centre-out order around a per-tensor mode ``b0``, with an escape to a unary extension. First
gaps and later gaps have separate (b0, w). Every stream is separate, so decoding is a handful
of whole-array numpy operations. The byte-exact definition is docs/protocol-payload.md.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import BitReader, pack_bits, pack_fields, unary_fields
from distronet.protocol.errors import RejectCode, Rejected

__all__ = [
    "MAX_CHUNK_NUMEL",
    "IndexCoding",
    "RankMap",
    "decode_indices",
    "encode_indices",
    "fixed_width",
    "max_index_section_len",
]

_MAX_FIELD_WIDTH = 4  # bucket field width w in 0..4
_HEADER_BYTES = 2  # 16 bits: rank map (2), class-0 b0 (4) and w (3), class-1 b0 (4) and w (3)
_FALLBACK = 3  # rank-map value meaning "fixed-width body follows"
_SAMPLE_CHUNKS = 512  # chunks the encoder looks at to choose a rank map
#: Largest chunk ENTROPY supports: buckets (<= 15) must fit the 4-bit b0 field.
MAX_CHUNK_NUMEL = 1 << 15


class IndexCoding(enum.IntEnum):
    """How indices travel. Numbers are on the wire: never renumber."""

    FIXED = 1
    ENTROPY = 2


class RankMap(enum.IntEnum):
    """Renumbering of a chunk's positions before gap coding (ENTROPY only)."""

    IDENTITY = 0  # rank = p
    TRANSPOSE = 1  # p = u*s + v  ->  rank = v*s + u   (s*s chunks only)
    DIAGONAL = 2  # ranks in order of (u + v, u)       (s*s chunks only)


def fixed_width(chunk_numel: int) -> int:
    """Bits per index under FIXED: ceil(log2(chunk_numel)), 0 for a one-element chunk."""
    return (chunk_numel - 1).bit_length()


def _side(chunk_numel: int) -> int | None:
    s = math.isqrt(chunk_numel)
    return s if s * s == chunk_numel else None


@functools.lru_cache(maxsize=32)
def _rank_tables(chunk_numel: int, rank_map: RankMap) -> tuple[np.ndarray, np.ndarray]:
    """(rank_of_position, position_of_rank), int64 arrays of length chunk_numel."""
    p = np.arange(chunk_numel, dtype=np.int64)
    if rank_map == RankMap.IDENTITY:
        return p, p
    s = _side(chunk_numel)
    assert s is not None
    u, v = np.divmod(p, s)
    if rank_map == RankMap.TRANSPOSE:
        rank = v * s + u
    else:
        order = np.lexsort((u, u + v))  # position of each rank
        rank = np.empty_like(p)
        rank[order] = p
    pos = np.empty_like(p)
    pos[rank] = p
    return rank, pos


def _bucket(g: np.ndarray) -> np.ndarray:
    """Bit length of each non-negative gap (0 for 0), exact for gaps < 2**53 (frexp exponent)."""
    _, e = np.frexp(g.astype(np.float64))
    return e.astype(np.int64)


@functools.lru_cache(maxsize=256)
def _centre_out(b0: int, bmax: int) -> np.ndarray:
    """Buckets 0..bmax in order b0, b0+1, b0-1, b0+2, b0-2, ... (skipping those outside)."""
    order = [b0]
    for d in range(1, bmax + 1):
        order += [b for b in (b0 + d, b0 - d) if 0 <= b <= bmax]
    return np.array(order, dtype=np.int64)


@functools.lru_cache(maxsize=32)
def _place_costs(bmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(orders (b0, place) -> bucket, costs (w, place) -> bits of field + escape)."""
    orders = np.stack([_centre_out(b0, bmax) for b0 in range(bmax + 1)])
    rho = np.arange(bmax + 1)
    costs = np.stack(
        [w + np.where(rho < (1 << w) - 1, 0, rho - (1 << w) + 2) for w in range(_MAX_FIELD_WIDTH + 1)]
    )
    return orders, costs


def _best_params(hist: np.ndarray) -> tuple[int, int, int]:
    """(bits of fields + escapes, b0, w) minimising the cost of a bucket histogram."""
    orders, costs = _place_costs(hist.size - 1)
    total = hist[orders] @ costs.T  # (b0, w)
    b0, w = np.unravel_index(int(np.argmin(total)), total.shape)
    return int(total[b0, w]), int(b0), int(w)


def _sorted_ranks(
    idx: np.ndarray, chunk_numel: int, rank_map: RankMap
) -> tuple[np.ndarray, np.ndarray | None]:
    """(ranks ascending per chunk, order or None): ``ranks[i, j] = rank(idx[i, order[i, j]])``."""
    ranks = _rank_tables(chunk_numel, rank_map)[0][idx]
    if rank_map == RankMap.IDENTITY:
        return ranks, None
    k = idx.shape[1]
    key = np.sort(ranks * k + np.arange(k), axis=1)  # one sort carries both rank and origin
    return key // k, key % k


def _gap_buckets(ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gaps, buckets): gap_j = r_j - r_{j-1} - 1 with r_{-1} = -1."""
    gaps = np.diff(ranks, axis=1, prepend=-1) - 1
    return gaps, _bucket(gaps)


def _class_cost(buckets: np.ndarray, bmax: int) -> tuple[int, int, int]:
    """(bits, b0, w) of one class of buckets under its best parameters, mantissas included."""
    if buckets.size == 0:
        return 0, 0, 0
    hist = np.bincount(buckets, minlength=bmax + 1)
    cost, b0, w = _best_params(hist)
    return cost + int((hist[2:] * np.arange(1, bmax)).sum()), b0, w


def _code_class(
    buckets: np.ndarray, bmax: int, b0: int, w: int
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((values, widths) of the fields, (values, widths) of the escapes) of one class of buckets."""
    place = np.empty(bmax + 1, dtype=np.int64)
    place[_centre_out(b0, bmax)] = np.arange(bmax + 1)
    rho = place[buckets]
    lim = (1 << w) - 1
    fields = (np.minimum(rho, lim), np.full(rho.size, w, dtype=np.int64))
    return fields, unary_fields(rho[rho >= lim] - lim)


def _encode_entropy(
    idx: np.ndarray, chunk_numel: int, fixed_bits: int
) -> tuple[bytes, np.ndarray | None] | None:
    """(section, wire order) under the cheapest rank map, or None when ``fixed_bits`` is no more."""
    maps = [RankMap.IDENTITY]
    if _side(chunk_numel) is not None:
        maps += [RankMap.TRANSPOSE, RankMap.DIAGONAL]
    bmax = fixed_width(chunk_numel)
    # the map is chosen on at most ~_SAMPLE_CHUNKS evenly strided chunks (cost only, not correctness)
    sample = idx[:: max(1, idx.shape[0] // _SAMPLE_CHUNKS)] if len(maps) > 1 else idx
    best: tuple[int, RankMap, int, int, int, int] | None = None
    for m in maps:
        _, b = _gap_buckets(_sorted_ranks(sample, chunk_numel, m)[0])
        c0, b00, w0 = _class_cost(b[:, 0], bmax)
        c1, b01, w1 = _class_cost(b[:, 1:].reshape(-1), bmax)
        if best is None or c0 + c1 < best[0]:
            best = (c0 + c1, m, b00, w0, b01, w1)
    assert best is not None
    rank_map = best[1]
    ranks, order = _sorted_ranks(idx, chunk_numel, rank_map)
    gaps, b = _gap_buckets(ranks)
    if sample is not idx:
        c0, b00, w0 = _class_cost(b[:, 0], bmax)
        c1, b01, w1 = _class_cost(b[:, 1:].reshape(-1), bmax)
        best = (c0 + c1, rank_map, b00, w0, b01, w1)
    total, _, b00, w0, b01, w1 = best
    if total >= fixed_bits:
        return None
    f0, e0 = _code_class(b[:, 0], bmax, b00, w0)
    f1, e1 = _code_class(b[:, 1:].reshape(-1), bmax, b01, w1)
    width = np.maximum(b - 1, 0).reshape(-1)
    mant = (gaps.reshape(-1) & ((np.int64(1) << width) - 1), width)
    parts = [f0, f1, e0, e1, mant]
    body = pack_bits(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    header = (int(rank_map) << 14) | (((b00 << 3) | w0) << 7) | ((b01 << 3) | w1)
    return header.to_bytes(2, "big") + body, order


def encode_indices(idx: np.ndarray, chunk_numel: int, coding: IndexCoding) -> tuple[bytes, np.ndarray | None]:
    """Code sorted, unique, in-range ``idx`` int64 (n_chunks, k), chunk_numel <= MAX_CHUNK_NUMEL.

    Returns (section bytes, wire order (n_chunks, k) or None for "as given"): values travel in
    ``take_along_axis(val, order, 1)``. ENTROPY picks the cheapest rank map and falls back to a
    fixed-width body when that is no larger; a dense tensor (k == chunk_numel) has an empty
    section. Cost O(n_chunks * k * log k).
    """
    k = idx.shape[1]
    if k == chunk_numel:
        return b"", None
    width = fixed_width(chunk_numel)
    if coding == IndexCoding.ENTROPY:
        coded = _encode_entropy(idx, chunk_numel, idx.size * width + 8)
        if coded is not None:
            return coded
    fixed = pack_fields(idx.reshape(-1), width)
    if coding == IndexCoding.FIXED:
        return fixed, None
    return (_FALLBACK << 14).to_bytes(2, "big") + fixed, None


def max_index_section_len(coding: IndexCoding, count: int, chunk_numel: int) -> int:
    """Upper bound on a valid index section's bytes for ``count`` indices (checked before decoding)."""
    bmax = fixed_width(chunk_numel)
    if coding == IndexCoding.FIXED:
        return (count * bmax + 7) // 8
    return _HEADER_BYTES + max((count * bmax + 7) // 8, (count * (_MAX_FIELD_WIDTH + 2 * bmax + 1) + 7) // 8)


def _decode_fixed(section: bytes, n: int, k: int, chunk_numel: int) -> np.ndarray:
    reader = BitReader(section, "fixed-width index section")
    idx = reader.fields(n * k, fixed_width(chunk_numel)).reshape(n, k)
    reader.finish()
    _check_fixed(idx, chunk_numel)
    return idx


@dataclass(frozen=True)
class _ClassParams:
    b0: int
    w: int


def _read_params(bits7: int, bmax: int) -> _ClassParams:
    p = _ClassParams(bits7 >> 3, bits7 & 7)
    if p.w > _MAX_FIELD_WIDTH or p.b0 > bmax:
        raise Rejected(RejectCode.MALFORMED, f"index code parameters b0={p.b0} w={p.w} (bmax {bmax})")
    return p


def _read_buckets(reader: BitReader, fields: np.ndarray, p: _ClassParams, bmax: int) -> np.ndarray:
    """Complete one class's bucket places from its escape stream; buckets int64."""
    lim = (1 << p.w) - 1
    esc = fields >= lim
    rho = fields.copy()
    rho[esc] = lim + reader.unary(int(esc.sum()), max(bmax - lim, 0))
    if rho.size and int(rho.max()) > bmax:
        raise Rejected(RejectCode.MALFORMED, "index bucket code beyond the largest bucket")
    out: np.ndarray = _centre_out(p.b0, bmax)[rho]
    return out


def _decode_entropy(section: bytes, n: int, k: int, chunk_numel: int) -> tuple[np.ndarray, np.ndarray | None]:
    if len(section) < _HEADER_BYTES:
        raise Rejected(RejectCode.TRUNCATED, "index section shorter than its parameters")
    bmax = fixed_width(chunk_numel)
    header = int.from_bytes(section[:_HEADER_BYTES], "big")
    map_code = header >> 14
    if map_code == _FALLBACK:
        if header != _FALLBACK << 14:
            raise Rejected(RejectCode.MALFORMED, "fixed-width fallback with non-zero parameters")
        return _decode_fixed(section[_HEADER_BYTES:], n, k, chunk_numel), None
    if map_code != RankMap.IDENTITY and _side(chunk_numel) is None:
        raise Rejected(RejectCode.MALFORMED, f"rank map {map_code} for a chunk of {chunk_numel}")
    rank_map = RankMap(map_code)
    p0, p1 = _read_params((header >> 7) & 0x7F, bmax), _read_params(header & 0x7F, bmax)
    reader = BitReader(section[_HEADER_BYTES:], "entropy index section")
    f0 = reader.fields(n, p0.w)
    f1 = reader.fields(n * (k - 1), p1.w)
    b0 = _read_buckets(reader, f0, p0, bmax)
    b1 = _read_buckets(reader, f1, p1, bmax)
    b = np.concatenate([b0[:, None], b1.reshape(n, k - 1)], axis=1).reshape(-1)
    width = np.maximum(b - 1, 0)
    mant = reader.varwidth(width)
    reader.finish()
    gaps = np.where(b >= 1, (np.int64(1) << np.maximum(b - 1, 0)) + mant, 0).reshape(n, k)
    ranks = np.cumsum(gaps + 1, axis=1) - 1
    if ranks[:, -1].max() >= chunk_numel:
        raise Rejected(RejectCode.INDEX_OUT_OF_RANGE, f"index rank beyond chunk of {chunk_numel}")
    idx = _rank_tables(chunk_numel, rank_map)[1][ranks]
    if rank_map == RankMap.IDENTITY:
        return idx, None
    key = np.sort(idx * k + np.arange(k), axis=1)
    return key // k, key % k


def _check_fixed(idx: np.ndarray, chunk_numel: int) -> None:
    if idx.size and int(idx.max()) >= chunk_numel:
        raise Rejected(RejectCode.INDEX_OUT_OF_RANGE, f"index {int(idx.max())} >= chunk of {chunk_numel}")
    d = np.diff(idx, axis=1)
    if (d <= 0).any():
        srt = np.sort(idx, axis=1)
        if (np.diff(srt, axis=1) == 0).any():
            raise Rejected(RejectCode.DUPLICATE_INDEX, "an index repeats within a chunk")
        raise Rejected(RejectCode.MALFORMED, "indices not in ascending order within a chunk")


def decode_indices(
    section: bytes, coding: IndexCoding, n: int, k: int, chunk_numel: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """(idx int64 (n, k) ascending and unique per chunk, order or None for "as sent").

    ``val_sorted = take_along_axis(val_wire, order, 1)`` pairs the sent values with ``idx``.

    The caller has checked 1 <= k <= chunk_numel and len(section) <= max_index_section_len.
    Raises Rejected (TRUNCATED, MALFORMED, INDEX_OUT_OF_RANGE, DUPLICATE_INDEX).
    """
    if k == chunk_numel:
        if section:
            raise Rejected(RejectCode.MALFORMED, "a dense tensor carries no index section")
        return np.broadcast_to(np.arange(k, dtype=np.int64), (n, k)).copy(), None
    if coding == IndexCoding.ENTROPY:
        return _decode_entropy(section, n, k, chunk_numel)
    return _decode_fixed(section, n, k, chunk_numel), None
