"""Where each tensor's index code lies in a payload's bit stream (the decoder's only serial step).

A FIXED body has a known length; a gap-coded (ENTROPY) body's length depends on its content:
its escapes (unary codes) and mantissas. :func:`locate` walks the tensors in id order and finds
each body's end with a few integer operations per tensor, so the decoder can then read every
tensor's fields, escapes and mantissas in whole-array passes (:mod:`coding_flat`).

Two ways to measure a body, same results:

* **tables** (small streams with many tensors): once per stream, every bit position's field
  value for each ``(b0, w)`` in use, strided prefix sums of "is an escape" and "mantissa bits",
  and the positions of all zero bits with prefix sums of the escape mantissas they end; a tensor
  then costs a handful of table look-ups and one binary search per escape run;
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
"""Tables are built when the stream has fewer than this many bits per gap-coded tensor."""


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
        self._values: dict[int, np.ndarray] = {}
        self._tables: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._esc: dict[tuple[int, int, int], np.ndarray] = {}

    @property
    def bits(self) -> np.ndarray:
        if self._bits is None:
            self._bits = np.unpackbits(self.buf[: (self.nbits + 7) // 8 + 1])
        return self._bits

    @property
    def raw(self) -> bytes:
        return self.bits.tobytes()

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

    def _field_values(self, w: int) -> np.ndarray:
        """The ``w``-bit (<= 4) field starting at every bit position, uint8, padded to a multiple of ``w``."""
        if w not in self._values:
            size = -(-self.nbits // w) * w
            bits = self.bits  # holds >= 8 bits past nbits
            v = bits[:size] << (w - 1)
            for i in range(1, w):
                v |= bits[i : i + size] << (w - 1 - i)
            self._values[w] = v
        return self._values[w]

    def field_tables(self, b0: int, w: int, bmax: int) -> tuple[np.ndarray, np.ndarray]:
        """Strided (step ``w``) prefix sums over bit positions of (is escape, mantissa bits), int32."""
        key = (b0, w, bmax)
        if key not in self._tables:
            v = self._field_values(w)
            lim = (1 << w) - 1
            table = _mant_table(b0, bmax, lim + 1).astype(np.int32)
            table[lim] = 0  # an escape's mantissa is counted with the escapes
            self._tables[key] = (
                (v == lim).reshape(-1, w).cumsum(axis=0, dtype=np.int32).reshape(-1),
                np.take(table, v).reshape(-1, w).cumsum(axis=0, dtype=np.int32).reshape(-1),
            )
        return self._tables[key]

    def escape_table(self, b0: int, lim: int, bmax: int) -> np.ndarray:
        """Prefix sums over zero bits of the mantissa bits of the escape that would end there."""
        key = (b0, lim, bmax)
        if key not in self._esc:
            z = self.zeros
            u = np.diff(z, prepend=-1) - 1
            self._esc[key] = np.cumsum(_mant_table(b0, bmax, bmax + 2)[np.minimum(lim + u, bmax + 1)])
        return self._esc[key]

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
    s: Stream, p: int, count: int, b0: int, w: int, bmax: int, tables: bool, run: Run, member: int
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
    if tables:
        esc, mant = s.field_tables(b0, w, bmax)
        last, before = end - w, p - w
        if before >= 0:
            return end, int(esc[last] - esc[before]), int(mant[last] - mant[before])
        return end, int(esc[last]), int(mant[last])
    f = s.fields(p + w * np.arange(count, dtype=np.int64), w)
    lim = (1 << w) - 1
    mant = _mant_table(b0, bmax, lim + 1)[f] * (f != lim)
    return end, int((f == lim).sum()), int(mant.sum())


def _escapes(
    s: Stream, p: int, n_esc: int, b0: int, w: int, bmax: int, tables: bool, run: Run
) -> tuple[int, int]:
    """The run's escapes at ``p``: (position after them, their mantissa bits)."""
    run.esc_start.append(p)
    run.esc_n.append(n_esc)
    if not n_esc:
        run.esc_j0.append(0)
        if not tables:
            run.values.append(np.zeros(0, dtype=np.int64))
        return p, 0
    rice = w == RICE
    lim = 0 if rice else (1 << w) - 1
    if not tables:
        run.esc_j0.append(0)
        max_code = ((1 << bmax) - 1) >> b0 if rice else max(bmax - lim, 0)
        u, end = s.unary_direct(p, n_esc, max_code)
        run.values.append(u)
        mant = 0 if rice else int(_mant_table(b0, bmax, bmax + 2)[np.minimum(lim + u, bmax + 1)].sum())
        return end, mant
    z = s.zeros
    j0 = int(z.searchsorted(p))
    jl = j0 + n_esc - 1
    if jl >= z.size:
        raise Short
    run.esc_j0.append(j0)
    if rice:
        return int(z[jl]) + 1, 0
    cm = s.escape_table(b0, lim, bmax)
    first = int(_mant_table(b0, bmax, bmax + 2)[min(lim + int(z[j0]) - p, bmax + 1)])
    return int(z[jl]) + 1, int(cm[jl] - cm[j0]) + first


