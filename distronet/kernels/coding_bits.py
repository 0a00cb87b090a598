"""Vectorised bit streams and varints for the payload codec (pure numpy).

Every bit stream in the payload is MSB-first: the first field's most significant bit is the
most significant bit (0x80) of the first byte; the last byte is padded with zero bits.
Varints are unsigned LEB128 in their shortest form (low 7 bits first, 0x80 = "more bytes").
"""

from __future__ import annotations

import numpy as np

from distronet.kernels.jit_state import use_jit
from distronet.protocol.errors import RejectCode, Rejected

__all__ = [
    "BitReader",
    "ByteReader",
    "append_flags",
    "pack_bits",
    "pack_fields",
    "unary_fields",
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


def pack_bits(values: np.ndarray, widths: np.ndarray) -> bytes:
    """Concatenate fields MSB-first: value i in ``widths[i]`` bits (0 <= widths <= 64, values < 2**width).

    Zero-pads the last byte. Once the compiled code is warm (:func:`jit_state.use_jit`) one
    compiled loop writes the fields (:func:`coding_jit_sum.pack`, the same bytes); else
    vectorised: each field lands in one or two big-endian 64-bit words; the parts landing in a
    word are OR-ed by one ``reduceat`` (fields are in order, so a word's parts are contiguous).
    Cost O(len(values)).
    """
    if use_jit():
        from distronet.kernels.coding_jit_sum import pack

        wi = np.ascontiguousarray(widths, dtype=np.int64).reshape(-1)
        out = np.empty((int(wi.sum()) + 7) // 8, dtype=np.uint8)
        pack(np.ascontiguousarray(values).reshape(-1).astype(np.int64, copy=False), wi, out)
        return out.tobytes()
    w = np.asarray(widths, dtype=np.uint64).reshape(-1)
    v = np.asarray(values).reshape(-1).astype(np.uint64)
    if (w == 0).any():  # zero-width fields hold nothing (and may sit just past the last word)
        v, w = v[w > 0], w[w > 0]
    if w.size == 0:
        return b""
    end = np.cumsum(w)
    total = int(end[-1])
    start = end - w
    at = (start >> np.uint64(6)).astype(np.intp)
    tail = end - (start & ~np.uint64(63))  # bits from the word's start to the field's end
    fits = tail <= 64
    left = np.where(fits, np.uint64(64) - tail, np.uint64(0))
    right = np.where(fits, np.uint64(0), tail - np.uint64(64))
    head = (v << left) >> right  # the part of each field inside its first word
    words = np.zeros((total + 63) // 64 + 1, dtype=np.uint64)
    first = np.flatnonzero(np.diff(at, prepend=-1))
    words[at[first]] = np.bitwise_or.reduceat(head, first)
    spill = np.flatnonzero(~fits)
    if spill.size:  # at most one spilling field per word boundary: plain fancy OR is safe
        words[at[spill] + 1] |= v[spill] << (np.uint64(128) - tail[spill])
    return words.astype(">u8").tobytes()[: (total + 7) // 8]


def append_flags(data: bytes, nbits: int, flags: np.ndarray) -> bytes:
    """Append single bits after the first ``nbits`` bits of ``data`` (a packed, zero-padded stream)."""
    used = nbits & 7
    if not used:
        return data + np.packbits(flags.astype(np.uint8, copy=False)).tobytes()
    lead = np.unpackbits(np.frombuffer(data[-1:], dtype=np.uint8))[:used]
    tail = np.packbits(np.concatenate([lead, flags.astype(np.uint8, copy=False)])).tobytes()
    return data[:-1] + tail


def pack_fields(values: np.ndarray, width: int) -> bytes:
    """``values`` (each < 2**width, width <= 25) in ``width`` bits each, MSB-first, as bytes."""
    v = np.asarray(values, dtype=np.int64).reshape(-1)
    return pack_bits(v, np.full(v.size, width, dtype=np.int64))


def unary_fields(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, widths) of unary codes: q one-bits then a zero-bit (q <= 24)."""
    q = np.asarray(q, dtype=np.int64)
    return (np.int64(1) << (q + 1)) - 2, q + 1


class BitReader:
    """MSB-first fields out of an untrusted byte string; reads past the end raise TRUNCATED."""

    def __init__(self, data: bytes, what: str) -> None:
        self.nbits = 8 * len(data)
        self.buf = np.frombuffer(bytes(data) + bytes(4), dtype=np.uint8)
        self.pos = 0
        self.what = what

    def _need(self, n: int) -> None:
        if self.pos + n > self.nbits:
            raise Rejected(RejectCode.TRUNCATED, f"{self.what}: {n} bits past bit {self.pos} of {self.nbits}")

    def _gather(self, start: np.ndarray, w: np.ndarray) -> np.ndarray:
        at = start >> 3
        b = self.buf
        word = (
            (b[at].astype(np.int64) << 24)
            | (b[at + 1].astype(np.int64) << 16)
            | (b[at + 2].astype(np.int64) << 8)
            | b[at + 3]
        )
        out: np.ndarray = (word >> (32 - (start & 7) - w)) & ((np.int64(1) << w) - 1)
        return out

    def fields(self, count: int, width: int) -> np.ndarray:
        """``count`` fields of ``width`` (<= 25) bits each, int64."""
        self._need(count * width)
        if width == 0 or count == 0:
            return np.zeros(count, dtype=np.int64)
        start = self.pos + width * np.arange(count, dtype=np.int64)
        self.pos += count * width
        return self._gather(start, np.full(count, width, dtype=np.int64))

    def varwidth(self, widths: np.ndarray) -> np.ndarray:
        """One field per entry of ``widths`` (each <= 25), int64."""
        total = int(widths.sum())
        self._need(total)
        start = self.pos + np.cumsum(widths) - widths
        self.pos += total
        return self._gather(start, widths)

    def unary(self, count: int, max_value: int) -> np.ndarray:
        """``count`` unary codes, each at most ``max_value`` (else MALFORMED)."""
        if count == 0:
            return np.zeros(0, dtype=np.int64)
        end = min(self.nbits, self.pos + count * (max_value + 1))
        first, last = self.pos >> 3, (end + 7) >> 3
        bits = np.unpackbits(self.buf[first:last])[self.pos - 8 * first : end - 8 * first]
        zeros = np.flatnonzero(bits == 0)
        if zeros.size and np.diff(zeros[:count], prepend=-1).max() > max_value + 1:
            raise Rejected(RejectCode.MALFORMED, f"{self.what}: unary code over {max_value}")
        if zeros.size < count:
            if end < self.nbits:
                raise Rejected(RejectCode.MALFORMED, f"{self.what}: unary code over {max_value}")
            raise Rejected(RejectCode.TRUNCATED, f"{self.what}: {zeros.size} of {count} unary codes")
        ends = zeros[:count].astype(np.int64)
        self.pos += int(ends[-1]) + 1
        out: np.ndarray = np.diff(ends, prepend=-1) - 1
        return out

    def flags(self, count: int) -> np.ndarray:
        """``count`` single bits as a uint8 array (one C unpack, not a gather)."""
        self._need(count)
        first, end = self.pos >> 3, self.pos + count
        out: np.ndarray = np.unpackbits(self.buf[first : (end + 7) >> 3])[
            self.pos - 8 * first : end - 8 * first
        ]
        self.pos = end
        return out

    def limit(self, nbytes: int) -> None:
        """Shrink the readable stream to its first ``nbytes`` bytes (TRUNCATED if already past)."""
        if 8 * nbytes < self.pos:
            raise Rejected(RejectCode.TRUNCATED, f"{self.what}: {nbytes} bytes left for {self.pos} bits read")
        self.nbits = 8 * nbytes

    def finish(self) -> None:
        """MALFORMED unless exactly the bytes needed were given and the padding bits are zero."""
        if (self.pos + 7) // 8 * 8 != self.nbits:
            raise Rejected(RejectCode.MALFORMED, f"{self.what}: {self.nbits // 8} bytes for {self.pos} bits")
        pad = self.nbits - self.pos
        if pad and int(self.buf[self.nbits // 8 - 1]) & ((1 << pad) - 1):
            raise Rejected(RejectCode.MALFORMED, f"{self.what}: non-zero padding bits")
