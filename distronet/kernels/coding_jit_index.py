"""Compiled ENTROPY index planning (numba): ``coding_batch._entropy`` as one loop per tensor.

:func:`plan` makes the choices :func:`coding_batch._entropy_numpy` makes with some twenty
whole-array numpy passes per group (rank tables gathered, sorted, differenced, bucketed,
histogrammed per tensor, each histogram costed under every bucket-code parameter pair), and the
same outputs, exactly: per tensor the rank map of least estimated cost on the sampled chunks (the
first of equal costs, as ``np.argmin``), whether the tensor falls back to a fixed-width body,
and per chunk the gaps of its sorted ranks and the order that sorts them. Equality with the
numpy path is tested on random and adversarial index sets (``test_coding_batch.py``).

Called with arrays the caller built and checked; it never raises. ``numba`` is optional
(``coding_jit_sum.HAVE_JIT``); without it the numpy path runs.
"""

from __future__ import annotations

import numpy as np

from distronet.kernels.coding_jit_sum import compiled

__all__ = ["plan"]

_BITLEN = np.array([v.bit_length() for v in range(1 << 15)], dtype=np.int64)
"""bitlen of every gap (``coding_bucket.buckets_of``; gaps are below ``MAX_CHUNK_NUMEL``): a load
where a shift loop per gap cost a third of the planner's time."""


@compiled
def _best(hist: np.ndarray, orders: np.ndarray, costs: np.ndarray, bmax: int) -> int:
    """``coding_bucket.best_params(...)[0]`` of a bucket histogram: the least field + escape
    bits over every ``(b0, w)``, plus the mantissas' bits."""
    best = -1
    for b0 in range(bmax + 1):
        for w in range(costs.shape[0]):
            s = 0
            for r in range(bmax + 1):
                s += hist[orders[b0, r]] * costs[w, r]
            if best < 0 or s < best:
                best = s
    for b in range(2, bmax + 1):
        best += hist[b] * (b - 1)
    return best


@compiled
def _row(
    idx: np.ndarray, r0: int, tables: np.ndarray, m: int, work: np.ndarray, cnt: np.ndarray, shift: int,
    gaps: np.ndarray, order: np.ndarray, r1: int, ha: np.ndarray, hb: np.ndarray,
) -> None:  # fmt: skip
    """Chunk ``idx[r0]``: its ranks under ``tables[m]`` sorted (``m == 0``: the identity map,
    whose ranks are the ascending indices), their gaps into ``gaps[r1]`` and the positions that
    sort them into ``order[r1]``, and the gaps' buckets counted into ``ha[m]`` (the first) and
    ``hb[m]`` (the others).

    The ranks (distinct: a map is a permutation) are sorted by one counting pass on ``rank >>
    shift`` (under 64 buckets), which leaves them in order but within a bucket, and an insertion
    sort of that nearly sorted row: the order the numpy path's sort of ``rank * k + position``
    gives. An insertion sort of the row alone cost ~1.5k cycles a row (a third of the Llama
    set's ENTROPY encode). ``work`` int64 ``(3, k)``, ``cnt`` int64 ``(65,)``: scratch."""
    k = idx.shape[1]
    if m == 0:
        prev = -1
        for j in range(k):
            r = idx[r0, j]
            g = r - prev - 1
            prev = r
            gaps[r1, j] = g
            order[r1, j] = j
            if j == 0:
                ha[m, _BITLEN[g]] += 1
            else:
                hb[m, _BITLEN[g]] += 1
        return
    rk, sr, sp = work[0], work[1], work[2]
    cnt[:] = 0
    for j in range(k):
        r = tables[m, idx[r0, j]]
        rk[j] = r
        cnt[(r >> shift) + 1] += 1
    for b in range(64):
        cnt[b + 1] += cnt[b]
    for j in range(k):
        b = rk[j] >> shift
        at = cnt[b]
        cnt[b] = at + 1
        sr[at] = rk[j]
        sp[at] = j
    for j in range(1, k):  # within buckets only: a few moves
        v, w = sr[j], sp[j]
        i = j - 1
        while i >= 0 and sr[i] > v:
            sr[i + 1] = sr[i]
            sp[i + 1] = sp[i]
            i -= 1
        sr[i + 1] = v
        sp[i + 1] = w
    prev = -1
    for j in range(k):
        r = sr[j]
        g = r - prev - 1
        prev = r
        gaps[r1, j] = g
        order[r1, j] = sp[j]
        if j == 0:
            ha[m, _BITLEN[g]] += 1
        else:
            hb[m, _BITLEN[g]] += 1


