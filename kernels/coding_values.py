"""Value coding for transmitted DCT coefficients (pure numpy): fp32, fp16, bf16, int8, 1-bit sign.

INT8 and SIGN1 carry one scale per chunk as a log-scale code ``q`` (scale = 2**(q/8), exact
float32 via an 8-entry table and ldexp); codes are sent per tensor as a signed base plus
fixed-width offsets, so a typical tensor spends 4-6 bits per chunk on its scales. The exact
formulas are in docs/protocol-payload.md; ``quantise`` returns the values exactly as
``dequantise`` rebuilds them, bit for bit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import BitReader, pack_fields
from distronet.protocol.errors import KernelError, RejectCode, Rejected

__all__ = [
    "MAX_SCALE_WIDTH",
    "Q_MAX",
    "Q_MIN",
    "SCALE_TABLE",
    "CodedValues",
    "ValueCoding",
    "decode_scales",
    "dequantise",
    "quantise",
    "scale_from_code",
    "value_section_len",
]


class ValueCoding(enum.IntEnum):
    """How values travel. Numbers are on the wire: never renumber."""

    FP32 = 1
    FP16 = 2
    BF16 = 3
    INT8 = 4  # int8 in [-127, 127] times a per-chunk scale
    SIGN1 = 5  # one sign bit times a per-chunk scale

    @property
    def has_scale(self) -> bool:
        return self in (ValueCoding.INT8, ValueCoding.SIGN1)


#: float32(2**(r/8)) for r = 0..7, as IEEE-754 bit patterns (the spec lists the same hex).
SCALE_TABLE = np.array(
    [0x3F800000, 0x3F8B95C2, 0x3F9837F0, 0x3FA5FED7, 0x3FB504F3, 0x3FC5672A, 0x3FD744FD, 0x3FEAC0C7],
    dtype=np.uint32,
).view(np.float32)
#: Scale codes must lie in [Q_MIN, Q_MAX]: scales from 2**-126 (smallest normal) to 2**127.875.
Q_MIN = -1008
Q_MAX = 1023
#: Widest scale-offset field: offsets run from 1 to Q_MAX - Q_MIN + 1 = 2032 (< 2**11).
MAX_SCALE_WIDTH = 11
_FP16_MAX = 65504.0
_BF16_MAX_BITS = 0x7F7F


@dataclass(frozen=True)
class CodedValues:
    """One tensor's coded values: ``values`` bytes, and for INT8/SIGN1 the scale code fields."""

    values: bytes
    scale_base: int = 0
    scale_width: int = 0
    scales: bytes = b""


def value_section_len(coding: ValueCoding, count: int) -> int:
    """Byte length of the value section for ``count`` coefficients (fixed by coding and count)."""
    per = {ValueCoding.FP32: 32, ValueCoding.FP16: 16, ValueCoding.BF16: 16, ValueCoding.INT8: 8}
    return (count * per.get(coding, 1) + 7) // 8


def scale_from_code(q: np.ndarray) -> np.ndarray:
    """float32 scale 2**(q/8) for int64 codes in [Q_MIN, Q_MAX], exact: ldexp(T[q mod 8], q div 8)."""
    out: np.ndarray = np.ldexp(SCALE_TABLE[q & 7], (q >> 3).astype(np.int32)).astype(np.float32)
    return out


def _scale_codes(val: np.ndarray, coding: ValueCoding) -> np.ndarray:
    """Per-chunk code q, or Q_MIN - 1 for a chunk whose scale is zero."""
    mag = np.abs(val.astype(np.float64))
    if coding == ValueCoding.SIGN1:
        s = mag.mean(axis=1)  # the L2-optimal magnitude for sign * s
        with np.errstate(divide="ignore"):
            q = np.rint(8.0 * np.log2(s))
    else:
        s = mag.max(axis=1) / 127.0
        with np.errstate(divide="ignore"):
            q = np.ceil(8.0 * np.log2(s))
    zero = s < 2.0**-126
    q = np.clip(np.where(zero, Q_MIN, q), Q_MIN, Q_MAX).astype(np.int64)
    return np.where(zero, Q_MIN - 1, q)


