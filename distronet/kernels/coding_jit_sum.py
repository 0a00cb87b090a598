"""Compiled value dequantisation, bit packing and error feedback (numba), for payloads.

Loops that used to be a dozen numpy passes per packet:

* :func:`values` turns a payload's value section, per-chunk scales and sign bits into the
  float32 value of every output slot (wire values moved along the walk's permutation), with the
  finiteness check of every coding but SIGN1. Bit-exact with numpy's conversions: fp32 and bf16
  are bit copies, fp16 goes through a table of numpy's own conversion of every half, int8 is
  ``float32(q) * scale`` (one float32 rounding, as ``np.multiply(q, scale, dtype=float32)``),
  sign1 is ``±scale``.
* :func:`pack` writes a payload's bit fields MSB-first, field by field, the bytes
  :func:`coding_bits.pack_bits` builds with eleven whole-array passes.

All are called with arrays the caller built and checked (:mod:`coding_fast`,
:mod:`decode`); they never raise. ``numba`` is optional (:data:`HAVE_JIT`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

__all__ = [
    "BAD_VALUE",
    "HALF_BITS",
    "HAVE_JIT",
    "F",
    "compiled",
    "feed_back",
    "inlined",
    "pack",
    "values",
]

F = TypeVar("F", bound=Callable[..., Any])

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; kept optional for odd platforms
    HAVE_JIT = False
else:
    HAVE_JIT = True


def compiled(fn: F) -> F:
    """``fn`` compiled by numba (cached on disk, no GIL, no bounds checks); ``fn`` itself without numba."""
    if not HAVE_JIT:  # pragma: no cover
        return fn
    return cast(F, numba.njit(cache=True, nogil=True, boundscheck=False)(fn))


def inlined(fn: F) -> F:
    """:func:`compiled`, inlined into each compiled caller (numba IR inlining): no call, and no
    reference counting of the array arguments, per call. Called only from compiled code."""
    if not HAVE_JIT:  # pragma: no cover
        return fn
    return cast(F, numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")(fn))


BAD_VALUE = 2  # status: a value is NaN or infinite
_FP32, _FP16, _BF16, _INT8, _SIGN1 = 1, 2, 3, 4, 5
_EXP32 = 0x7F800000


def _half_table() -> np.ndarray:
    """float32 bit pattern of every IEEE half, by numpy's own (exact) conversion. (Bytes are read
    in place below, not by a helper: a compiled helper taking an array costs two atomic
    reference-count updates per call.)"""
    out: np.ndarray = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    return out


HALF_BITS = _half_table()  # 256 KiB; passed to :func:`values`


@compiled
def values(
    buf: np.ndarray, vstart: int, sign_start: int, n: np.ndarray, k: np.ndarray, offsets: np.ndarray,
    vc: np.ndarray, voff: np.ndarray, soff: np.ndarray, goff: np.ndarray, perm: np.ndarray, moved: bool,
    scales: np.ndarray, half: np.ndarray, out: np.ndarray,
) -> int:  # fmt: skip
    """Fill ``out`` (float32, one per output slot); 0, or :data:`BAD_VALUE` on a non-finite value.

    Per tensor ``t``: value coding ``vc[t]``, its values' byte offset ``voff[t]`` from
    ``vstart``, its first chunk's row in ``scales`` (``soff[t]``, scaled codings) and its sign
    bits' offset ``goff[t]`` from bit ``sign_start`` (SIGN1). Output slot ``i`` of tensor ``t``
    takes wire value ``perm[i]`` when ``moved`` (a walk's sort moved it), else its own.
    ``half`` is :data:`HALF_BITS`.
    """
    bits = out.view(np.uint32)
    for t in range(n.size):
        kt, off, code = k[t], offsets[t], vc[t]
        at = vstart + voff[t]
        count = n[t] * kt
        if code == _FP32:
            for i in range(off, off + count):
                a = at + 4 * (perm[i] - off if moved else i - off)
                b = int(buf[a]) | (int(buf[a + 1]) << 8) | (int(buf[a + 2]) << 16) | (int(buf[a + 3]) << 24)
                if b & _EXP32 == _EXP32:
                    return BAD_VALUE
                bits[i] = b
        elif _FP16 <= code <= _BF16:
            for i in range(off, off + count):
                a = at + 2 * (perm[i] - off if moved else i - off)
                h = int(buf[a]) | (int(buf[a + 1]) << 8)
                b = half[h] if code == _FP16 else h << 16
                if b & _EXP32 == _EXP32:
                    return BAD_VALUE
                bits[i] = b
        elif code == _INT8:
            for c in range(n[t]):
                scale = scales[soff[t] + c]
                for i in range(off + c * kt, off + (c + 1) * kt):
                    q = int(buf[at + (perm[i] - off if moved else i - off)])
                    v = np.float32(q - 256 if q > 127 else q) * scale
                    if not np.isfinite(v):
                        return BAD_VALUE
                    out[i] = v
        else:
            g0 = sign_start + goff[t]
            for c in range(n[t]):
                scale = scales[soff[t] + c]
                for i in range(off + c * kt, off + (c + 1) * kt):
                    g = g0 + (perm[i] - off if moved else i - off)
                    out[i] = -scale if (buf[g >> 3] >> (7 - (g & 7))) & 1 else scale
    return 0


@compiled
def pack(values: np.ndarray, widths: np.ndarray, out: np.ndarray) -> None:
    """Field ``i`` (the low ``widths[i]`` bits of ``values[i]``, ``0 <= widths[i] <= 64``) after
    field ``i - 1``, MSB-first, into ``out`` uint8 (``ceil(sum(widths) / 8)`` bytes; the last
    byte zero-padded). ``values`` and ``widths`` int64 ``(n,)``. A field over 32 bits goes in as
    its high and low halves, so the accumulator never holds more than 39 bits."""
    acc, nacc, pos = 0, 0, 0
    for i in range(values.shape[0]):
        w = widths[i]
        if w == 0:
            continue
        v = values[i]
        if w > 32:
            acc = (acc << (w - 32)) | ((v >> 32) & ((1 << (w - 32)) - 1))
            nacc += w - 32
            while nacc >= 8:
                nacc -= 8
                out[pos] = (acc >> nacc) & 0xFF
                pos += 1
            acc &= (1 << nacc) - 1
            w = 32
        acc = (acc << w) | (v & ((1 << w) - 1))
        nacc += w
        while nacc >= 8:
            nacc -= 8
            out[pos] = (acc >> nacc) & 0xFF
            pos += 1
        acc &= (1 << nacc) - 1
    if nacc:
        out[pos] = (acc << (8 - nacc)) & 0xFF


@compiled
def feed_back(
    flat: np.ndarray, idx: np.ndarray, val: np.ndarray, cols: int, br: int, bc: int, sign: float
) -> None:
    """``flat[p] = flat[p] - val`` (``sign < 0``) or ``flat[p] + val`` for each chunk-order entry
    ``(n, j)``: ``flat`` float32 is a ``(rows, cols)`` spatial buffer of ``br x bc`` blocks, chunk
    ``n`` the block at block row ``n // (cols / bc)``, entry ``idx[n, j]`` int64 its coefficient
    (row ``// bc``, column ``% bc``), ``val`` float32 ``(N, k)``. Indices distinct within a row
    (a selection's), so each position is written once. It never raises."""
    gc = cols // bc
    for n in range(idx.shape[0]):
        base = (n // gc) * (br * cols) + (n % gc) * bc
        for j in range(idx.shape[1]):
            i = idx[n, j]
            p = base + (i // bc) * cols + i % bc
            if sign < 0:
                flat[p] = flat[p] - val[n, j]
            else:
                flat[p] = flat[p] + val[n, j]
