"""The adaptive bucket code for small non-negative integers (index gaps, scale deltas).

A symbol ``x >= 0`` has bucket ``b = bitlen(x)`` and, when ``b >= 2``, a mantissa of ``b - 1``
bits (``x = 2**(b-1) + mantissa``). Buckets are coded with parameters ``(b0, w)``: the bucket's
place ``rho`` in the centre-out order ``b0, b0+1, b0-1, b0+2, ...`` goes in a ``w``-bit field,
with ``2**w - 1`` meaning "escape: the rest follows in unary". Fields, escapes and mantissas
are separate streams, so both directions are whole-array numpy operations.
"""

from __future__ import annotations

import functools

import numpy as np

from distronet.kernels.coding_bits import BitReader, unary_fields
from distronet.protocol.errors import RejectCode, Rejected

__all__ = [
    "MAX_FIELD_WIDTH",
    "Part",
    "best_params",
    "buckets_of",
    "escape_parts",
    "field_parts",
    "mantissa_parts",
    "read_buckets",
    "symbols_from",
]

MAX_FIELD_WIDTH = 4
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
    hist = np.bincount(buckets, minlength=bmax + 1)
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
