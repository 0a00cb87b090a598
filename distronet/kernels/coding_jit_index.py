"""Compiled ENTROPY index planning (numba): ``coding_batch_plan._entropy`` as one loop per tensor.

:func:`plan` makes the choices :func:`coding_batch_plan._entropy_numpy` makes with some twenty
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

from distronet.kernels.coding_jit_sum import compiled, inlined

__all__ = ["plan"]

_BITLEN = np.array([v.bit_length() for v in range(1 << 15)], dtype=np.int64)
"""bitlen of every gap (``coding_bucket.buckets_of``; gaps are below ``MAX_CHUNK_NUMEL``): a load
where a shift loop per gap cost a third of the planner's time."""


@inlined
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


@inlined
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


@compiled
def _bitlen(x: int) -> int:
    if x < _BITLEN.shape[0]:
        return _BITLEN[x]  # type: ignore[no-any-return]
    b = 0
    while x:
        x >>= 1
        b += 1
    return b


@compiled
def _field(x: int, b0: int, w: int, place: np.ndarray) -> tuple[int, int, int, int, int, int]:
    """One symbol of a class under ``(b0, w)`` (``coding_bucket.class_parts``): its field, escape
    and mantissa as ``(value, width)`` pairs (width 0: none)."""
    if w == 7:  # RICE: no field, the quotient in unary, the low b0 bits
        q = x >> b0
        return 0, 0, (1 << (q + 1)) - 2, q + 1, x & ((1 << b0) - 1), b0
    b = _bitlen(x)
    rho = place[b]
    lim = (1 << w) - 1
    ev, ew = 0, 0
    if rho >= lim:
        q = rho - lim
        ev, ew = (1 << (q + 1)) - 2, q + 1
    mw = b - 1 if b > 1 else 0
    return min(rho, lim), w, ev, ew, x & ((1 << mw) - 1), mw


@compiled
def streams(
    gaps: np.ndarray, idx: np.ndarray, start: np.ndarray, maps: np.ndarray, fixed: int, b0a: int, wa: int,
    place_a: np.ndarray, b0b: int, wb: int, place_b: np.ndarray, values: np.ndarray, widths: np.ndarray,
    at: np.ndarray,
) -> None:  # fmt: skip
    """The bit fields of an ENTROPY group's tensors, tensor ``t`` (rows ``start[t]`` to
    ``start[t + 1] - 1``) in ``values``/``widths`` from ``at[t]`` to ``at[t + 1]``: its rank map
    ``maps[t]`` in 2 bits, then a FALLBACK (3) tensor's indices in ``fixed`` bits each, any other
    its class A fields (each row's first gap), class B fields (the other gaps, row by row), class A
    escapes, class B escapes, and the mantissas row by row (A's, then B's): what
    ``coding_batch._streams`` cut per tensor gives, without its zero-width fields.

    ``place_a``/``place_b``: each bucket's place in the centre-out order of the class's ``b0``
    (unused for Rice, ``w == 7``). ``values``/``widths`` int64 hold at least ``3 * N * k + T``;
    ``at`` int64 ``(T + 1,)``. Arrays the caller built; it never raises."""
    k = gaps.shape[1]
    most = 0
    for t in range(start.shape[0] - 1):
        most = max(most, start[t + 1] - start[t])
    sym = np.empty((6, most * k), dtype=np.int64)  # a tensor's fields, escapes, mantissas
    n = 0
    for t in range(start.shape[0] - 1):
        at[t] = n
        r0, r1 = start[t], start[t + 1]
        values[n] = maps[t]
        widths[n] = 2
        n += 1
        if maps[t] == 3:
            for r in range(r0, r1):
                for j in range(k):
                    values[n] = idx[r, j]
                    widths[n] = fixed
                    n += 1
            continue
        m = (r1 - r0) * k
        for r in range(r0, r1):
            for j in range(k):
                i = (r - r0) * k + j
                if j == 0:
                    f = _field(gaps[r, j], b0a, wa, place_a)
                else:
                    f = _field(gaps[r, j], b0b, wb, place_b)
                sym[0, i], sym[1, i], sym[2, i], sym[3, i], sym[4, i], sym[5, i] = f
        nr = r1 - r0
        for v in (0, 2):  # fields (A, then B), escapes (A, then B)
            for rr in range(nr):
                i = rr * k
                if sym[v + 1, i] > 0:
                    values[n] = sym[v, i]
                    widths[n] = sym[v + 1, i]
                    n += 1
            for rr in range(nr):
                for i in range(rr * k + 1, rr * k + k):
                    if sym[v + 1, i] > 0:
                        values[n] = sym[v, i]
                        widths[n] = sym[v + 1, i]
                        n += 1
        for i in range(m):  # mantissas, row by row
            if sym[5, i] > 0:
                values[n] = sym[4, i]
                widths[n] = sym[5, i]
                n += 1
    at[start.shape[0] - 1] = n


@compiled
def class_stats(
    gaps: np.ndarray, r0s: np.ndarray, r1s: np.ndarray, first: bool, hist: np.ndarray
) -> tuple[int, int, int]:
    """One bucket-code class of the rows ``r0s[i] <= r < r1s[i]`` of ``gaps``: each row's first gap
    (``first``) or its others. Adds the symbols' buckets into ``hist``; returns their sum, count
    and largest (0 for none): ``coding_bucket.choose_params``'s statistics, no concatenation."""
    s, n, top = 0, 0, 0
    k = gaps.shape[1]
    j0, j1 = (0, 1) if first else (1, k)
    for i in range(r0s.shape[0]):
        for r in range(r0s[i], r1s[i]):
            for j in range(j0, j1):
                x = gaps[r, j]
                hist[_bitlen(x)] += 1
                s += x
                top = max(top, x)
            n += j1 - j0
    return s, n, top


@compiled
def shifted_sum(gaps: np.ndarray, r0s: np.ndarray, r1s: np.ndarray, first: bool, m: int) -> int:
    """``sum(x >> m)`` over the class :func:`class_stats` reads (a Rice code's unary bits)."""
    s = 0
    k = gaps.shape[1]
    j0, j1 = (0, 1) if first else (1, k)
    for i in range(r0s.shape[0]):
        for r in range(r0s[i], r1s[i]):
            for j in range(j0, j1):
                s += gaps[r, j] >> m
    return s


@compiled
def take_rows(src: np.ndarray, order: np.ndarray, out: np.ndarray) -> None:
    """``out[r, j] = src[r, order[r, j]]`` (``np.take_along_axis(src, order, 1)``); ``order`` rows
    are permutations of ``0..k-1`` (the planner's wire orders)."""
    for r in range(order.shape[0]):
        for j in range(order.shape[1]):
            out[r, j] = src[r, order[r, j]]


@compiled
def put_rows(out: np.ndarray, order: np.ndarray, src: np.ndarray) -> None:
    """``out[r, order[r, j]] = src[r, j]`` (``np.put_along_axis(out, order, src, 1)``)."""
    for r in range(order.shape[0]):
        for j in range(order.shape[1]):
            out[r, order[r, j]] = src[r, j]