@compiled
def plan(
    idx: np.ndarray, start: np.ndarray, tables: np.ndarray, bmax: int, sample: int, orders: np.ndarray,
    costs: np.ndarray, choice: np.ndarray, fallback: np.ndarray, gaps: np.ndarray, order: np.ndarray,
) -> None:  # fmt: skip
    """Rank maps, fallbacks, gaps and wire orders of the ENTROPY tensors of one group.

    ``idx`` int64 ``(N, k)``, each row ascending; tensor ``t`` owns rows ``start[t]`` to
    ``start[t + 1] - 1``. ``tables`` int64 ``(M, cn)``: rank of each position under each
    candidate map (``M`` = 1 or 3, row 0 the identity); ``orders``/``costs`` the bucket code's
    tables (``coding_bucket._tables(bmax)``). Writes ``choice[t]`` (the map's row in
    ``tables``), ``fallback[t]`` (where the gaps would cost at least the fixed width), and for
    every row its gaps and order (``order`` is ``0..k-1`` in a fallback tensor's rows). Where the
    sample is every chunk (under ``2 * sample`` of them) the chosen map's sample pass is kept,
    not repeated (work: ``3 * min(N, 2 * sample) * k`` int64 twice).
    """
    n_rows, k = idx.shape
    nm = tables.shape[0]
    nb = bmax + 1
    work = np.empty((3, k), dtype=np.int64)
    cnt = np.empty(65, dtype=np.int64)
    shift = 0
    while (tables.shape[1] - 1) >> shift >= 64:
        shift += 1
    held = min(n_rows, 2 * sample) if nm > 1 else 1  # a tensor sampled whole has under 2 * sample rows
    gw = np.empty((nm, held, k), dtype=np.int64)
    ow = np.empty_like(gw)
    ha = np.zeros((nm, nb), dtype=np.int64)
    hb = np.zeros((nm, nb), dtype=np.int64)
    for t in range(start.shape[0] - 1):
        s0, s1 = start[t], start[t + 1]
        n = s1 - s0
        best_m, best_cost = 0, -1
        whole = False
        if nm > 1:
            stride = max(1, n // sample)
            whole = stride == 1
            count = (n + stride - 1) // stride
            for m in range(nm):
                ha[m, :] = 0
                hb[m, :] = 0
                for s in range(count):
                    r = s0 + s * stride
                    w = r - s0 if whole else 0
                    _row(idx, r, tables, m, work, cnt, shift, gw[m], ow[m], w, ha, hb)
                cost = _best(ha[m], orders, costs, bmax)
                if k > 1:
                    cost += _best(hb[m], orders, costs, bmax)
                if best_cost < 0 or cost < best_cost:
                    best_m, best_cost = m, cost
        choice[t] = best_m
        if whole:  # the sample was the tensor: its histograms, gaps and orders are done
            for r in range(s0, s1):
                gaps[r, :] = gw[best_m, r - s0]
                order[r, :] = ow[best_m, r - s0]
        else:
            ha[best_m, :] = 0
            hb[best_m, :] = 0
            for r in range(s0, s1):
                _row(idx, r, tables, best_m, work, cnt, shift, gaps, order, r, ha, hb)
        cost = _best(ha[best_m], orders, costs, bmax)
        if k > 1:
            cost += _best(hb[best_m], orders, costs, bmax)
        fallback[t] = cost >= n * k * bmax
        if fallback[t]:
            for r in range(s0, s1):
                for j in range(k):
                    order[r, j] = j
