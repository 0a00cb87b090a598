"""Vectorised bit streams and varints for the payload codec (pure numpy).

Every bit stream in the payload is MSB-first: the first field's most significant bit is the
most significant bit (0x80) of the first byte; the last byte is padded with zero bits.
Varints are unsigned LEB128 in their shortest form (low 7 bits first, 0x80 = "more bytes").
"""

from __future__ import annotations

import numpy as np

from distronet.protocol.errors import RejectCode, Rejected

__all__ = [
    "ByteReader",
    "check_padding",
    "from_bytes",
    "pack_fields",
    "pack_unary",
    "read_fields",
    "read_unary",
    "to_bytes",
    "varint",
    "zigzag",
]

#: Longest varint accepted: 5 bytes, i.e. values below 2**35.
_MAX_VARINT_BYTES = 5


def varint(value: int) -> bytes:
    """Shortest unsigned LEB128 encoding of ``0 <= value < 2**35``."""
    if not 0 <= value < 1 << (7 * _MAX_VARINT_BYTES):
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def zigzag(value: int) -> int:
    """Map a signed int to unsigned: 0, -1, 1, -2, 2 -> 0, 1, 2, 3, 4."""
    return 2 * value if value >= 0 else -2 * value - 1


class ByteReader:
    """A cursor over untrusted bytes; every read is bounds-checked and raises ``Rejected``."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        """The next ``n`` bytes; TRUNCATED when fewer remain."""
        if n > self.remaining:
            raise Rejected(RejectCode.TRUNCATED, f"{what}: need {n} bytes, {self.remaining} left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def varint(self, what: str) -> int:
        """An unsigned LEB128 varint; MALFORMED when longer than 5 bytes or not minimal."""
        value = 0
        for i in range(_MAX_VARINT_BYTES):
            byte = self.u8(what)
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if byte == 0 and i > 0:
                    raise Rejected(RejectCode.MALFORMED, f"{what}: varint not in shortest form")
                return value
        raise Rejected(RejectCode.MALFORMED, f"{what}: varint longer than {_MAX_VARINT_BYTES} bytes")

    def svarint(self, what: str) -> int:
        """A zigzag-coded signed varint."""
        u = self.varint(what)
        return (u >> 1) ^ -(u & 1)


def pack_fields(values: np.ndarray, width: int) -> np.ndarray:
    """MSB-first bit stream of ``values`` (non-negative, each < 2**width) in ``width`` bits each.

    Returns a boolean/uint8 bit array (one element per bit), not yet packed into bytes, so
    several streams can be concatenated. Cost O(len(values) * width).
    """
    v = np.asarray(values, dtype=np.uint64).reshape(-1)
    if width == 0 or v.size == 0:
        return np.zeros(0, dtype=np.uint8)
    shifts = np.arange(width - 1, -1, -1, dtype=np.uint64)
    return ((v[:, None] >> shifts[None, :]) & np.uint64(1)).astype(np.uint8).reshape(-1)


def read_fields(bits: np.ndarray, count: int, width: int) -> np.ndarray:
    """Inverse of :func:`pack_fields` over the first ``count * width`` bits; int64 array.

    The caller has checked ``bits.size >= count * width`` and ``width <= 62``.
    """
    if width == 0 or count == 0:
        return np.zeros(count, dtype=np.int64)
    b = bits[: count * width].reshape(count, width).astype(np.int64)
    weights = np.left_shift(np.int64(1), np.arange(width - 1, -1, -1, dtype=np.int64))
    out: np.ndarray = b @ weights
    return out


def pack_unary(values: np.ndarray) -> np.ndarray:
    """Unary bit stream: value q is q one-bits followed by one zero-bit. Cost O(sum(values) + n)."""
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    ends = np.cumsum(v + 1) - 1  # position of each terminating zero
    total = int(ends[-1]) + 1 if v.size else 0
    bits = np.ones(total, dtype=np.uint8)
    bits[ends] = 0
    return bits


def read_unary(bits: np.ndarray, count: int, what: str) -> tuple[np.ndarray, int]:
    """Read ``count`` unary values from the start of ``bits``; returns (values, bits consumed).

    TRUNCATED when the stream holds fewer than ``count`` terminating zeros.
    """
    if count == 0:
        return np.zeros(0, dtype=np.int64), 0
    zeros = np.flatnonzero(bits == 0)
    if zeros.size < count:
        raise Rejected(RejectCode.TRUNCATED, f"{what}: {zeros.size} of {count} unary codes present")
    ends = zeros[:count].astype(np.int64)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    return ends - starts, int(ends[-1]) + 1


def to_bytes(bits: np.ndarray) -> bytes:
    """Pack a bit array MSB-first into bytes, zero-padding the last byte."""
    return np.packbits(bits.astype(np.uint8, copy=False)).tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    """Unpack bytes into a uint8 bit array (8 elements per byte), MSB-first."""
    return np.unpackbits(np.frombuffer(data, dtype=np.uint8))


def check_padding(bits: np.ndarray, used: int, what: str) -> None:
    """MALFORMED unless the stream is exactly ``used`` bits rounded up to a byte, zero-padded."""
    if (used + 7) // 8 * 8 != bits.size:
        raise Rejected(RejectCode.MALFORMED, f"{what}: {bits.size // 8} bytes for {used} bits")
    if bits[used:].any():
        raise Rejected(RejectCode.MALFORMED, f"{what}: non-zero padding bits")
