"""Value coding for transmitted DCT coefficients (pure numpy): fp32, fp16, bf16, int8, 1-bit sign.

INT8 and SIGN1 carry one scale per chunk as a log-scale code ``q`` (scale = 2**(q/8), exact
float32 via an 8-entry table and ldexp); the payload sends the codes of all chunks as deltas
with the adaptive bucket code, typically 2-4 bits per chunk. The exact formulas are in
docs/protocol-payload.md; ``quantise`` returns the values exactly as ``dequantise`` rebuilds
them, bit for bit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from distronet.protocol.errors import KernelError, RejectCode, Rejected

__all__ = [
    "Q_MAX",
    "Q_MIN",
    "SCALE_BMAX",
    "SCALE_TABLE",
    "SIGN1_FINE_K",
    "ZERO_SCALE",
    "CodedValues",
    "ValueCoding",
    "dequantise",
    "quantise",
    "scale_from_code",
    "scales_from_codes",
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

    def scale_step(self, k: int) -> int:
        """q = c * scale_step(k) for a scale code c: SIGN1 at k < 16 moves in half octaves
        (a scale there costs ~4 bits per 4-16 coefficients; its values are one bit anyway)."""
        return 4 if self == ValueCoding.SIGN1 and k < SIGN1_FINE_K else 1

    def code_range(self, k: int) -> tuple[int, int]:
        """Smallest and largest valid scale code c: q = c * step must lie in [Q_MIN, Q_MAX]."""
        step = self.scale_step(k)
        return -(-Q_MIN // step), Q_MAX // step


#: float32(2**(r/8)) for r = 0..7, as IEEE-754 bit patterns (the spec lists the same hex).
SCALE_TABLE = np.array(
    [0x3F800000, 0x3F8B95C2, 0x3F9837F0, 0x3FA5FED7, 0x3FB504F3, 0x3FC5672A, 0x3FD744FD, 0x3FEAC0C7],
    dtype=np.uint32,
).view(np.float32)
#: Scale symbols on the wire are < 2**SCALE_BMAX: 0, or zigzag(delta) + 1 with |delta| <= 2031.
SCALE_BMAX = 12
#: Scale codes must lie in [Q_MIN, Q_MAX]: scales from 2**-126 (smallest normal) to 2**127.875.
Q_MIN = -1008
Q_MAX = 1023
#: A chunk's scale code c gives q = c * step (step 4 for SIGN1 below k = SIGN1_FINE_K, else 1);
#: ZERO_SCALE marks a chunk whose scale is 0.0.
SIGN1_FINE_K = 16
ZERO_SCALE = -(1 << 30)
_FP16_MAX = 65504.0
_BF16_MAX_BITS = 0x7F7F


@dataclass(frozen=True)
class CodedValues:
    """One tensor's coded values: little-endian ``data`` (float and INT8 codings), or ``signs``
    (bool, n*k, SIGN1); ``scale_codes`` int64 (n,) for INT8 and SIGN1 (ZERO_SCALE: scale 0)."""

    data: bytes = b""
    signs: np.ndarray | None = None
    scale_codes: np.ndarray | None = None


def value_section_len(coding: ValueCoding, count: int) -> int:
    """Bytes of the byte-stream values for ``count`` coefficients (0 for SIGN1: its bits travel apart)."""
    per = {ValueCoding.FP32: 4, ValueCoding.FP16: 2, ValueCoding.BF16: 2, ValueCoding.INT8: 1}
    return count * per.get(coding, 0)


def scale_from_code(q: np.ndarray) -> np.ndarray:
    """float32 scale 2**(q/8) for int64 codes in [Q_MIN, Q_MAX], exact: ldexp(T[q mod 8], q div 8)."""
    out: np.ndarray = np.ldexp(SCALE_TABLE[q & 7], (q >> 3).astype(np.int32)).astype(np.float32)
    return out


def scales_from_codes(c: np.ndarray, step: int) -> np.ndarray:
    """float32 scales of codes ``c`` (ZERO_SCALE -> 0.0) at ``step``; the caller checked their range."""
    nonzero = c != ZERO_SCALE
    q = np.where(nonzero, c * step, 0)
    out: np.ndarray = np.where(nonzero, scale_from_code(q), np.float32(0)).astype(np.float32)
    return out


def _scale_codes(val: np.ndarray, coding: ValueCoding) -> np.ndarray:
    """Per-chunk scale code c (or ZERO_SCALE): SIGN1 from mean |v|, INT8 from max |v| / 127."""
    mag = np.abs(val.astype(np.float64))
    step = coding.scale_step(val.shape[1])
    lo, hi = coding.code_range(val.shape[1])
    if coding == ValueCoding.SIGN1:
        s = mag.mean(axis=1)  # the L2-optimal magnitude for sign * s
        with np.errstate(divide="ignore"):
            c = np.rint(8.0 * np.log2(s) / step)
    else:
        s = mag.max(axis=1) / 127.0
        with np.errstate(divide="ignore"):
            c = np.ceil(8.0 * np.log2(s) / step)
    zero = s < 2.0**-126
    c = np.clip(np.where(zero, lo, c), lo, hi).astype(np.int64)
    out: np.ndarray = np.where(zero, ZERO_SCALE, c)
    return out


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
    codes = _scale_codes(v, coding)
    scale = scales_from_codes(codes, coding.scale_step(v.shape[1]))
    if coding == ValueCoding.SIGN1:
        neg = v < 0
        deq = np.where(neg, -scale[:, None], scale[:, None]).astype(np.float32)
        return CodedValues(signs=neg.reshape(-1), scale_codes=codes), deq
    safe = np.where(scale > 0, scale, np.float32(1))[:, None]
    ints = np.clip(np.rint(v / safe), -127, 127).astype(np.int8)
    deq = (ints.astype(np.float32) * scale[:, None]).astype(np.float32)
    return CodedValues(ints.tobytes(), scale_codes=codes), deq


def dequantise(coded: CodedValues, coding: ValueCoding, n_chunks: int, k: int) -> np.ndarray:
    """float32 (n_chunks, k) values from their wire form (lengths and scale codes already checked).

    Raises Rejected(NON_FINITE_VALUE) for NaN/Inf values, including INT8 products that overflow.
    """
    raw = coded.data
    if coding == ValueCoding.FP32:
        out = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif coding == ValueCoding.FP16:
        out = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif coding == ValueCoding.BF16:
        out = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        assert coded.scale_codes is not None
        scale = scales_from_codes(coded.scale_codes, coding.scale_step(k))[:, None]
        if coding == ValueCoding.SIGN1:
            assert coded.signs is not None
            out = np.where(coded.signs.reshape(n_chunks, k), -scale, scale).astype(np.float32)
        else:
            ints = np.frombuffer(raw, dtype=np.int8).reshape(n_chunks, k)
            with np.errstate(over="ignore"):  # an overflow to inf is rejected just below
                out = (ints.astype(np.float32) * scale).astype(np.float32)
    if not np.isfinite(out).all():
        raise Rejected(RejectCode.NON_FINITE_VALUE, f"{coding.name} values contain NaN or Inf")
    return out.reshape(n_chunks, k)