def _class_plan(
    s: Stream, b0: int, w: int, bmax: int
) -> tuple[int, int, int, object, object, object, np.ndarray]:
    """(kind, b0, w, escape prefix sums, mantissa prefix sums, escape-mantissa prefix sums, table).

    kind 0: Rice; 1: bucket code with w = 0 (every symbol escapes); 2: bucket code with fields.
    """
    mt = _mant_table(b0, bmax, bmax + 2)
    if w == RICE:
        return 0, b0, w, None, None, None, mt
    lim = (1 << w) - 1
    esc_mant = s.escape_table(b0, lim, bmax) if s.zeros.size else np.zeros(0, dtype=np.int64)
    if w == 0:
        return 1, b0, w, None, None, esc_mant, mt
    ce, cm = s.field_tables(b0, w, bmax)
    return 2, b0, w, ce, cm, esc_mant, mt


def _locate_tables(
    s: Stream,
    start: int,
    n: list[int],
    k: list[int],
    cn: list[int],
    entropy: list[bool],
    params: dict[int, ClassParams],
) -> Located:
    """:func:`locate` by table look-ups: a few integer operations per tensor."""
    loc = Located()
    raw, z, nbits = s.raw, s.zeros, s.nbits
    nz = int(z.size)
    plans = {}
    for c, pr in params.items():
        bmax = fixed_width(c)
        plans[c] = (
            _class_plan(s, pr.b0_a, pr.w_a, bmax),
            _class_plan(s, pr.b0_b, pr.w_b, bmax),
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
                for (kind, b0, w, ce, cm, _em, _mt), run, count in (
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
                        last, before = end - w, p - w
                        if before >= 0:
                            escs.append(ce.item(last) - ce.item(before))  # type: ignore[attr-defined]
                            mant += cm.item(last) - cm.item(before)  # type: ignore[attr-defined]
                        else:
                            escs.append(ce.item(last))  # type: ignore[attr-defined]
                            mant += cm.item(last)  # type: ignore[attr-defined]
                        p = end
                    else:
                        escs.append(count if kind < 2 else 0)
                        mant += count * b0 if kind == 0 else 0
                for (kind, _b0, w, _ce, _cm, em, mt), run, n_esc in (
                    (plan_a, run_a, escs[0]),
                    (plan_b, run_b, escs[1]),
                ):
                    run.esc_start.append(p)
                    run.esc_n.append(n_esc)
                    if not n_esc:
                        run.esc_j0.append(0)
                        continue
                    j0 = int(z.searchsorted(p))
                    jl = j0 + n_esc - 1
                    if jl >= nz:
                        raise Short
                    run.esc_j0.append(j0)
                    zl = z.item(jl)
                    if kind:
                        lim = (1 << w) - 1 if kind == 2 else 0
                        mant += em.item(jl) - em.item(j0) + mt.item(min(lim + z.item(j0) - p, bmax + 1))  # type: ignore[attr-defined]
                    p = zl + 1
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
        return _locate_tables(s, start, n, k, cn, entropy, params)
    loc = Located()
    p = start
    tables = False
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
                p, ea, ma = _run(s, p, ni, pr.b0_a, pr.w_a, bmax, tables, ra, member)
                p, eb, mb = _run(s, p, ni * (ki - 1), pr.b0_b, pr.w_b, bmax, tables, rb, member)
                p, xa = _escapes(s, p, ea, pr.b0_a, pr.w_a, bmax, tables, ra)
                p, xb = _escapes(s, p, eb, pr.b0_b, pr.w_b, bmax, tables, rb)
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
