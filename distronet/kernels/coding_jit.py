"""A compiled walk over a payload's bit stream (numba): index codes, scale codes, sign bits.

:mod:`coding_table` reads the header and the class table with numpy; what follows in the bit
stream (docs/protocol-payload.md §2 steps 5-8) is serial by nature: a gap-coded body's length
depends on its own escapes and mantissas. In numpy that costs a few dozen operations per tensor
and per packet, which for a model of dozens of small tensors dominated decoding a round. Here
one compiled call reads every index body, the scale codes and the sign bits, then the values
(:mod:`coding_jit_sum`), O(bits + coefficients) with no per-tensor interpreter work.

Contract: :func:`walk` either returns what the reference decoder would (indices in ascending
position per chunk, their values dequantised and moved along with them) or reports "not
accepted" (status != 0) for ANY input the reference rejects: stream too short, unary code too
long, place or escape past ``bmax``, index out of range, FIXED indices not strictly ascending,
rank past the chunk, 2-D rank map on a 1-D chunk, scale code out of range, wrong length or
non-zero padding, a NaN or infinite value. It never raises for bad input and never reads
outside ``buf``: every read is checked against ``nbits`` first, the 32-bit word table reads
zeros past the end of ``buf``, and value reads stay inside the value section whose size the
caller checked (tests fuzz this with hostile bytes). The caller then lets the reference decoder
name the exact rejection.

``numba`` is optional: :data:`HAVE_JIT` is False without it and
:func:`distronet.kernels.coding.decode_payload` uses the reference decoder. Compiled code is
cached on disk next to this module (``__pycache__``): the first call in a fresh checkout
compiles for ~10 s (~40 s on a loaded 2-core machine), later processes load it in ~1 s.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import cast

import numpy as np

from distronet.kernels.coding_bucket import RICE, centre_out
from distronet.kernels.coding_index import RankMap, fixed_width, rank_tables, square_side
from distronet.kernels.coding_jit_sum import HALF_BITS, HAVE_JIT, F, compiled, values
from distronet.kernels.coding_values import SCALE_BMAX, SCALE_TABLE

__all__ = ["HAVE_JIT", "OK", "walk", "walk_tables"]


def _inline(fn: F) -> F:
    """:func:`compiled`, inlined into its callers by numba: a call that passes arrays to a compiled
    function that is not inlined costs two atomic reference-count updates per array, which in
    per-symbol helpers was over half of a payload walk (perf)."""
    if not HAVE_JIT:  # pragma: no cover
        return fn
    import numba

    return cast(F, numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")(fn))


OK = 0
_BAD = 1
_WIDTH = np.array([max(b - 1, 0) for b in range(16)], dtype=np.int64)  # mantissa bits of bucket b
_BASE = np.array([(1 << (b - 1)) if b else 0 for b in range(16)], dtype=np.int64)  # its smallest symbol
_LEAD_ONES = np.array([8 - (255 - b).bit_length() for b in range(256)], dtype=np.int64)
_IDENTITY = int(RankMap.IDENTITY)
_FALLBACK = int(RankMap.FALLBACK)
_INSERTION_MAX_K = 32  # per-chunk sorts: insertion sort up to here, heap sort above (no O(k^2) blow-up)


@_inline
def _bits(word: int, pos: int, w: int) -> int:
    """``w`` (<= 25) bits at ``pos``, MSB-first, from ``word = words[pos >> 3]``, the big-endian
    32-bit word at that byte (:func:`_words`); the caller checked ``pos + w <= nbits``.

    Scalars only, indexing in the caller: a compiled helper that takes an array pays two atomic
    reference-count updates per call, which in these per-symbol helpers was over half of a
    payload walk (perf).
    """
    return int((word >> (32 - (pos & 7) - w)) & ((np.int64(1) << w) - 1))


@compiled
def _words(buf: np.ndarray, nbits: int, out: np.ndarray) -> np.ndarray:
    """The big-endian 32-bit word at every byte of the stream (bytes past ``buf`` read as 0),
    written to ``out[:(nbits + 7) // 8 + 1]`` (scratch, at least that long); returns ``out``."""
    size = (nbits + 7) >> 3
    safe = min(size + 1, buf.size - 3)
    for i in range(safe):
        out[i] = (
            (np.int64(buf[i]) << 24) | (np.int64(buf[i + 1]) << 16) | (np.int64(buf[i + 2]) << 8) | buf[i + 3]
        )
    for i in range(max(safe, 0), size + 1):
        w = np.int64(0)
        for d in range(4):
            w = (w << 8) | (np.int64(buf[i + d]) if i + d < buf.size else 0)
        out[i] = w
    return out


@_inline
def _unary_step(word: int, pos: int, nbits: int) -> int:
    """Leading ones of the unary code at ``pos`` (``word = words[pos >> 3]``): 0-8 when the next
    8 bits are in the stream (8: all ones, the code goes on), else 0 or 1 for the single bit at
    ``pos`` (the caller checked ``pos < nbits``); 9 + that bit marks the single-bit case."""
    if pos + 8 <= nbits:
        return int(_LEAD_ONES[_bits(word, pos, 8)])
    return 9 + int((word >> (31 - (pos & 7))) & 1)


@_inline
def _prefixes(
    buf: np.ndarray, nbits: int, fstart: int, esc: int, count: int, b0: int, w: int, bmax: int,
    order: np.ndarray, out: np.ndarray,
) -> int:  # fmt: skip
    """Buckets (bucket code) or quotients (Rice) of ``count`` symbols whose fields start at
    ``fstart`` and escapes at ``esc``; returns the position after the escapes, -1 if bad."""
    rice = w == RICE
    lim = (1 << w) - 1 if not rice else 0
    top = ((1 << bmax) - 1) >> b0 if rice else max(bmax - lim, 0)
    for i in range(count):
        f = 0
        if not rice:
            if w:
                at = fstart + i * w
                f = _bits(buf[at >> 3], at, w)
            if f != lim:
                if f > bmax:
                    return -1
                out[i] = order[f]
                continue
        v = 0  # a unary code at esc (the quotient, or the escape past lim), at most top
        while True:
            if esc >= nbits:
                return -1
            ones = _unary_step(buf[esc >> 3], esc, nbits)
            if ones < 8:  # 0-7 ones then a zero
                v += ones
                esc += ones + 1
                break
            if ones == 8:
                v += 8
                esc += 8
            else:  # one bit near the end: 9 is a zero, 10 a one
                esc += 1
                if ones == 9:
                    break
                v += 1
            if v > top:
                return -1
        if v > top:
            return -1
        if rice:
            out[i] = v
        else:
            f = lim + v
            if f > bmax:
                return -1
            out[i] = order[f]
    return esc


@_inline
def _sort_chunk(pos: np.ndarray, src: np.ndarray, k: int) -> None:
    """Sort ``pos[:k]`` ascending (values unique), applying the same moves to ``src[:k]``.

    Insertion sort for small ``k``, heap sort above (in place, O(k log k) for any input).
    """
    if k <= _INSERTION_MAX_K:
        for i in range(1, k):
            p, s = pos[i], src[i]
            j = i - 1
            while j >= 0 and pos[j] > p:
                pos[j + 1] = pos[j]
                src[j + 1] = src[j]
                j -= 1
            pos[j + 1] = p
            src[j + 1] = s
        return
    for start in range(k // 2 - 1, -1, -1):
        _sift(pos, src, start, k)
    for end in range(k - 1, 0, -1):
        pos[0], pos[end] = pos[end], pos[0]
        src[0], src[end] = src[end], src[0]
        _sift(pos, src, 0, end)


@_inline
def _sift(pos: np.ndarray, src: np.ndarray, root: int, end: int) -> None:
    while True:
        child = 2 * root + 1
        if child >= end:
            return
        if child + 1 < end and pos[child + 1] > pos[child]:
            child += 1
        if pos[root] >= pos[child]:
            return
        pos[root], pos[child] = pos[child], pos[root]
        src[root], src[child] = src[child], src[root]
        root = child


@compiled
def _gap_body(
    buf: np.ndarray, nbits: int, p: int, n: int, k: int, cn: int, m: int, prm: np.ndarray,
    orders: np.ndarray, ptab: np.ndarray, off: int, idx: np.ndarray, perm: np.ndarray,
    pa: np.ndarray, pb: np.ndarray, cpos: np.ndarray, csrc: np.ndarray, cnt: np.ndarray, crow: np.ndarray,
) -> int:  # fmt: skip
    """One gap-coded body (map ``m`` already read) from ``p``; returns its end, -1 if bad.
    ``pa``, ``pb``, ``cpos``, ``csrc``, ``cnt``, ``crow``: scratch of at least n, n * (k - 1),
    k, k, side + 1 and k entries."""
    b0a, wa, b0b, wb, bmax, side = prm[0], prm[1], prm[2], prm[3], prm[4], prm[5]
    shift = -1  # block rows by a shift when the side is a power of two (a 64-bit division is slow)
    if side > 0 and side & (side - 1) == 0:
        shift = fixed_width_jit(side)
    na, nb = n, n * (k - 1)
    fa = p
    if wa != RICE:
        p += na * wa
    fb = p
    if wb != RICE:
        p += nb * wb
    if p > nbits:
        return -1
    p = _prefixes(buf, nbits, fa, p, na, b0a, wa, bmax, orders[0], pa)
    if p < 0:
        return -1
    p = _prefixes(buf, nbits, fb, p, nb, b0b, wb, bmax, orders[1], pb)
    if p < 0:
        return -1
    rice_a, rice_b = wa == RICE, wb == RICE
    for c in range(n):
        pre = pa[c]
        width = b0a if rice_a else _WIDTH[pre]
        if p + width > nbits:
            return -1
        r = (pre << b0a if rice_a else _BASE[pre]) + _bits(buf[p >> 3], p, width)
        p += width
        if r >= cn:
            return -1
        cpos[0] = ptab[m, r]
        csrc[0] = off + c * k
        q = c * (k - 1) - 1
        for j in range(1, k):
            pre = pb[q + j]
            width = b0b if rice_b else _WIDTH[pre]
            if p + width > nbits:
                return -1
            mant = _bits(buf[p >> 3], p, width)
            p += width
            r += 1 + ((pre << b0b) + mant if rice_b else _BASE[pre] + mant)
            if r >= cn:
                return -1
            cpos[j] = ptab[m, r]
            csrc[j] = off + c * k + j
        base = off + c * k
        if m != _IDENTITY and k * k > 8 * (side + k):
            # A stable counting sort by block row u = pos // side, written in place (no helper:
            # see _bits). Exact for the transpose and diagonal maps: along ascending ranks, the
            # positions of any one row arrive with ascending column (rank order is (v, u) for
            # transpose and (u + v, u) for diagonal). O(k + side).
            for u in range(side + 1):
                cnt[u] = 0
            for j in range(k):
                u = cpos[j] >> shift if shift >= 0 else cpos[j] // side
                crow[j] = u
                cnt[u + 1] += 1
            for u in range(side):
                cnt[u + 1] += cnt[u]
            for j in range(k):
                u = crow[j]
                at = base + cnt[u]
                cnt[u] += 1
                idx[at] = cpos[j]
                perm[at] = csrc[j]
            continue
        if m != _IDENTITY:
            _sort_chunk(cpos, csrc, k)
        for j in range(k):
            idx[base + j] = cpos[j]
            perm[base + j] = csrc[j]
    return p


@compiled
def _fixed_body(
    buf: np.ndarray, nbits: int, p: int, n: int, k: int, cn: int, off: int, idx: np.ndarray, perm: np.ndarray
) -> int:
    """A FIXED (or fallback) body from ``p``; returns its end, -1 if bad."""
    w = fixed_width_jit(cn)
    if p + n * k * w > nbits:
        return -1
    for c in range(n):
        prev = -1
        for j in range(k):
            v = _bits(buf[p >> 3], p, w)
            p += w
            if v >= cn or v <= prev:
                return -1
            prev = v
            idx[off + c * k + j] = v
            perm[off + c * k + j] = off + c * k + j
    return p


@_inline
def fixed_width_jit(cn: int) -> int:
    w, x = 0, cn - 1
    while x > 0:
        w += 1
        x >>= 1
    return w


@compiled
def _scales(
    buf: np.ndarray, nbits: int, p: int, sc_n: np.ndarray, sc_lo: np.ndarray, sc_hi: np.ndarray,
    sc_step: np.ndarray, b0: int, w: int, order: np.ndarray, table: np.ndarray, out: np.ndarray,
) -> int:  # fmt: skip
    """Scale symbols of every scaled chunk -> float32 scales in ``out``; returns the end, -1 if bad."""
    count = out.size
    pre = np.empty(count, dtype=np.int64)
    fs = p
    if w != RICE:
        p += count * w
    if p > nbits:
        return -1
    p = _prefixes(buf, nbits, fs, p, count, b0, w, SCALE_BMAX, order, pre)
    if p < 0:
        return -1
    code, i = 0, 0
    for t in range(sc_n.size):
        for _c in range(sc_n[t]):
            b = pre[i]
            width = b0 if w == RICE else (b - 1 if b > 1 else 0)
            if p + width > nbits:
                return -1
            mant = _bits(buf[p >> 3], p, width)
            p += width
            if w == RICE:
                sym = (b << b0) + mant
            elif b >= 1:
                sym = (np.int64(1) << width) + mant
            else:
                sym = 0
            if sym == 0:
                out[i] = 0.0
            else:
                zz = sym - 1
                code += (zz >> 1) ^ -(zz & 1)
                if code < sc_lo[t] or code > sc_hi[t]:
                    return -1
                q = code * sc_step[t]
                out[i] = np.float32(math.ldexp(np.float64(table[q & 7]), q >> 3))
            i += 1
    return p


@compiled
def _walk(
    buf: np.ndarray, nbits: int, p: int, n: np.ndarray, k: np.ndarray, cn: np.ndarray, mode: np.ndarray,
    grp: np.ndarray, prm: np.ndarray, orders: np.ndarray, ptabs: np.ndarray, offsets: np.ndarray,
    idx: np.ndarray, perm: np.ndarray, sc_n: np.ndarray, sc_lo: np.ndarray, sc_hi: np.ndarray,
    sc_step: np.ndarray, s_b0: int, s_w: int, s_order: np.ndarray, table: np.ndarray,
    scales: np.ndarray, n_signs: int, words: np.ndarray,
) -> tuple[int, int, bool]:  # fmt: skip
    """Every tensor's index body, then the scales and the signs: (status, sign bits' start,
    whether any value moved)."""
    moved = False
    words = _words(buf, nbits, words)
    kmax, nmax, bmax = 1, 1, 1  # scratch for every gap-coded body, allocated once
    for t in range(n.size):
        kmax = max(kmax, k[t])
        nmax = max(nmax, n[t])
        bmax = max(bmax, n[t] * (k[t] - 1))
    cpos = np.empty(kmax, dtype=np.int64)
    csrc = np.empty(kmax, dtype=np.int64)
    pa = np.empty(nmax, dtype=np.int64)
    pb = np.empty(bmax, dtype=np.int64)
    side_max = 0
    for g in range(prm.shape[0]):
        side_max = max(side_max, prm[g, 5])
    cnt = np.empty(side_max + 1, dtype=np.int64)
    crow = np.empty(kmax, dtype=np.int64)
    for t in range(n.size):
        off = offsets[t]
        if mode[t] == 0:  # dense: positions 0..cn-1 in every chunk, values as sent
            for i in range(n[t] * k[t]):
                idx[off + i] = i % k[t]
                perm[off + i] = off + i
            continue
        if mode[t] == 2:  # ENTROPY: a 2-bit rank map first
            if p + 2 > nbits:
                return _BAD, 0, moved
            m = _bits(words[p >> 3], p, 2)
            p += 2
            if m != _FALLBACK:
                g = grp[t]
                if m != _IDENTITY and prm[g, 5] == 0:
                    return _BAD, 0, moved
                p = _gap_body(
                    words,
                    nbits,
                    p,
                    n[t],
                    k[t],
                    cn[t],
                    m,
                    prm[g],
                    orders[g],
                    ptabs[g],
                    off,
                    idx,
                    perm,
                    pa,
                    pb,
                    cpos,
                    csrc,
                    cnt,
                    crow,
                )
                if p < 0:
                    return _BAD, 0, moved
                moved = moved or m != _IDENTITY
                continue
        p = _fixed_body(words, nbits, p, n[t], k[t], cn[t], off, idx, perm)
        if p < 0:
            return _BAD, 0, moved
    if scales.size:
        p = _scales(words, nbits, p, sc_n, sc_lo, sc_hi, sc_step, s_b0, s_w, s_order, table, scales)
        if p < 0:
            return _BAD, 0, moved
    sign_start = p
    p += n_signs
    if p > nbits or (p + 7) // 8 * 8 != nbits:
        return _BAD, 0, moved
    pad = nbits - p
    if pad and (buf[nbits // 8 - 1] & ((1 << pad) - 1)):
        return _BAD, 0, moved
    return OK, sign_start, moved


@functools.lru_cache(maxsize=64)
def _order(b0: int, bmax: int) -> np.ndarray:
    """Place -> bucket for (b0, bmax), padded to 16 entries (places past bmax are rejected first)."""
    out = np.zeros(16, dtype=np.int64)
    o = centre_out(b0, bmax)
    out[: o.size] = o
    return out


@functools.lru_cache(maxsize=64)
def _ptab(cn: int) -> np.ndarray:
    """Position-of-rank tables (3, cn) of maps identity, transpose, diagonal (identity twice for a
    chunk that is not square: those maps are refused before use)."""
    maps = (RankMap.IDENTITY, RankMap.TRANSPOSE, RankMap.DIAGONAL)
    if square_side(cn) is None:
        maps = (RankMap.IDENTITY,) * 3
    return np.stack([rank_tables(cn, m)[1] for m in maps])


def walk_tables(
    groups: tuple[tuple[int, int, int, int, int], ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(params (G, 6): b0_a, w_a, b0_b, w_b, bmax, side or 0; place->bucket orders (G, 2, 16);
    rank tables (G, 3, max cn)) of entropy groups ``(cn, b0_a, w_a, b0_b, w_b)``; cached."""
    return _walk_tables(groups)


@functools.lru_cache(maxsize=64)
def _walk_tables(
    groups: tuple[tuple[int, int, int, int, int], ...],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = max(len(groups), 1)
    width = max([c for c, *_ in groups], default=1)
    prm = np.zeros((g, 6), dtype=np.int64)
    orders = np.zeros((g, 2, 16), dtype=np.int64)
    ptabs = np.zeros((g, 3, width), dtype=np.int64)
    for i, (cn, b0a, wa, b0b, wb) in enumerate(groups):
        bmax = fixed_width(cn)
        prm[i] = (b0a, wa, b0b, wb, bmax, square_side(cn) or 0)
        orders[i, 0], orders[i, 1] = _order(b0a, bmax), _order(b0b, bmax)
        ptabs[i, :, :cn] = _ptab(cn)
    return prm, orders, ptabs


_TABLE = SCALE_TABLE.astype(np.float32)
_SCRATCH = threading.local()
_SCRATCH_KEEP = 1 << 22  # entries of int64 scratch a thread keeps between packets (32 MiB)


def _scratch(name: str, size: int) -> np.ndarray:
    """This thread's int64 scratch array ``name`` of at least ``size`` entries. Kept between
    calls up to :data:`_SCRATCH_KEEP` entries: fresh pages cost a page fault each, which for a
    big payload's permutation and word table cost as much as the walk."""
    arr: np.ndarray | None = getattr(_SCRATCH, name, None)
    if arr is None or arr.size < size:
        arr = np.empty(max(size, 4096), dtype=np.int64)
        if arr.size <= _SCRATCH_KEEP:
            setattr(_SCRATCH, name, arr)
    return arr


def walk(
    buf: np.ndarray,
    nbits: int,
    pos: int,
    n: np.ndarray,
    k: np.ndarray,
    cn: np.ndarray,
    mode: np.ndarray,
    grp: np.ndarray,
    tables: tuple[np.ndarray, np.ndarray, np.ndarray],
    offsets: np.ndarray,
    scaled: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    scale_params: tuple[int, int],
    n_signs: int,
    vstart: int,
    vtab: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> tuple[int, np.ndarray, np.ndarray]:
    """Walk the stream from bit ``pos`` and read the values: (status, idx, val).

    ``buf`` is the whole payload (uint8); the bit stream ends at bit ``nbits``, the value section
    starts at byte ``vstart``. Per tensor (int64 arrays): ``n``, ``k``, ``cn``, ``mode`` (0 dense,
    1 FIXED, 2 ENTROPY), ``grp`` (its entropy group's row in ``tables``), ``offsets`` (T + 1,
    output starts). ``scaled``: per INT8/SIGN1 tensor (n, lowest code, highest code, step).
    ``vtab``: per tensor (value coding, value byte offset, first scale row, sign bit offset), see
    :func:`coding_jit_sum.values`. ``idx[i]`` (int64) is output slot ``i``'s position in its
    chunk, ``val[i]`` (float32) its value. Status :data:`OK` or not accepted (module doc; also a
    non-finite value). Cost O(stream bits + coefficients), compiled, one call.
    """
    total = int(offsets[-1])
    idx = np.empty(total, dtype=np.int64)
    val = np.empty(total, dtype=np.float32)
    perm = _scratch("perm", total)
    sc_n, sc_lo, sc_hi, sc_step = scaled
    scales = np.empty(int(sc_n.sum()), dtype=np.float32)
    prm, orders, ptabs = tables
    s_b0, s_w = scale_params
    vc, voff, soff, goff = vtab
    status = _walk_values(
        buf, nbits, pos, n, k, cn, mode, grp, prm, orders, ptabs, offsets, idx, perm,
        sc_n, sc_lo, sc_hi, sc_step, s_b0, s_w, _order(s_b0, SCALE_BMAX), _TABLE, scales, n_signs,
        vstart, vc, voff, soff, goff, HALF_BITS, val, _scratch("words", ((nbits + 7) >> 3) + 1),
    )  # fmt: skip
    return int(status), idx, val


@compiled
def _walk_values(
    buf: np.ndarray, nbits: int, p: int, n: np.ndarray, k: np.ndarray, cn: np.ndarray, mode: np.ndarray,
    grp: np.ndarray, prm: np.ndarray, orders: np.ndarray, ptabs: np.ndarray, offsets: np.ndarray,
    idx: np.ndarray, perm: np.ndarray, sc_n: np.ndarray, sc_lo: np.ndarray, sc_hi: np.ndarray,
    sc_step: np.ndarray, s_b0: int, s_w: int, s_order: np.ndarray, table: np.ndarray,
    scales: np.ndarray, n_signs: int, vstart: int, vc: np.ndarray, voff: np.ndarray, soff: np.ndarray,
    goff: np.ndarray, half: np.ndarray, val: np.ndarray, words: np.ndarray,
) -> int:  # fmt: skip
    """:func:`_walk`, then :func:`coding_jit_sum.values` into ``val``; the first failure's status."""
    status, sign_start, moved = _walk(
        buf, nbits, p, n, k, cn, mode, grp, prm, orders, ptabs, offsets, idx, perm,
        sc_n, sc_lo, sc_hi, sc_step, s_b0, s_w, s_order, table, scales, n_signs, words,
    )  # fmt: skip
    if status != OK:
        return status
    return values(
        buf, vstart, sign_start, n, k, offsets, vc, voff, soff, goff, perm, moved, scales, half, val
    )
