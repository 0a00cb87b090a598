"""Where each tensor's index code lies in a payload's bit stream (the decoder's only serial step).

A FIXED body has a known length; a gap-coded (ENTROPY) body's length depends on its content:
its escapes (unary codes) and mantissas. :func:`locate` walks the tensors in id order and finds
each body's end with a few integer operations per tensor, so the decoder can then read every
tensor's fields, escapes and mantissas in whole-array passes (:mod:`coding_flat`).

Two ways to measure a body, same results:

* **integers** (small streams with many tensors): a run's fields are read as one Python
  integer; its escapes and its mantissa bits are a few ANDs and popcounts (one per subset of a
  field's bits, :func:`_field_sums`); the escapes end where the stream's zero-bit positions
  say (one binary search per escape run). No table over the whole stream is built;
* **direct** (big streams, few tensors): read the tensor's fields and escapes as arrays.

Nothing here trusts the stream: a position past the end raises ``_Short``; values are checked
by the decoder's whole-array passes afterwards.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from distronet.kernels.coding_bits import BitReader
from distronet.kernels.coding_bucket import RICE, centre_out
from distronet.kernels.coding_index import ClassParams, _side, fixed_width

__all__ = ["Located", "Run", "Short", "Stream", "locate"]

TABLE_BITS_PER_TENSOR = 2048
"""The integer locator runs when the stream has fewer than this many bits per gap-coded tensor."""


class Short(Exception):
    """The stream ends (or a code runs) before a body does: the reference decoder judges it."""


@functools.lru_cache(maxsize=256)
def _mant_table(b0: int, bmax: int, size: int) -> np.ndarray:
    """Mantissa bits of places 0..size-1 (0 past bmax: such places are rejected later)."""
    order = centre_out(b0, bmax)
    out = np.zeros(size, dtype=np.int64)
    m = min(size, bmax + 1)
    out[:m] = np.maximum(order[:m] - 1, 0)
    return out


class Stream:
    """The payload bit stream ``[0, nbits)`` as bytes (for field gathers) and lazily as bits."""

    def __init__(self, br: BitReader) -> None:
        self.nbits = br.nbits
        self.buf = br.buf
        self._bits: np.ndarray | None = None
        self._zeros: np.ndarray | None = None
        self._words: np.ndarray | None = None

    @property
    def bits(self) -> np.ndarray:
        if self._bits is None:
            self._bits = np.unpackbits(self.buf[: (self.nbits + 7) // 8 + 1])
        return self._bits

    @property
    def raw(self) -> bytes:
        return self.bits.tobytes()

    @property
    def has_zeros(self) -> bool:
        """Whether :attr:`zeros` is already computed (it costs a pass over the stream)."""
        return self._zeros is not None

    @property
    def zeros(self) -> np.ndarray:
        """Positions of the zero bits in ``[0, nbits)``."""
        if self._zeros is None:
            self._zeros = np.flatnonzero(self.bits[: self.nbits] == 0)
        return self._zeros

    @property
    def words(self) -> np.ndarray:
        """Big-endian 32-bit word starting at every byte of the stream."""
        if self._words is None:
            b = self.buf[: (self.nbits + 7) // 8 + 4].astype(np.uint32)  # a word at every byte, and one past
            self._words = (b[:-3] << 24) | (b[1:-2] << 16) | (b[2:-1] << 8) | b[3:]
        return self._words

    def gather(self, start: np.ndarray, w: np.ndarray | int) -> np.ndarray:
        """Fields of widths ``w`` (<= 25) at bit positions ``start`` (the caller checked the end)."""
        word = self.words[start >> 3].astype(np.int64)
        out: np.ndarray = (word >> (32 - (start & 7) - w)) & ((np.int64(1) << w) - 1)
        return out

    def fields(self, start: np.ndarray, w: int) -> np.ndarray:
        return self.gather(start, w)

    def unary_direct(self, p: int, count: int, max_code: int) -> tuple[np.ndarray, int]:
        """``count`` unary codes from ``p``: (values, end); Short when they do not fit."""
        end = min(self.nbits, p + count * (max_code + 1))
        size = min(end - p, 4 * count + 256)  # codes are short on average: look a little ahead first
        z = np.flatnonzero(self.bits[p : p + size] == 0)
        if z.size < count and size < end - p:
            z = np.flatnonzero(self.bits[p:end] == 0)
        if z.size < count:
            raise Short
        z = z[:count]
        return np.diff(z, prepend=-1) - 1, p + int(z[-1]) + 1

    def escapes(self, run: Run) -> np.ndarray:
        """Every tensor's escape values of ``run``, concatenated."""
        if run.values:
            return np.concatenate(run.values)
        n = np.array(run.esc_n, dtype=np.int64)
        total = int(n.sum())
        if not total:
            return np.zeros(0, dtype=np.int64)
        j0 = np.array(run.esc_j0, dtype=np.int64)
        ends = np.cumsum(n)
        j = np.arange(total, dtype=np.int64) + np.repeat(j0 - (ends - n), n)
        z = self.zeros
        prev = np.where(j > 0, z[j - 1], -1)
        some = n > 0
        prev[(ends - n)[some]] = np.array(run.esc_start, dtype=np.int64)[some] - 1
        out: np.ndarray = z[j] - prev - 1
        return out


