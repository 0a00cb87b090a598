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

from distronet.kernels.coding_bits import (
    check_padding,
    from_bytes,
    pack_fields,
    pack_unary,
    read_fields,
    read_unary,
    to_bytes,
)
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


def _best_params(hist: np.ndarray) -> tuple[int, int, int]:
    """(cost in bits, b0, w) minimising field + escape bits for a bucket histogram."""
    bmax = hist.size - 1
    best = (1 << 62, 0, 0)
    for b0 in range(bmax + 1):
        counts = hist[_centre_out(b0, bmax)]  # counts by place rho
        rho = np.arange(counts.size)
        for w in range(_MAX_FIELD_WIDTH + 1):
            lim = (1 << w) - 1
            cost = int((counts * (w + np.where(rho < lim, 0, rho - lim + 1))).sum())
            best = min(best, (cost, b0, w))
    return best


def _code_class(buckets: np.ndarray, bmax: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(7-bit params b0 << 3 | w, field bits, escape bits) for one class of gap buckets."""
    if buckets.size == 0:
        return 0, np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    _, b0, w = _best_params(np.bincount(buckets, minlength=bmax + 1))
    place = np.empty(bmax + 1, dtype=np.int64)
    place[_centre_out(b0, bmax)] = np.arange(bmax + 1)
    rho = place[buckets]
    lim = (1 << w) - 1
    fields = pack_fields(np.minimum(rho, lim), w)
    escapes = pack_unary(rho[rho >= lim] - lim)
    return (b0 << 3) | w, fields, escapes


def _mantissa_bits(g: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Low b-1 bits of each gap with b >= 2, MSB-first, concatenated in order."""
    width = np.maximum(b - 1, 0)
    total = int(width.sum())
    sym = np.repeat(np.arange(g.size), width)
    start = np.cumsum(width) - width
    j = np.arange(total) - start[sym]
    shift = (width[sym] - 1 - j).astype(np.uint64)
    out: np.ndarray = ((g[sym].astype(np.uint64) >> shift) & np.uint64(1)).astype(np.uint8)
    return out


def _entropy_candidate(idx: np.ndarray, chunk_numel: int, rank_map: RankMap) -> tuple[int, bytes, np.ndarray]:
    """(bits, section, wire order) coding ``idx`` under one rank map."""
    rank_of, _ = _rank_tables(chunk_numel, rank_map)
    ranks = rank_of[idx]
    if rank_map == RankMap.IDENTITY:
        order = np.broadcast_to(np.arange(idx.shape[1]), idx.shape)
    else:
        order = np.argsort(ranks, axis=1, kind="stable")
        ranks = np.take_along_axis(ranks, order, axis=1)
    gaps = np.diff(ranks, axis=1, prepend=-1) - 1
    b = _bucket(gaps)
    bmax = fixed_width(chunk_numel)
    p0, f0, e0 = _code_class(b[:, 0], bmax)
    p1, f1, e1 = _code_class(b[:, 1:].reshape(-1), bmax)
    mant = _mantissa_bits(gaps.reshape(-1), b.reshape(-1))
    bits = np.concatenate([f0, f1, e0, e1, mant])
    header = (int(rank_map) << 14) | (p0 << 7) | p1
    section = header.to_bytes(2, "big") + to_bytes(bits)
    return 8 * len(section), section, np.asarray(order)


def encode_indices(idx: np.ndarray, chunk_numel: int, coding: IndexCoding) -> tuple[bytes, np.ndarray]:
    """Code sorted, unique, in-range ``idx`` int64 (n_chunks, k), chunk_numel <= MAX_CHUNK_NUMEL.

    Returns (section bytes, wire order (n_chunks, k)): values travel in
    ``take_along_axis(val, order, 1)``. ENTROPY picks the cheapest rank map and falls back to a
    fixed-width body when that is smaller; a dense tensor (k == chunk_numel) has an empty
    section. Cost O(n_chunks * k * log k).
    """
    k = idx.shape[1]
    ident = np.broadcast_to(np.arange(k), idx.shape)
    if k == chunk_numel:
        return b"", ident
    width = fixed_width(chunk_numel)
    fixed = to_bytes(pack_fields(idx.reshape(-1), width))
    if coding == IndexCoding.FIXED:
        return fixed, ident
    maps = [RankMap.IDENTITY]
    if _side(chunk_numel) is not None:
        maps += [RankMap.TRANSPOSE, RankMap.DIAGONAL]
    best = min((_entropy_candidate(idx, chunk_numel, m) for m in maps), key=lambda c: c[0])
    if best[0] >= 8 * (len(fixed) + _HEADER_BYTES):
        return (_FALLBACK << 14).to_bytes(2, "big") + fixed, ident
    return best[1], best[2]


def max_index_section_len(coding: IndexCoding, count: int, chunk_numel: int) -> int:
    """Upper bound on a valid index section's bytes for ``count`` indices (checked before decoding)."""
    bmax = fixed_width(chunk_numel)
    if coding == IndexCoding.FIXED:
        return (count * bmax + 7) // 8
    return _HEADER_BYTES + max((count * bmax + 7) // 8, (count * (_MAX_FIELD_WIDTH + 2 * bmax + 1) + 7) // 8)


def _decode_fixed(section: bytes, n: int, k: int, chunk_numel: int) -> np.ndarray:
    width = fixed_width(chunk_numel)
    bits = from_bytes(section)
    if bits.size < n * k * width:
        raise Rejected(RejectCode.TRUNCATED, "fixed-width index section")
    check_padding(bits, n * k * width, "index section")
    idx = read_fields(bits, n * k, width).reshape(n, k)
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


def _read_buckets(
    bits: np.ndarray, pos: int, fields: np.ndarray, p: _ClassParams, bmax: int
) -> tuple[np.ndarray, int]:
    """Complete one class's bucket places with its escape stream at ``pos``; (buckets, new pos)."""
    lim = (1 << p.w) - 1
    esc = fields >= lim
    extra, used = read_unary(bits[pos:], int(esc.sum()), "index escapes")
    rho = fields.copy()
    rho[esc] = lim + extra
    if rho.size and int(rho.max()) > bmax:
        raise Rejected(RejectCode.MALFORMED, "index bucket code beyond the largest bucket")
    return _centre_out(p.b0, bmax)[rho], pos + used


def _decode_entropy(section: bytes, n: int, k: int, chunk_numel: int) -> tuple[np.ndarray, np.ndarray]:
    if len(section) < _HEADER_BYTES:
        raise Rejected(RejectCode.TRUNCATED, "index section shorter than its parameters")
    bmax = fixed_width(chunk_numel)
    header = int.from_bytes(section[:_HEADER_BYTES], "big")
    map_code = header >> 14
    if map_code == _FALLBACK:
        if header != _FALLBACK << 14:
            raise Rejected(RejectCode.MALFORMED, "fixed-width fallback with non-zero parameters")
        idx = _decode_fixed(section[_HEADER_BYTES:], n, k, chunk_numel)
        return idx, np.broadcast_to(np.arange(k), idx.shape)
    if map_code != RankMap.IDENTITY and _side(chunk_numel) is None:
        raise Rejected(RejectCode.MALFORMED, f"rank map {map_code} for a chunk of {chunk_numel}")
    rank_map = RankMap(map_code)
    p0, p1 = _read_params((header >> 7) & 0x7F, bmax), _read_params(header & 0x7F, bmax)
    bits = from_bytes(section[_HEADER_BYTES:])
    n0, n1 = n, n * (k - 1)
    if n0 * p0.w + n1 * p1.w > bits.size:
        raise Rejected(RejectCode.TRUNCATED, "index bucket fields")
    f0 = read_fields(bits, n0, p0.w)
    f1 = read_fields(bits[n0 * p0.w :], n1, p1.w)
    pos = n0 * p0.w + n1 * p1.w
    b0, pos = _read_buckets(bits, pos, f0, p0, bmax)
    b1, pos = _read_buckets(bits, pos, f1, p1, bmax)
    b = np.concatenate([b0[:, None], b1.reshape(n, k - 1)], axis=1).reshape(-1)
    width = np.maximum(b - 1, 0)
    total = int(width.sum())
    if pos + total > bits.size:
        raise Rejected(RejectCode.TRUNCATED, "index mantissas")
    check_padding(bits, pos + total, "index section")
    contrib = bits[pos : pos + total].astype(np.int64)
    sym = np.repeat(np.arange(b.size), width)
    start = np.cumsum(width) - width
    j = np.arange(total) - start[sym]
    contrib <<= width[sym] - 1 - j
    csum = np.concatenate([[0], np.cumsum(contrib)])
    mant = csum[start + width] - csum[start]
    gaps = np.where(b >= 1, (np.int64(1) << np.maximum(b - 1, 0)) + mant, 0).reshape(n, k)
    ranks = np.cumsum(gaps + 1, axis=1) - 1
    if ranks[:, -1].max() >= chunk_numel:
        raise Rejected(RejectCode.INDEX_OUT_OF_RANGE, f"index rank beyond chunk of {chunk_numel}")
    _, pos_of = _rank_tables(chunk_numel, rank_map)
    idx = pos_of[ranks]
    if rank_map == RankMap.IDENTITY:
        return idx, np.broadcast_to(np.arange(k), idx.shape)
    order = np.argsort(idx, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1), order


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
) -> tuple[np.ndarray, np.ndarray]:
    """(idx int64 (n, k) ascending and unique per chunk, order): ``val_sorted = take(val_wire, order)``.

    The caller has checked 1 <= k <= chunk_numel and len(section) <= max_index_section_len.
    Raises Rejected (TRUNCATED, MALFORMED, INDEX_OUT_OF_RANGE, DUPLICATE_INDEX).
    """
    ident = np.broadcast_to(np.arange(k), (n, k))
    if k == chunk_numel:
        if section:
            raise Rejected(RejectCode.MALFORMED, "a dense tensor carries no index section")
        return np.broadcast_to(np.arange(k, dtype=np.int64), (n, k)).copy(), ident
    if coding == IndexCoding.ENTROPY:
        return _decode_entropy(section, n, k, chunk_numel)
    return _decode_fixed(section, n, k, chunk_numel), ident
