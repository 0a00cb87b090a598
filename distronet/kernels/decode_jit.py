"""The dense inverse's first product, made from the entries themselves (numba).

A chunk's inverse is ``X = D_r^T Y D_c`` for 2-D blocks (``Y D`` for 1-D). The first product
``Z = Y D_c`` has, for each row of ``Y`` that holds coefficients, the sum over its entries of
``val * D_c[v, :]`` (``v`` the entry's column in its block), and zeros in every other row. A
round's ``Y`` holds a few percent of the coefficients, so building ``Z`` entry by entry costs
``w`` multiply-adds an entry against ``w`` a coefficient for the dense product, and no scatter into
a coefficient buffer first. What is left of the inverse is the second product (``D_r^T Z``), or
nothing for 1-D blocks.

Both kernels compute ``z[row, :] += val * D_w[v, :]`` entry by entry, in entry order: per element
the same float32 products and additions, from zero, as ``index_add_`` of the rows
``val[:, None] * D_w[v]`` (``dct.spread_rows``; the CPU kernel adds serially), so results are
bit-identical to the tensor path and independent of thread counts. No fused multiply-add: numba
compiles without fast-math, and the products are rounded before they are added, as torch does.

* :func:`spread_flat` writes whole regions of a flat buffer (``decode_plan.BatchPlan``): block row
  by block row (``br`` spatial rows) it sums every payload's entries of that block row, payload
  by payload, in a zeroed tile that stays in the cache, and copies the tile out; so nothing needs
  zeroing beforehand, and pieces of the work can run on several threads.
* :func:`spread_part` adds one ``(n, k)`` part of one tensor (``decode.decode_sum``).

Called with arrays the caller built and checked; they never raise.
"""

from __future__ import annotations

import numpy as np

from distronet.kernels.coding_jit_sum import compiled

__all__ = ["spread_flat", "spread_part"]


@compiled
def spread_flat(
    buf: np.ndarray, tile: np.ndarray, items: np.ndarray, region: np.ndarray, rowlen: np.ndarray,
    cpr: np.ndarray, width: np.ndarray, basis_at: np.ndarray, basis: np.ndarray, cbase: np.ndarray,
    cbase_at: np.ndarray, local: np.ndarray, local_at: np.ndarray, kk: np.ndarray, oo: np.ndarray,
    idx: np.ndarray, val: np.ndarray,
) -> None:  # fmt: skip
    """The first product of block rows ``r0 .. r1`` of tensor ``t`` for every row ``(t, r0, r1)``
    of ``items``, written over their regions of ``buf``.

    Tensor ``t``'s region starts at ``region[t]``: block rows of ``rowlen[t]`` floats, block row
    ``R`` holding the chunks ``R * cpr[t] ..`` (``cpr[t]`` of them); rows are ``width[t]`` wide
    and ``basis[basis_at[t]:]`` is the ``(width, width)`` DCT basis. Payload ``p`` carries tensor
    ``t`` at ``kk[p, t]`` entries a chunk (0: absent) from entry ``oo[p, t]`` of ``idx``/``val``;
    entry ``e`` of chunk ``c`` sits at ``cbase[cbase_at[t] + c] + x`` (``x = idx``, or
    ``local[local_at[t] + idx]`` when ``local_at[t] >= 0``).

    Each block row is summed in ``tile`` (at least ``rowlen`` floats, this thread's own: it stays
    in the cache while every payload lands in it), then copied out whole: ``buf`` is only written
    with final values, so two threads running the same items write the same bits.
    """
    n_pay = kk.shape[0]
    for it in range(items.shape[0]):
        t, r0, r1 = items[it, 0], items[it, 1], items[it, 2]
        w, ba, la, cb, per, size = width[t], basis_at[t], local_at[t], cbase_at[t], cpr[t], rowlen[t]
        for r in range(r0, r1):
            start = region[t] + r * size
            row_tile = tile[:size]
            row_tile[:] = 0.0
            for p in range(n_pay):
                kt = kk[p, t]
                if kt == 0:
                    continue
                for c in range(r * per, (r + 1) * per):
                    base, row = cbase[cb + c] - start, oo[p, t] + c * kt
                    for e in range(row, row + kt):
                        i = idx[e]
                        v = i % w
                        at = base + (i if la < 0 else local[la + i]) - v
                        x, d = val[e], ba + v * w
                        seg, b = row_tile[at : at + w], basis[d : d + w]  # slices: a vectorised loop
                        for m in range(w):
                            seg[m] += x * b[m]
            buf[start : start + size] = row_tile


@compiled
def spread_part(
    buf: np.ndarray, idx: np.ndarray, val: np.ndarray, base: np.ndarray, local: np.ndarray, w: int,
    basis: np.ndarray,
) -> bool:  # fmt: skip
    """``buf[row of entry] += val[c, e] * basis[v, :]`` for every entry of one part ``(n, k)``, chunk
    by chunk; False (before adding anything) when an index lies outside ``[0, local.size)``.

    Entry ``(c, e)`` with index ``i`` sits at ``base[c] + local[i]``, column ``v = i % w`` of its
    row. ``idx`` int64 and ``val`` float32, both C-contiguous; ``basis`` the ``(w, w)`` float32
    basis, flat.
    """
    n, k = idx.shape
    cn = local.size
    for c in range(n):
        for e in range(k):
            i = idx[c, e]
            if i < 0 or i >= cn:
                return False
    for c in range(n):
        for e in range(k):
            i = idx[c, e]
            v = i % w
            at = base[c] + local[i] - v
            x = val[c, e]
            seg, b = buf[at : at + w], basis[v * w : (v + 1) * w]
            for m in range(w):
                seg[m] += x * b[m]
    return True
