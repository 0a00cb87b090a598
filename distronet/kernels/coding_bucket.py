"""The adaptive bucket code for small non-negative integers (index gaps, scale deltas).

A symbol ``x >= 0`` has bucket ``b = bitlen(x)`` and, when ``b >= 2``, a mantissa of ``b - 1``
bits (``x = 2**(b-1) + mantissa``). Buckets are coded with parameters ``(b0, w)``: the bucket's
place ``rho`` in the centre-out order ``b0, b0+1, b0-1, b0+2, ...`` goes in a ``w``-bit field,
with ``2**w - 1`` meaning "escape: the rest follows in unary". ``w = 7`` selects a Rice code
instead: ``x >> b0`` in unary (in the escape stream) and the low ``b0`` bits as the mantissa.
Fields, escapes and mantissas are separate streams, so both directions are whole-array numpy
operations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from distronet.kernels.coding_bits import BitReader, unary_fields
from distronet.protocol.errors import RejectCode, Rejected

__all__ = [
    "MAX_FIELD_WIDTH",
    "RICE",
    "Part",
    "best_params",
    "best_params_hist",
    "buckets_of",
    "check_params",
    "choose_params",
    "class_parts",
    "class_values",
    "escape_parts",
    "field_parts",
    "finish_class",
    "mantissa_parts",
    "read_buckets",
    "rice_best",
    "start_class",
    "symbols_from",
]

MAX_FIELD_WIDTH = 4
RICE = 7  # the w value selecting a Rice code with parameter b0
_MAX_QUOTIENT = 24  # encoders use Rice only where every unary quotient fits one packed field
Part = tuple[np.ndarray, np.ndarray]  # (values, widths) of consecutive bit fields


def buckets_of(x: np.ndarray) -> np.ndarray:
    """bitlen of each non-negative int (0 for 0), exact below 2**53 (frexp exponent)."""
    _, e = np.frexp(x.astype(np.float64))
    out: np.ndarray = e.astype(np.int64)
    return out


@functools.lru_cache(maxsize=512)
def centre_out(b0: int, bmax: int) -> np.ndarray:
    """Buckets 0..bmax in the order b0, b0+1, b0-1, b0+2, b0-2, ... (skipping those outside)."""
    order = [b0]
    for d in range(1, bmax + 1):
        order += [b for b in (b0 + d, b0 - d) if 0 <= b <= bmax]
    return np.array(order, dtype=np.int64)


@functools.lru_cache(maxsize=32)
def _tables(bmax: int) -> tuple[np.ndarray, np.ndarray]:
    """(orders[b0, place] -> bucket, costs[w, place] -> field + escape bits)."""
    orders = np.stack([centre_out(b0, bmax) for b0 in range(bmax + 1)])
    rho = np.arange(bmax + 1)
    costs = np.stack(
        [w + np.where(rho < (1 << w) - 1, 0, rho - (1 << w) + 2) for w in range(MAX_FIELD_WIDTH + 1)]
    )
    return orders, costs


def best_params(buckets: np.ndarray, bmax: int) -> tuple[int, int, int]:
    """(bits including mantissas, b0, w) of the cheapest parameters for these buckets."""
    if buckets.size == 0:
        return 0, 0, 0
    return best_params_hist(np.bincount(buckets, minlength=bmax + 1), bmax)


def best_params_hist(hist: np.ndarray, bmax: int) -> tuple[int, int, int]:
    """:func:`best_params` of the buckets' histogram ``hist`` int64 ``(bmax + 1,)``."""
    orders, costs = _tables(bmax)
    total = hist[orders] @ costs.T  # (b0, w)
    b0, w = np.unravel_index(int(np.argmin(total)), total.shape)
    mantissa = int((hist[2:] * np.arange(1, bmax)).sum())
    return int(total[b0, w]) + mantissa, int(b0), int(w)


def _places(buckets: np.ndarray, b0: int, bmax: int) -> np.ndarray:
    place = np.empty(bmax + 1, dtype=np.int64)
    place[centre_out(b0, bmax)] = np.arange(bmax + 1)
    out: np.ndarray = place[buckets]
    return out


def field_parts(buckets: np.ndarray, b0: int, w: int, bmax: int) -> Part:
    """The ``w``-bit fields of these buckets."""
    rho = _places(buckets, b0, bmax)
    return np.minimum(rho, (1 << w) - 1), np.full(rho.size, w, dtype=np.int64)


def escape_parts(buckets: np.ndarray, b0: int, w: int, bmax: int) -> Part:
    """The unary escapes of the buckets whose place does not fit a field."""
    rho = _places(buckets, b0, bmax)
    lim = (1 << w) - 1
    return unary_fields(rho[rho >= lim] - lim)


