"""Compiled per-chunk top-k by magnitude (numba): one call for every chunk of a spatial buffer.

:func:`select` is :func:`topk._two_stage` as one loop per chunk, with no tensor operation in
between: the torch path costs a dozen passes and temporaries (``|y|`` written whole, segment
maxima, a gather of candidates, two selections, a sort), which for the few hundred chunks of a
model's small tensors cost more than reading the coefficients. Magnitudes are compared as the
integers of their bit patterns with the sign bit cleared (for floats of one sign, integer order
is float order, and the integer loops vectorise). Per chunk:

1. the maximum ``|y|`` of each segment (a run of ``g`` coefficients along a block row), and
   ``t`` = the ``k``-th largest of those maxima. The ``k`` segments with the largest maxima hold
   ``k`` values ``>= t``, so the chunk's ``k``-th largest ``|y|`` is ``>= t``;
2. the candidates: every value with ``|y| >= t`` (only segments whose maximum is ``>= t`` can
   hold one), walked in ascending coefficient index;
3. the ``k`` largest candidates: all above the ``k``-th largest candidate magnitude ``t2``, then
   those equal to ``t2`` by ascending index until ``k``. Written in ascending index order.

A chunk with fewer than ``k`` nonzero segments (``t = 0``: zero momentum rows, e.g. an
embedding's unused tokens) keeps only its nonzero values as candidates; when they are fewer
than ``k`` it takes all of them and the zeros of lowest index, in one walk.

Same contract as every selection in :mod:`topk` (the ``k`` largest ``|y|``, indices ascending,
values with their sign, read from ``y``); among coefficients tied at the threshold it keeps the
lowest indices, where ``torch.topk`` keeps arbitrary ones, so with ties the two may pick
different (equally valid) sets. A NaN makes :func:`select` return :data:`NOT_FINITE` (its
output is then garbage) and the caller takes the torch path.

:func:`dct_select` is the DCT and the selection of chunks of ``B x B`` (the default chunk) in
one loop, for a tensor rather than its coefficients: each block row of the tensor is read once,
in order, and every chunk is transformed and selected in the L1 cache,
where :func:`dct.forward_chunks` + :func:`select` make four passes over memory (a permuted copy,
two matrix products, the selection). The transform of ``B`` points along one axis (every lane
of the other axis at once, so each step is a loop over one contiguous row of lanes) is Lee's
factorisation of the DCT-II: with ``u_j = x_j + x_{n-1-j}`` and
``v_j = (x_j - x_{n-1-j}) / (2 cos(pi (2j + 1) / 2n))``, the even outputs of the ``n``-point
transform are the ``n/2``-point transform of ``u``, and odd output ``2m + 1`` is the sum of
outputs ``m`` and ``m + 1`` of the transform of ``v``. Split down to single points and merged
back up, that is ``2 log2 B`` passes and about ``(3/2) log2 B`` operations a point, against
``2 B`` multiply-adds for a matrix product; the orthonormal scale of each output is applied in
the last merge (:func:`factors`). A block row's columns are transformed for all its blocks at
once (``D_r X``, lanes the whole row), then each block is transposed and transformed again
(``D_c (D_r X)^T = Y^T``) and selected as it lies, transposed (:func:`select_transposed`).
The coefficients are the matrix products' up to float32 rounding (relative differences of order 1e-6), so the
selection is the same except where two magnitudes lie within rounding of each other. Only what
a peer sends depends on it (its error feedback keeps what was sent); decoding, which replicas
must do bit for bit alike, keeps the matrix products.

The kernels live in one file because numba's on-disk cache of a function is checked against its
own file only: a caller in another file could keep a stale copy of a callee changed here.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from distronet.kernels.coding_jit_sum import compiled

__all__ = [
    "NOT_FINITE",
    "OK",
    "B",
    "dct_select",
    "factors",
    "select",
    "select_from",
    "select_transposed",
]

OK = 0
NOT_FINITE = 1


@compiled
def kth_largest(a: np.ndarray, n: int, k: int, tmp: np.ndarray) -> int:
    """The ``k``-th largest of ``a[:n]`` (``1 <= k <= n``), by quickselect on a copy in ``tmp``
    (median-of-three pivots, no allocation: ``np.partition`` allocates its copy on every call)."""
    for i in range(n):
        tmp[i] = a[i]
    lo, hi, want = 0, n - 1, k - 1  # ``want``: the position in descending order
    while lo < hi:
        mid = (lo + hi) >> 1
        x, y, z = tmp[lo], tmp[mid], tmp[hi]
        if x < y:
            x, y = y, x
        if y < z:
            y = z
            if x < y:
                y = x
        pivot = y  # the median of the three
        i, j = lo, hi
        while i <= j:
            while tmp[i] > pivot:
                i += 1
            while tmp[j] < pivot:
                j -= 1
            if i <= j:
                tmp[i], tmp[j] = tmp[j], tmp[i]
                i += 1
                j -= 1
        if want <= j:
            hi = j
        elif want >= i:
            lo = i
        else:
            return tmp[want]  # type: ignore[no-any-return]
    return tmp[lo]  # type: ignore[no-any-return]


@compiled
def select(
    bits: np.ndarray, y: np.ndarray, inf: int, b: int, gr: int, br: int, gc: int, bc: int, k: int,
    g: int, n0: int, n1: int, idx_out: np.ndarray, val_out: np.ndarray,
) -> int:  # fmt: skip
    """Top-``k`` by ``|y|`` of every chunk of ``y`` (flat, C order of a ``(b, gr, br, gc, bc)``
    spatial buffer; chunk ``n = (b * gr + r) * gc + c`` is the block at block row ``r``, block
    column ``c`` of batch ``b``; its coefficient ``i`` sits at row ``i // bc``, column ``i % bc``).

    ``bits`` is ``y`` viewed as unsigned integers of its width, ``inf`` the bit pattern of
    +infinity (a magnitude above it is a NaN). ``g`` divides ``bc``;
    ``1 <= k <= br * bc / g``. Chunks ``n0 <= n < n1`` only: writes their rows of ``idx_out``
    int64 ``(N, k)`` and ``val_out`` ``(N, k)`` (``y``'s dtype); returns :data:`OK`, or
    :data:`NOT_FINITE` when one of them holds a NaN.
    """
    nb = bc // g
    nseg = br * nb
    cn = br * bc
    row = gc * bc
    mask = bits.dtype.type(inf | (inf - 1))
    smax = np.empty((gc, nseg), dtype=bits.dtype)
    tops = np.empty(gc, dtype=bits.dtype)
    tmp = np.empty(max(nseg, cn), dtype=bits.dtype)
    cand_i = np.empty(cn, dtype=np.int64)
    cand_m = np.empty(cn, dtype=bits.dtype)
    for q in range(n0 // gc, (n1 + gc - 1) // gc):  # block row by block row, read in memory order
        c0, c1 = max(n0 - q * gc, 0), min(n1 - q * gc, gc)
        base = q * br * row
        tops[:] = 0
        for r in range(br):
            p0 = base + r * row
            for c in range(c0, c1):
                for s in range(nb):
                    seg = bits[p0 + c * bc + s * g : p0 + c * bc + (s + 1) * g]
                    m = seg[0] & mask
                    for j in range(1, g):
                        m = max(m, seg[j] & mask)
                    smax[c, r * nb + s] = m
                    tops[c] = max(tops[c], m)
        for c in range(c0, c1):
            if tops[c] > inf:
                return NOT_FINITE
            n = q * gc + c
            select_from(
                bits,
                y,
                inf,
                base + c * bc,
                row,
                br,
                bc,
                g,
                k,
                smax[c],
                tmp,
                cand_i,
                cand_m,
                idx_out,
                val_out,
                n,
            )
    return OK


@compiled
def select_from(
    bits: np.ndarray, y: np.ndarray, inf: int, base: int, row: int, br: int, bc: int, g: int, k: int,
    smax: np.ndarray, tmp: np.ndarray, cand_i: np.ndarray, cand_m: np.ndarray, idx_out: np.ndarray,
    val_out: np.ndarray, n: int,
) -> None:  # fmt: skip
    """One chunk's top-``k`` (:func:`select`'s contract) once its segment maxima ``smax`` are known
    and finite: the chunk's ``br`` rows of ``bc`` start at ``base`` in ``y``, ``row`` apart; writes
    row ``n`` of ``idx_out`` and ``val_out``. ``tmp``, ``cand_i`` and ``cand_m`` hold ``br * bc``
    (work)."""
    mask = bits.dtype.type(inf | (inf - 1))
    nb = bc // g
    nseg = br * nb
    t = kth_largest(smax, nseg, k, tmp)
    count = 0
    zero = t == 0  # under k nonzero segments: keep only nonzero candidates (zeros below)
    for s in range(nseg):
        if smax[s] >= t and not (zero and smax[s] == 0):
            r, q = s // nb, s % nb
            p = base + r * row + q * g
            i0 = r * bc + q * g
            seg = bits[p : p + g]
            for j in range(g):  # branch-free: always write, advance when kept
                a = seg[j] & mask
                cand_i[count] = i0 + j
                cand_m[count] = a
                count += (a >= t) & (not zero or a != 0)
    if count < k:  # every nonzero value, then the zeros of lowest index, in index order
        zeros = k - count
        e_out, c = 0, 0
        for r in range(br):
            p0 = base + r * row
            for j in range(bc):
                i = r * bc + j
                if c < count and cand_i[c] == i:
                    c += 1
                elif zeros > 0 and (bits[p0 + j] & mask) == 0:
                    zeros -= 1
                else:
                    continue
                idx_out[n, e_out] = i
                val_out[n, e_out] = y[p0 + j]
                e_out += 1
                if e_out == k:
                    break
            if e_out == k:
                break
        return
    if count == k:
        for e in range(k):
            i = cand_i[e]
            idx_out[n, e] = i
            val_out[n, e] = y[base + (i // bc) * row + i % bc]
        return
    t2 = kth_largest(cand_m, count, k, tmp)
    need = k
    for e in range(count):
        if cand_m[e] > t2:
            need -= 1
    e_out = 0
    for e in range(count):
        a = cand_m[e]
        if a > t2 or (a == t2 and need > 0):
            if a == t2:
                need -= 1
            i = cand_i[e]
            idx_out[n, e_out] = i
            val_out[n, e_out] = y[base + (i // bc) * row + i % bc]
            e_out += 1


B = 64
"""The block side :func:`dct_select` serves (blocks of ``B x B``, the default chunk); other
blocks keep the matrix products."""


@functools.lru_cache(maxsize=1)
def factors() -> tuple[np.ndarray, np.ndarray]:
    """``(cs, sc)`` float32 of the factored ``B``-point DCT-II (module doc): ``cs`` the
    ``1 / (2 cos(pi (2j + 1) / 2n))`` of every split of ``n`` points, ``n = B, B/2, .., 2`` in
    turn (``n/2`` each), ``sc`` the orthonormal scale of each output. Do not modify them."""
    cs, n = [], B
    while n >= 2:
        j = np.arange(n // 2, dtype=np.float64)
        cs.append(1.0 / (2.0 * np.cos(np.pi * (2.0 * j + 1.0) / (2.0 * n))))
        n //= 2
    sc = np.full(B, math.sqrt(2.0 / B))
    sc[0] = math.sqrt(1.0 / B)
    return np.concatenate(cs).astype(np.float32), sc.astype(np.float32)


@compiled
def _axis(a: np.ndarray, b: np.ndarray, cs: np.ndarray, sc: np.ndarray) -> None:
    """``a = D a`` along axis 0 of ``a`` ``(B, L)``, every lane of axis 1 at once (a block, ``L =
    B``, or a block row of ``L / B`` blocks side by side); ``b`` as ``a`` is work. The splits
    halve ``n`` from ``B`` to 2, then the merges rebuild the outputs from 2 points up: ``2 log2 B``
    passes, ending in ``a``.

    Rows are 1-D views, one statement each: the compiler vectorises a loop over one row's lanes
    (not one over a 2-D index), and a tuple of views costs reference counts. Two levels fused in
    one loop (four rows in, four out) measured twice as slow: eight rows are more than the
    vectoriser checks for overlap at run time. A run-time lane count costs nothing against the
    constant ``B`` (11.0 against 11.3 ms for the Llama set's 2-D tensors, 2 threads)."""
    lanes = a.shape[1]
    src, dst = a, b
    n, off = B, 0
    while n >= 2:
        h = n // 2
        for s0 in range(0, B, n):
            for j in range(h):
                c = cs[off + j]
                sp = src[s0 + j]
                sq = src[s0 + n - 1 - j]
                du = dst[s0 + j]
                dv = dst[s0 + h + j]
                for t in range(lanes):
                    p = sp[t]
                    q = sq[t]
                    du[t] = p + q
                    dv[t] = (p - q) * c
        off += h
        src, dst = dst, src
        n = h
    n = 2
    while n <= B:
        h = n // 2
        for s0 in range(0, B, n):
            for r in range(h):
                if n == B:
                    f0 = sc[2 * r]
                    f1 = sc[2 * r + 1]
                else:
                    f0 = np.float32(1.0)
                    f1 = np.float32(1.0)
                g = src[s0 + r]
                hh = src[s0 + h + r]
                de = dst[s0 + 2 * r]
                do = dst[s0 + 2 * r + 1]
                for t in range(lanes):
                    de[t] = g[t] * f0
                if r + 1 < h:
                    hn = src[s0 + h + r + 1]
                    for t in range(lanes):
                        do[t] = (hh[t] + hn[t]) * f1
                else:
                    for t in range(lanes):
                        do[t] = hh[t] * f1
        src, dst = dst, src
        n *= 2


@compiled
def _sort_pairs(key: np.ndarray, pos: np.ndarray, k: int) -> None:
    """Sort ``key[:k]`` ascending (distinct values), moving ``pos[:k]`` along."""
    if k <= 64:
        for j in range(1, k):
            v, w = key[j], pos[j]
            i = j - 1
            while i >= 0 and key[i] > v:
                key[i + 1] = key[i]
                pos[i + 1] = pos[i]
                i -= 1
            key[i + 1] = v
            pos[i + 1] = w
        return
    order = np.argsort(key[:k])
    ks = key[:k][order]
    ps = pos[:k][order]
    key[:k] = ks
    pos[:k] = ps


@compiled
def select_transposed(
    bits: np.ndarray, flat: np.ndarray, inf: int, k: int, g: int, smax: np.ndarray, tmp: np.ndarray,
    cand_i: np.ndarray, cand_m: np.ndarray, sel: np.ndarray, selp: np.ndarray, idx_out: np.ndarray,
    val_out: np.ndarray, n: int,
) -> int:  # fmt: skip
    """:func:`select` of one ``B x B`` chunk ``Y`` given transposed: ``flat`` is ``Y^T`` (C
    order, ``bits`` its bit patterns), so coefficient ``i = u * B + v`` of ``Y`` sits at ``v * B +
    u``. The same choice, in the same (ascending ``i``) order: the ``k`` largest magnitudes, among
    those tied at the threshold the lowest ``i``; with fewer than ``k`` nonzero values, all of them
    and the zeros of lowest ``i``. The candidates are found as :func:`select_from` finds them
    (segments of ``g`` along rows of ``Y^T``), then the chosen ones sorted by ``i``. ``sel`` and
    ``selp`` hold ``B * B`` int64 (work)."""
    cn = B * B
    mask = bits.dtype.type(inf | (inf - 1))
    nseg = cn // g
    top = bits.dtype.type(0)
    for s in range(nseg):
        seg = bits[s * g : (s + 1) * g]
        m = seg[0] & mask
        for j in range(1, g):
            m = max(m, seg[j] & mask)
        smax[s] = m
        top = max(top, m)
    if top > inf:
        return NOT_FINITE
    t = kth_largest(smax, nseg, k, tmp)
    zero = t == 0
    count = 0
    for s in range(nseg):
        if smax[s] >= t and not (zero and smax[s] == 0):
            seg = bits[s * g : (s + 1) * g]
            for j in range(g):
                a = seg[j] & mask
                cand_i[count] = s * g + j
                cand_m[count] = a
                count += (a >= t) & (not zero or a != 0)
    if count < k:  # every nonzero value, then the zeros of lowest index: a walk in index order
        zeros = k - count
        e_out = 0
        for i in range(cn):
            p = (i % B) * B + i // B
            if (bits[p] & mask) != 0:
                pass
            elif zeros > 0:
                zeros -= 1
            else:
                continue
            idx_out[n, e_out] = i
            val_out[n, e_out] = flat[p]
            e_out += 1
            if e_out == k:
                break
        return OK
    kept = 0
    if count == k:
        for e in range(k):
            p = cand_i[e]
            sel[kept] = (p % B) * B + p // B
            selp[kept] = p
            kept += 1
    else:
        t2 = kth_largest(cand_m, count, k, tmp)
        tied = 0
        for e in range(count):  # those above the threshold; the tied ones after them, by index
            a = cand_m[e]
            p = cand_i[e]
            if a > t2:
                sel[kept] = (p % B) * B + p // B
                selp[kept] = p
                kept += 1
            elif a == t2:
                sel[cn - 1 - tied] = (p % B) * B + p // B
                selp[cn - 1 - tied] = p
                tied += 1
        if tied > k - kept:  # more tied than places: the lowest indices
            _sort_pairs(sel[cn - tied :], selp[cn - tied :], tied)
        for e in range(k - kept):
            sel[kept] = sel[cn - tied + e]
            selp[kept] = selp[cn - tied + e]
            kept += 1
    _sort_pairs(sel, selp, k)
    for e in range(k):
        idx_out[n, e] = sel[e]
        val_out[n, e] = flat[selp[e]]
    return OK


@compiled
def dct_select(
    x: np.ndarray, gr: int, gc: int, cs: np.ndarray, sc: np.ndarray, k: int, g: int, q0: int, q1: int,
    row0: int, idx_out: np.ndarray, val_out: np.ndarray,
) -> int:  # fmt: skip
    """The top-``k`` DCT coefficients of every chunk of block rows ``q0 <= q < q1`` of ``x``
    float32 ``(batch, r, c)`` (``B x B`` blocks on a ``(gr, gc)`` grid per batch, zero-padded;
    block row ``q`` is row ``q % gr`` of batch ``q // gr``; its chunks are ``q * gc`` to
    ``q * gc + gc - 1``) into rows ``row0 + n`` of ``idx_out`` int64 and ``val_out`` float32
    ``(N, k)``, selected as :func:`select` selects a chunk of one row of ``B * B`` (segments of
    ``g``); ``(cs, sc)`` from :func:`factors`. Returns :data:`OK`, or :data:`NOT_FINITE` when a
    coefficient is NaN (the outputs are then garbage).

    A block row is copied as it lies (contiguous rows) and its columns transformed for every
    block at once (``D_r X``, :func:`_axis`); each block is then transposed once in the L1
    cache and transformed again (``D_c (D_r X)^T = Y^T``), and selected transposed
    (:func:`select_transposed`). One scalar transpose a block where loading it transposed and
    transposing it back took two: the Llama set's 2-D tensors at k = 32 in 21.3 ms on one thread
    against 27.7, 11.1 against 15.0 on two (machine D, medians of 15)."""
    cn = B * B
    wide = gc * B
    w = np.empty((B, wide), dtype=np.float32)
    wb = np.empty((B, wide), dtype=np.float32)
    a = np.empty((B, B), dtype=np.float32)
    b = np.empty((B, B), dtype=np.float32)
    flat = a.reshape(cn)
    bits = flat.view(np.uint32)
    smax = np.empty(cn // g, dtype=np.uint32)
    tmp = np.empty(cn, dtype=np.uint32)
    cand_i = np.empty(cn, dtype=np.int64)
    cand_m = np.empty(cn, dtype=np.uint32)
    sel = np.empty(cn, dtype=np.int64)
    selp = np.empty(cn, dtype=np.int64)
    rows, cols = x.shape[1], x.shape[2]
    for q in range(q0, q1):
        bi, r0 = q // gr, (q % gr) * B
        nr = min(B, rows - r0)
        for i in range(nr):  # the block row as it lies, zero-padded
            xi = x[bi, r0 + i]
            wi = w[i]
            for j in range(cols):
                wi[j] = xi[j]
            for j in range(cols, wide):
                wi[j] = 0.0
        for i in range(nr, B):
            wi = w[i]
            for j in range(wide):
                wi[j] = 0.0
        _axis(w, wb, cs, sc)  # w = D_r X, every block of the row
        for c in range(gc):
            c0 = c * B
            for i in range(B):  # a = (D_r X_c)^T
                wi = w[i]
                for j in range(B):
                    a[j, i] = wi[c0 + j]
            _axis(a, b, cs, sc)  # a = D_c (D_r X_c)^T = Y^T
            n = row0 + q * gc + c
            if select_transposed(
                bits, flat, 0x7F800000, k, g, smax, tmp, cand_i, cand_m, sel, selp, idx_out, val_out, n
            ):
                return NOT_FINITE
    return OK