@dataclass
class Run:
    """One (chunk size, class) of every gap-coded tensor: class 0 = first gaps, 1 = the others."""

    member: list[int] = field(default_factory=list)  # index into Located.entropy
    count: list[int] = field(default_factory=list)
    field_start: list[int] = field(default_factory=list)
    esc_start: list[int] = field(default_factory=list)
    esc_j0: list[int] = field(default_factory=list)
    esc_n: list[int] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)  # direct mode: escape values


@dataclass
class Located:
    """Where the bodies are: FIXED/fallback tensors, gap-coded tensors (with maps and runs)."""

    end: int = 0
    fixed: list[int] = field(default_factory=list)
    fixed_start: list[int] = field(default_factory=list)
    entropy: list[int] = field(default_factory=list)
    maps: list[int] = field(default_factory=list)
    mant_start: list[int] = field(default_factory=list)
    mant_bits: list[int] = field(default_factory=list)
    runs: dict[tuple[int, int], Run] = field(default_factory=dict)


def _run(
    s: Stream, p: int, count: int, b0: int, w: int, bmax: int, run: Run, member: int
) -> tuple[int, int, int]:
    """Fields of one run at ``p``: (position after them, escapes, mantissa bits of non-escapes)."""
    run.member.append(member)
    run.count.append(count)
    run.field_start.append(p)
    if w == RICE:
        return p, count, count * b0
    if w == 0 or count == 0:
        return p, count, 0
    end = p + count * w
    if end > s.nbits:
        raise Short
    f = s.fields(p + w * np.arange(count, dtype=np.int64), w)
    lim = (1 << w) - 1
    mant = _mant_table(b0, bmax, lim + 1)[f] * (f != lim)
    return end, int((f == lim).sum()), int(mant.sum())


def _escapes(s: Stream, p: int, n_esc: int, b0: int, w: int, bmax: int, run: Run) -> tuple[int, int]:
    """The run's escapes at ``p``: (position after them, their mantissa bits)."""
    run.esc_start.append(p)
    run.esc_n.append(n_esc)
    run.esc_j0.append(0)
    if not n_esc:
        run.values.append(np.zeros(0, dtype=np.int64))
        return p, 0
    rice = w == RICE
    lim = 0 if rice else (1 << w) - 1
    max_code = ((1 << bmax) - 1) >> b0 if rice else max(bmax - lim, 0)
    u, end = s.unary_direct(p, n_esc, max_code)
    run.values.append(u)
    mant = 0 if rice else int(_mant_table(b0, bmax, bmax + 2)[np.minimum(lim + u, bmax + 1)].sum())
    return end, mant


@functools.lru_cache(maxsize=256)
def _field_coefs(b0: int, w: int, bmax: int) -> tuple[int, ...]:
    """Möbius coefficients ``c[S]`` of the non-escape mantissa bits ``f(v)`` of a ``w``-bit field.

    ``f(v) = sum(c[S] for S a subset of the bits of v)``, so the mantissa bits of a run of fields
    are ``sum(c[S] * (fields whose bits include S))``: one AND and one popcount per subset.
    """
    lim = (1 << w) - 1
    mt = _mant_table(b0, bmax, lim + 1)
    c = [int(mt[v]) if v < lim else 0 for v in range(lim + 1)]
    for j in range(w):
        for s in range(lim + 1):
            if s >> j & 1:
                c[s] -= c[s ^ (1 << j)]
    return tuple(c)