def mantissa_parts(x: np.ndarray, buckets: np.ndarray) -> Part:
    """The low ``b - 1`` bits of each symbol with bucket ``b >= 2``."""
    width = np.maximum(buckets - 1, 0)
    return x & ((np.int64(1) << width) - 1), width


def read_buckets(reader: BitReader, fields: np.ndarray, b0: int, w: int, bmax: int) -> np.ndarray:
    """Buckets from already-read ``fields``, taking escapes from ``reader``. MALFORMED past bmax."""
    lim = (1 << w) - 1
    esc = fields >= lim
    rho = fields.copy()
    rho[esc] = lim + reader.unary(int(esc.sum()), max(bmax - lim, 0))
    if rho.size and int(rho.max()) > bmax:
        raise Rejected(RejectCode.MALFORMED, f"{reader.what}: bucket code beyond bucket {bmax}")
    out: np.ndarray = centre_out(b0, bmax)[rho]
    return out


def symbols_from(reader: BitReader, buckets: np.ndarray) -> np.ndarray:
    """Symbols from their buckets, reading the mantissas from ``reader``."""
    width = np.maximum(buckets - 1, 0)
    mant = reader.varwidth(width)
    out: np.ndarray = np.where(buckets >= 1, (np.int64(1) << width) + mant, 0)
    return out


def _rice_best(x: np.ndarray, bmax: int) -> tuple[int, int]:
    """(bits, m) of the best Rice parameter, searched around log2 of the mean."""
    return rice_best(float(x.mean()), int(x.max()), x.size, lambda m: int((x >> m).sum()), bmax)


def rice_best(mean: float, top: int, size: int, shifted: Callable[[int], int], bmax: int) -> tuple[int, int]:
    """:func:`_rice_best` from the symbols' mean, largest and count, and ``shifted(m)`` =
    ``sum(x >> m)`` (asked for at most three ``m``)."""
    m0 = max(0, int(np.log2(mean + 1.0)) - 1)
    best = (1 << 62, 0)
    for m in range(max(0, m0 - 1), min(bmax, m0 + 2) + 1):
        if top >> m <= _MAX_QUOTIENT:
            best = min(best, (shifted(m) + size * (1 + m), m))
    return best


def choose_params(x: np.ndarray, bmax: int) -> tuple[int, int]:
    """(b0, w) minimising the bits of symbols ``x``: a bucket code, or ``w = RICE`` with m = b0."""
    if x.size == 0:
        return 0, 0
    cost, b0, w = best_params(buckets_of(x), bmax)
    rice, m = _rice_best(x, bmax)
    return (m, RICE) if rice < cost else (b0, w)


def class_parts(x: np.ndarray, b0: int, w: int, bmax: int) -> tuple[Part, Part, Part]:
    """(fields, escapes, mantissas) of symbols ``x`` under (b0, w)."""
    if w == RICE:
        empty = np.zeros(0, dtype=np.int64)
        return (empty, empty), unary_fields(x >> b0), (x & ((1 << b0) - 1), np.full(x.size, b0))
    b = buckets_of(x)
    return field_parts(b, b0, w, bmax), escape_parts(b, b0, w, bmax), mantissa_parts(x, b)


def check_params(b0: int, w: int, bmax: int, what: str) -> None:
    """MALFORMED unless (b0, w) is a valid parameter pair for buckets up to ``bmax``."""
    if b0 > bmax or not (w <= MAX_FIELD_WIDTH or w == RICE):
        raise Rejected(RejectCode.MALFORMED, f"{what}: parameters b0={b0} w={w} (largest bucket {bmax})")


def start_class(reader: BitReader, count: int, b0: int, w: int) -> np.ndarray:
    """Read a class's fields (none for Rice)."""
    return reader.fields(count, 0 if w == RICE else w)


def finish_class(
    reader: BitReader, fields: np.ndarray, b0: int, w: int, bmax: int
) -> tuple[np.ndarray, np.ndarray]:
    """Read a class's escapes: (prefix, mantissa widths), prefix = buckets or Rice quotients."""
    if w == RICE:
        q = reader.unary(fields.size, ((1 << bmax) - 1) >> b0)
        return q, np.full(q.size, b0, dtype=np.int64)
    b = read_buckets(reader, fields, b0, w, bmax)
    return b, np.maximum(b - 1, 0)


def class_values(prefix: np.ndarray, mant: np.ndarray, b0: int, w: int) -> np.ndarray:
    """Symbols from a class's prefix and its mantissas."""
    if w == RICE:
        out: np.ndarray = (prefix << b0) + mant
        return out
    width = np.maximum(prefix - 1, 0)
    res: np.ndarray = np.where(prefix >= 1, (np.int64(1) << width) + mant, 0)
    return res
