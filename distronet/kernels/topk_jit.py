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
"""

from __future__ import annotations

import numpy as np

from distronet.kernels.coding_jit_sum import compiled

__all__ = ["NOT_FINITE", "OK", "select"]

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
    mask = bits.dtype.type(inf | (inf - 1))  # every bit but the sign bit
    nb = bc // g
    nseg = br * nb
    cn = br * bc
    row = gc * bc
    smax = np.empty(nseg, dtype=bits.dtype)
    tmp = np.empty(max(nseg, cn), dtype=bits.dtype)
    cand_i = np.empty(cn, dtype=np.int64)
    cand_m = np.empty(cn, dtype=bits.dtype)
    for n in range(n0, n1):
        base = (n // gc) * br * row + (n % gc) * bc
        top = bits.dtype.type(0)
        for r in range(br):
            p0 = base + r * row
            for q in range(nb):
                p = p0 + q * g
                m = bits[p] & mask
                for j in range(1, g):
                    m = max(m, bits[p + j] & mask)
                smax[r * nb + q] = m
                top = max(top, m)
        if top > inf:
            return NOT_FINITE
        t = kth_largest(smax, nseg, k, tmp)
        count = 0
        zero = t == 0  # under k nonzero segments: keep only nonzero candidates (zeros below)
        for s in range(nseg):
            if smax[s] >= t and not (zero and smax[s] == 0):
                r, q = s // nb, s % nb
                p = base + r * row + q * g
                i0 = r * bc + q * g
                for j in range(g):
                    a = bits[p + j] & mask
                    if a >= t and not (zero and a == 0):
                        cand_i[count] = i0 + j
                        cand_m[count] = a
                        count += 1
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
            continue
        if count == k:
            for e in range(k):
                i = cand_i[e]
                idx_out[n, e] = i
                val_out[n, e] = y[base + (i // bc) * row + i % bc]
            continue
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
    return OK