@functools.lru_cache(maxsize=1024)
def _comb(count: int, w: int) -> int:
    """The integer with bit ``w * i`` set for every ``i < count`` (each field's lowest bit)."""
    return ((1 << (count * w)) - 1) // ((1 << w) - 1)


def _field_sums(x: int, count: int, w: int, coefs: tuple[int, ...]) -> tuple[int, int]:
    """(escapes, mantissa bits of the others) of ``count`` ``w``-bit fields packed MSB-first in ``x``."""
    comb = _comb(count, w)
    if w == 3:  # the common width, unrolled
        p0, p1, p2 = x & comb, (x >> 1) & comb, (x >> 2) & comb
        a01, a02, a12 = p0 & p1, p0 & p2, p1 & p2
        c = coefs
        mant = (
            c[0] * count
            + c[1] * p0.bit_count()
            + c[2] * p1.bit_count()
            + c[3] * a01.bit_count()
            + c[4] * p2.bit_count()
            + c[5] * a02.bit_count()
            + c[6] * a12.bit_count()
        )
        esc = (a01 & p2).bit_count()
        return esc, mant + c[7] * esc
    planes = [(x >> j) & comb for j in range(w)]
    ands = [comb] * (1 << w)
    mant = coefs[0] * count
    for s in range(1, 1 << w):
        low = s & -s
        a = ands[s ^ low] & planes[low.bit_length() - 1]
        ands[s] = a
        if coefs[s]:
            mant += coefs[s] * a.bit_count()
    return ands[-1].bit_count(), mant


def _escape_mant(z: np.ndarray, j0: int, n_esc: int, p: int, lim: int, mt: np.ndarray, bmax: int) -> int:
    """Mantissa bits of the escapes ending at zero bits ``z[j0 : j0 + n_esc]`` (first one starts at ``p``)."""
    if n_esc <= 256:
        ends = z[j0 : j0 + n_esc].tolist()
        total, prev = 0, p - 1
        table, top = mt.tolist(), bmax + 1
        for e in ends:
            u = lim + e - prev - 1
            total += table[u if u < top else top]
            prev = e
        return total
    u = np.diff(z[j0 : j0 + n_esc], prepend=p - 1) - 1
    return int(mt[np.minimum(lim + u, bmax + 1)].sum())