def quantise(val: np.ndarray, coding: ValueCoding) -> tuple[CodedValues, np.ndarray]:
    """Code ``val`` float32 (n_chunks, k); returns (coded, dequantised float32 (n_chunks, k)).

    Raises KernelError on NaN/Inf. fp16/bf16 clamp to their largest finite value.
    """
    v = np.ascontiguousarray(val, dtype=np.float32)
    if v.ndim != 2:
        raise KernelError(f"values must be (n_chunks, k), got shape {v.shape}")
    if not np.isfinite(v).all():
        raise KernelError("values contain NaN or Inf")
    if coding == ValueCoding.FP32:
        return CodedValues(v.astype("<f4").tobytes()), v.copy()
    if coding == ValueCoding.FP16:
        h = np.clip(v, -_FP16_MAX, _FP16_MAX).astype("<f2")
        return CodedValues(h.tobytes()), h.astype(np.float32)
    if coding == ValueCoding.BF16:
        u = v.view(np.uint32).astype(np.uint64)
        b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32)
        overflow = (b & 0x7F80) == 0x7F80
        b = np.where(overflow, (b & 0x8000) | _BF16_MAX_BITS, b).astype("<u2")
        return CodedValues(b.tobytes()), (b.astype(np.uint32) << 16).view(np.float32)
    q = _scale_codes(v, coding)
    nonzero = q >= Q_MIN
    base = int(q[nonzero].min()) if nonzero.any() else 0
    z = np.where(nonzero, q - base + 1, 0)
    width = int(z.max()).bit_length() if z.size else 0
    scale = np.where(nonzero, scale_from_code(np.where(nonzero, q, 0)), np.float32(0)).astype(np.float32)
    scales = pack_fields(z, width)
    if coding == ValueCoding.SIGN1:
        neg = v < 0
        deq = np.where(neg, -scale[:, None], scale[:, None]).astype(np.float32)
        return CodedValues(np.packbits(neg.reshape(-1)).tobytes(), base, width, scales), deq
    safe = np.where(scale > 0, scale, np.float32(1))[:, None]
    ints = np.clip(np.rint(v / safe), -127, 127).astype(np.int8)
    deq = (ints.astype(np.float32) * scale[:, None]).astype(np.float32)
    return CodedValues(ints.tobytes(), base, width, scales), deq


def decode_scales(scales: bytes, n_chunks: int, base: int, width: int) -> np.ndarray:
    """float32 (n_chunks,) scales from their wire fields. Rejects codes outside [Q_MIN, Q_MAX]."""
    if width > MAX_SCALE_WIDTH:
        raise Rejected(RejectCode.MALFORMED, f"scale width {width} > {MAX_SCALE_WIDTH}")
    reader = BitReader(scales, "scale section")
    z = reader.fields(n_chunks, width)
    reader.finish()
    q = base + z - 1
    nonzero = z > 0
    if ((q < Q_MIN) | (q > Q_MAX))[nonzero].any():
        raise Rejected(RejectCode.NON_FINITE_VALUE, "a scale code is outside the finite normal range")
    out: np.ndarray = np.where(nonzero, scale_from_code(np.where(nonzero, q, 0)), np.float32(0))
    return out.astype(np.float32)


def dequantise(coded: CodedValues, coding: ValueCoding, n_chunks: int, k: int) -> np.ndarray:
    """float32 (n_chunks, k) values from their wire form; the caller has checked section lengths.

    Raises Rejected(NON_FINITE_VALUE) for NaN/Inf values or out-of-range scales, MALFORMED for
    non-zero padding bits.
    """
    count = n_chunks * k
    raw = coded.values
    if coding == ValueCoding.FP32:
        out = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif coding == ValueCoding.FP16:
        out = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif coding == ValueCoding.BF16:
        out = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        scale = decode_scales(coded.scales, n_chunks, coded.scale_base, coded.scale_width)[:, None]
        if coding == ValueCoding.SIGN1:
            bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))
            if bits[count:].any():
                raise Rejected(RejectCode.MALFORMED, "sign section: non-zero padding bits")
            neg = bits[:count].reshape(n_chunks, k).astype(bool)
            out = np.where(neg, -scale, scale).astype(np.float32)
        else:
            ints = np.frombuffer(raw, dtype=np.int8).reshape(n_chunks, k)
            with np.errstate(over="ignore"):  # an overflow to inf is rejected just below
                out = (ints.astype(np.float32) * scale).astype(np.float32)
    if not np.isfinite(out).all():
        raise Rejected(RejectCode.NON_FINITE_VALUE, f"{coding.name} values contain NaN or Inf")
    return out.reshape(n_chunks, k)