def _locate_ints(
    s: Stream,
    start: int,
    n: list[int],
    k: list[int],
    cn: list[int],
    entropy: list[bool],
    params: dict[int, ClassParams],
) -> Located:
    """:func:`locate` with Python integers: per tensor, a few ANDs and popcounts over its fields.

    A run's fields are read as one integer; escapes and mantissa bits come from per-subset
    popcounts (:func:`_field_sums`), the escapes' ends from the stream's zero-bit positions.
    No table over the whole stream is built, so a payload costs O(its bits / 30) word operations
    plus a few dozen integer operations per gap-coded tensor.
    """
    loc = Located()
    raw, z, nbits = s.raw, s.zeros, s.nbits
    data = s.buf.tobytes()
    nz = int(z.size)
    plans = {}
    for c, pr in params.items():
        bmax = fixed_width(c)
        cls = []
        for b0, w in ((pr.b0_a, pr.w_a), (pr.b0_b, pr.w_b)):
            kind = 0 if w == RICE else (1 if w == 0 else 2)
            coefs = _field_coefs(b0, w, bmax) if kind == 2 else ()
            lim = (1 << w) - 1 if kind == 2 else 0
            cls.append((kind, b0, w, lim, coefs, _mant_table(b0, bmax, bmax + 2)))
        plans[c] = (
            cls[0],
            cls[1],
            loc.runs.setdefault((c, 0), Run()),
            loc.runs.setdefault((c, 1), Run()),
            bmax,
            _side(c) is not None,
        )
    p = start
    for i, (ni, ki, ci, ent) in enumerate(zip(n, k, cn, entropy, strict=True)):
        if ki == ci:
            continue
        if ent:
            if p + 2 > nbits:
                raise Short
            m = 2 * raw[p] + raw[p + 1]
            p += 2
            if m != 3:
                plan_a, plan_b, run_a, run_b, bmax, square = plans[ci]
                if m and not square:
                    raise Short  # a 2-D rank map on a 1-D chunk: MALFORMED (the reference says so)
                member = len(loc.entropy)
                loc.entropy.append(i)
                loc.maps.append(m)
                mant = 0
                escs = []
                for (kind, b0, w, _lim, coefs, _mt), run, count in (
                    (plan_a, run_a, ni),
                    (plan_b, run_b, ni * (ki - 1)),
                ):
                    run.member.append(member)
                    run.count.append(count)
                    run.field_start.append(p)
                    if kind == 2 and count:
                        end = p + count * w
                        if end > nbits:
                            raise Short
                        a, b = p >> 3, (end + 7) >> 3
                        x = (int.from_bytes(data[a:b], "big") >> (8 * b - end)) & ((1 << (end - p)) - 1)
                        e, mb = _field_sums(x, count, w, coefs)
                        escs.append(e)
                        mant += mb
                        p = end
                    else:
                        escs.append(count if kind < 2 else 0)
                        mant += count * b0 if kind == 0 else 0
                nxt = -1  # the zero bit after class A's escapes: where class B's start
                for (kind, _b0, _w, lim, _coefs, mt), run, n_esc in (
                    (plan_a, run_a, escs[0]),
                    (plan_b, run_b, escs[1]),
                ):
                    run.esc_start.append(p)
                    run.esc_n.append(n_esc)
                    if not n_esc:
                        run.esc_j0.append(0)
                        continue
                    j0 = nxt if nxt >= 0 else int(z.searchsorted(p))
                    jl = j0 + n_esc - 1
                    nxt = jl + 1
                    if jl >= nz:
                        raise Short
                    run.esc_j0.append(j0)
                    if kind:
                        mant += _escape_mant(z, j0, n_esc, p, lim, mt, bmax)
                    p = z.item(jl) + 1
                loc.mant_start.append(p)
                loc.mant_bits.append(mant)
                p += mant
                if p > nbits:
                    raise Short
                continue
        loc.fixed.append(i)
        loc.fixed_start.append(p)
        p += ni * ki * (ci - 1).bit_length()
        if p > nbits:
            raise Short
    loc.end = p
    return loc


def locate(
    s: Stream,
    start: int,
    n: list[int],
    k: list[int],
    cn: list[int],
    entropy: list[bool],
    params: dict[int, ClassParams],
) -> Located:
    """Find every index body from bit ``start`` (tensors in id order); Short if the stream ends."""
    if s.nbits < TABLE_BITS_PER_TENSOR * max(1, sum(entropy)):
        return _locate_ints(s, start, n, k, cn, entropy, params)
    loc = Located()
    p = start
    raw = s.raw if any(entropy) else b""
    for i, (ni, ki, ci, ent) in enumerate(zip(n, k, cn, entropy, strict=True)):
        if ki == ci:
            continue  # dense: no index bits
        if ent:
            if p + 2 > s.nbits:
                raise Short
            m = 2 * raw[p] + raw[p + 1]
            p += 2
            if m in (1, 2) and _side(ci) is None:
                raise Short  # a 2-D rank map on a 1-D chunk: MALFORMED (the reference says so)
            if m != 3:
                bmax, pr = fixed_width(ci), params[ci]
                member = len(loc.entropy)
                loc.entropy.append(i)
                loc.maps.append(m)
                ra = loc.runs.setdefault((ci, 0), Run())
                rb = loc.runs.setdefault((ci, 1), Run())
                p, ea, ma = _run(s, p, ni, pr.b0_a, pr.w_a, bmax, ra, member)
                p, eb, mb = _run(s, p, ni * (ki - 1), pr.b0_b, pr.w_b, bmax, rb, member)
                p, xa = _escapes(s, p, ea, pr.b0_a, pr.w_a, bmax, ra)
                p, xb = _escapes(s, p, eb, pr.b0_b, pr.w_b, bmax, rb)
                mant = ma + mb + xa + xb
                loc.mant_start.append(p)
                loc.mant_bits.append(mant)
                p += mant
                if p > s.nbits:
                    raise Short
                continue
        loc.fixed.append(i)
        loc.fixed_start.append(p)
        p += ni * ki * (ci - 1).bit_length()
        if p > s.nbits:
            raise Short
    loc.end = p
    return loc
