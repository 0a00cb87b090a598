"""The payload decoder in whole-array passes over ALL tensors of a payload (pure numpy).

Same contract as the reference :func:`~distronet.kernels.coding_payload.decode_payload_reference`
(docs/protocol-payload.md): it accepts exactly the payloads the reference accepts and returns
bit-identical indices and values. The reference spends a dozen array operations on every tensor;
a model has dozens of small tensors, so that per-tensor cost, not the bits, was what a packet
cost to parse. Here the only per-tensor work is :mod:`coding_locate`'s few integer operations
that find where each tensor's index code ends; reading fields, escapes, mantissas, gaps, rank
maps, scales and values then happens once per payload over concatenated arrays.

Every check of the reference is made (sizes against ``Limits`` before any allocation, index
range, duplicates, order, escapes, scale range, finiteness, exact length and zero padding). Any
failure re-runs the reference decoder, so a rejected payload gets exactly the reference's
``Rejected`` code and message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import BitReader
from distronet.kernels.coding_bucket import (
    RICE,
    buckets_of,
    centre_out,
    check_params,
    class_values,
    finish_class,
    start_class,
)
from distronet.kernels.coding_index import ClassParams, IndexCoding, RankMap, _rank_tables, fixed_width
from distronet.kernels.coding_locate import Located, Short, Stream, locate
from distronet.kernels.coding_payload import (
    _SCALE_BMAX,
    DecodedTensor,
    decode_payload_reference,
    read_header,
)
from distronet.kernels.coding_values import Q_MAX, Q_MIN, ZERO_SCALE, ValueCoding, scale_from_code
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = ["FlatPayload", "decode_payload", "decode_payload_flat"]

_BYTES = np.array([0, 4, 2, 2, 1, 0], dtype=np.int64)  # byte-stream bytes per value, by ValueCoding
_VALUE_BITS = np.array([0, 32, 16, 16, 8, 1], dtype=np.int64)
_FP32, _FP16, _BF16, _INT8, _SIGN1 = (int(c) for c in ValueCoding)  # plain ints: enum look-ups cost
_ENTROPY = int(IndexCoding.ENTROPY)


class _Bad(Exception):
    """The fast path saw something the reference must judge (it raises the exact Rejected)."""


@dataclass(frozen=True)
class FlatPayload:
    """A decoded payload, all tensors concatenated (tensor-major, chunk-major, ``k`` per chunk).

    ``tensor_ids``, ``n``, ``k``, ``cn`` int64 ``(T,)``; tensor ``j`` owns ``idx``/``val``
    entries ``offsets[j]:offsets[j+1]``, i.e. ``(n[j], k[j])`` arrays flattened. ``idx`` int64
    ascending and unique within each chunk, in ``[0, cn)``; ``val`` finite float32.
    """

    tensor_ids: np.ndarray
    n: np.ndarray
    k: np.ndarray
    cn: np.ndarray
    offsets: np.ndarray
    idx: np.ndarray
    val: np.ndarray

    @functools.cached_property
    def structure(self) -> bytes:
        """Which tensors at which k: equal for payloads whose entries line up (a cache key)."""
        return self.tensor_ids.tobytes() + self.k.tobytes()

    def tensors(self) -> list[DecodedTensor]:
        """Per tensor views ``(tensor_id, idx (n, k), val (n, k))`` (no copy)."""
        out = []
        for j, (tid, n, k) in enumerate(
            zip(self.tensor_ids.tolist(), self.n.tolist(), self.k.tolist(), strict=True)
        ):
            a, b = int(self.offsets[j]), int(self.offsets[j + 1])
            out.append(DecodedTensor(tid, self.idx[a:b].reshape(n, k), self.val[a:b].reshape(n, k)))
        return out


@dataclass(frozen=True)
class _Table:
    ids: np.ndarray
    n: np.ndarray
    cn: np.ndarray
    k: np.ndarray
    vc: np.ndarray
    ic: np.ndarray


@functools.lru_cache(maxsize=16)
def _layout_array(layouts: tuple[tuple[int, int], ...]) -> np.ndarray:
    return np.array(layouts, dtype=np.int64).reshape(-1, 2)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + l) for s, l in zip(starts, lengths)])`` in whole-array ops."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    out: np.ndarray = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    return out


def _read_table(
    br: BitReader,
    count: int,
    classes: list[tuple[ValueCoding, IndexCoding, int]],
    lay: np.ndarray,
    limits: Limits,
) -> _Table:
    if count and not classes:
        raise _Bad
    ids = np.cumsum(br.unary(count, len(lay)) + 1) - 1
    if count and int(ids[-1]) >= len(lay):
        raise _Bad
    cls = br.fields(count, (len(classes) - 1).bit_length())
    if count and int(cls.max()) >= len(classes):
        raise _Bad
    if not count:
        z = np.zeros(0, dtype=np.int64)
        return _Table(z, z, z, z, z, z)
    cvc, cic, ck = (np.array([c[i] for c in classes], dtype=np.int64) for i in range(3))
    n, cn = lay[ids, 0], lay[ids, 1]
    vc, ic, k = cvc[cls], cic[cls], ck[cls]
    k = np.where(k == 0, cn, k)
    if bool((k > cn).any()) or int(k.max()) > limits.max_k:
        raise _Bad
    nk = n * k
    if int(nk.sum()) > limits.max_total_coefficients or int((nk * _VALUE_BITS[vc]).sum()) > br.nbits:
        raise _Bad
    return _Table(ids, n, cn, k, vc, ic)


def _fixed_indices(s: Stream, t: _Table, loc: Located, out: np.ndarray, offsets: np.ndarray) -> None:
    """FIXED and fallback bodies of every tensor at once, checked (range, then ascending)."""
    j = np.array(loc.fixed, dtype=np.int64)
    if not j.size:
        return
    nk = t.n[j] * t.k[j]
    w = buckets_of(t.cn[j] - 1)  # fixed_width of each
    local = _ranges(np.zeros(j.size, dtype=np.int64), nk)
    pos = np.repeat(np.array(loc.fixed_start, dtype=np.int64), nk) + local * np.repeat(w, nk)
    v = s.gather(pos, np.repeat(w, nk))
    kk = np.repeat(t.k[j], nk)
    if bool((v >= np.repeat(t.cn[j], nk)).any()):
        raise _Bad
    ok = np.diff(v) > 0
    if not bool((ok | (local[1:] % kk[1:] == 0)).all()):
        raise _Bad
    out[_ranges(offsets[j], nk)] = v


def _dense_indices(t: _Table, out: np.ndarray, offsets: np.ndarray) -> None:
    j = np.flatnonzero(t.k == t.cn)
    if j.size:
        nk = t.n[j] * t.k[j]
        out[_ranges(offsets[j], nk)] = _ranges(np.zeros(j.size, dtype=np.int64), nk) % np.repeat(t.cn[j], nk)


def _class_symbols(
    s: Stream,
    loc: Located,
    key: tuple[int, int],
    params: tuple[int, int],
    bmax: int,
    local: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(mantissa widths, value without mantissa) of one (chunk size, class) run of every tensor.

    ``local``: each symbol's place within its tensor's run (computed when not given).
    """
    b0, w = params
    runs = loc.runs[key]
    esc = s.escapes(runs)  # unary values, every tensor's run concatenated
    if w == RICE:
        if esc.size and int(esc.max()) > ((1 << bmax) - 1) >> b0:
            raise _Bad
        return np.full(esc.size, b0, dtype=np.int64), esc << b0
    lim = (1 << w) - 1
    if w == 0:
        rho = esc
    else:
        count = np.array(runs.count, dtype=np.int64)
        if local is None:
            local = _ranges(np.zeros(count.size, dtype=np.int64), count)
        rho = s.fields(np.repeat(np.array(runs.field_start, dtype=np.int64), count) + w * local, w)
        escaped = rho == lim
        if int(escaped.sum()) != esc.size:
            raise _Bad
        rho[escaped] = lim + esc
    if esc.size and int(esc.max()) > max(bmax - lim, 0):
        raise _Bad
    if rho.size and int(rho.max()) > bmax:
        raise _Bad
    widths, highs = _place_tables(b0, bmax)
    return widths[rho], highs[rho]


@functools.lru_cache(maxsize=256)
def _place_tables(b0: int, bmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per bucket place: (mantissa bits, the symbol's value without its mantissa)."""
    b = centre_out(b0, bmax)
    width = np.maximum(b - 1, 0)
    return width, np.where(b >= 1, np.int64(1) << width, 0)


@functools.lru_cache(maxsize=64)
def _pos_table(combos: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, dict[tuple[int, int], int]]:
    """Concatenated position-of-rank tables of (chunk size, rank map) pairs, with their offsets."""
    tables, where, at = [], {}, 0
    for cn, m in combos:
        where[(cn, m)] = at
        tables.append(_rank_tables(cn, RankMap(m))[1])
        at += cn
    return np.concatenate(tables), where


Reorder = Callable[[np.ndarray], np.ndarray]


def _one_block(
    s: Stream, t: _Table, loc: Located, params: dict[int, ClassParams], out: np.ndarray, offsets: np.ndarray
) -> Reorder | None:
    """All gap-coded tensors share chunk size, k and rank map and sit side by side: (rows, k) arrays."""
    j = np.array(loc.entropy, dtype=np.int64)
    n, k = t.n[j], int(t.k[j[0]])
    cn, m = int(t.cn[j[0]]), loc.maps[0]
    p, bmax, rows = params[cn], fixed_width(cn), int(n.sum())
    w_a, h_a = _class_symbols(s, loc, (cn, 0), (p.b0_a, p.w_a), bmax)
    w_b, h_b = _class_symbols(s, loc, (cn, 1), (p.b0_b, p.w_b), bmax)
    w2, h2 = np.empty((rows, k), dtype=np.int64), np.empty((rows, k), dtype=np.int64)
    w2[:, 0], h2[:, 0] = w_a, h_a
    if k > 1:
        w2[:, 1:], h2[:, 1:] = w_b.reshape(rows, k - 1), h_b.reshape(rows, k - 1)
    width, hi = w2.reshape(-1), h2.reshape(-1)
    nk = n * k
    sym_start = np.cumsum(nk) - nk
    if not np.array_equal(np.add.reduceat(width, sym_start), np.array(loc.mant_bits, dtype=np.int64)):
        raise _Bad
    cs = np.cumsum(width) - width
    if j.size == 1:
        mpos = cs + loc.mant_start[0]
    else:
        mpos = cs + np.repeat(np.array(loc.mant_start, dtype=np.int64) - cs[sym_start], nk)
    gaps = (hi + s.gather(mpos, width)).reshape(rows, k)
    ranks = np.cumsum(gaps + 1, axis=1) - 1
    if int(ranks[:, -1].max()) >= cn:
        raise _Bad
    lo, up = int(offsets[j[0]]), int(offsets[j[-1] + 1])
    if m == int(RankMap.IDENTITY):
        out[lo:up] = ranks.reshape(-1)
        return None
    order = np.sort(_rank_tables(cn, RankMap(m))[1][ranks] * k + np.arange(k), axis=1)
    out[lo:up] = (order // k).reshape(-1)
    wire = order % k

    def reorder(val: np.ndarray) -> np.ndarray:
        val[lo:up] = np.take_along_axis(val[lo:up].reshape(rows, k), wire, axis=1).reshape(-1)
        return val

    return reorder


def _entropy_indices(
    s: Stream, t: _Table, loc: Located, params: dict[int, ClassParams], out: np.ndarray, offsets: np.ndarray
) -> Reorder | None:
    """Gap-coded tensors at once; returns how to move the values along (None when nothing moves)."""
    j = np.array(loc.entropy, dtype=np.int64)
    if not j.size:
        return None
    n, k, cn = t.n[j], t.k[j], t.cn[j]
    if (
        len(set(loc.maps)) == 1
        and int(k.min()) == int(k.max())
        and int(cn.min()) == int(cn.max())
        and int(j[-1] - j[0]) == j.size - 1
    ):
        return _one_block(s, t, loc, params, out, offsets)
    maps = bytes(loc.maps)
    plan = _gap_plan(j.tobytes(), n.tobytes(), k.tobytes(), cn.tobytes(), maps, offsets[j].tobytes())
    width = np.empty(plan.total, dtype=np.int64)
    hi = np.empty_like(width)
    for key, wire, local in plan.runs:
        g, cls = key
        p = params[g]
        b0w = (p.b0_a, p.w_a) if cls == 0 else (p.b0_b, p.w_b)
        wd, h = _class_symbols(s, loc, key, b0w, fixed_width(g), local)
        width[wire], hi[wire] = wd, h
    if not np.array_equal(np.add.reduceat(width, plan.sym_start), np.array(loc.mant_bits, dtype=np.int64)):
        raise _Bad
    cs = np.cumsum(width) - width
    mpos = cs + np.repeat(np.array(loc.mant_start, dtype=np.int64) - cs[plan.sym_start], plan.nk)
    r = np.cumsum(hi + s.gather(mpos, width) + 1)
    before = r[plan.chunk_before]
    before[plan.first_chunk] = 0
    if bool((r[plan.chunk_last] - before > plan.chunk_cn).any()):
        raise Rejected(RejectCode.INDEX_OUT_OF_RANGE, "rank beyond chunk")  # reference re-judges
    ranks = r - 1 - before[plan.chunk_of]
    pos = plan.table[plan.toff + ranks]
    if not plan.moved:
        out[plan.dest] = pos
        return None
    perm = np.arange(out.size, dtype=np.int64)
    for kv, cols, shifted, rows in plan.moved:
        order = np.sort(pos[cols] * kv + plan.arange[:kv], axis=1)
        pos[cols] = order // kv
        perm[shifted] = (order % kv + rows).reshape(-1)
    out[plan.dest] = pos
    moves = perm

    def reorder(val: np.ndarray) -> np.ndarray:
        out: np.ndarray = val[moves]
        return out

    return reorder


@dataclass(frozen=True)
class _GapPlan:
    """What a payload's gap-coded tensors imply before any symbol is read (cached by structure)."""

    total: int
    nk: np.ndarray
    sym_start: np.ndarray
    runs: list[tuple[tuple[int, int], np.ndarray, np.ndarray]]  # (run key, wire places, local places)
    chunk_before: np.ndarray  # per chunk: symbol index before its first (clamped to 0)
    first_chunk: np.ndarray  # chunks that start the symbol sequence (no symbol before)
    chunk_last: np.ndarray
    chunk_cn: np.ndarray
    chunk_of: np.ndarray  # per symbol: its chunk
    table: np.ndarray
    toff: np.ndarray  # per symbol: its (chunk size, map) table's offset
    dest: np.ndarray
    arange: np.ndarray
    moved: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]  # (k, cols, perm targets, sources' base)


@functools.lru_cache(maxsize=32)
def _gap_plan(jb: bytes, nb: bytes, kb: bytes, cnb: bytes, mb: bytes, ob: bytes) -> _GapPlan:
    """The plan of gap-coded tensors ``j`` with ``n``, ``k``, ``cn``, rank ``maps``, output offsets."""
    n, k, cn, off = (np.frombuffer(x, dtype=np.int64) for x in (nb, kb, cnb, ob))
    maps = np.frombuffer(mb, dtype=np.uint8).astype(np.int64)
    nk = n * k
    sym_start = np.cumsum(nk) - nk
    total = int(nk.sum())
    runs = []
    for g in sorted(set(cn.tolist())):
        sel = np.flatnonzero(cn == g)
        for cls in (0, 1):
            cnt = n[sel] if cls == 0 else n[sel] * (k[sel] - 1)
            i = _ranges(np.zeros(sel.size, dtype=np.int64), cnt)
            ks = np.repeat(k[sel], cnt)
            base = np.repeat(sym_start[sel], cnt)
            wire = base + i * ks if cls == 0 else base + i + i // np.maximum(ks - 1, 1) + 1
            runs.append(((g, cls), wire, i))
    kk = np.repeat(k, n)
    cstart = np.cumsum(kk) - kk
    combos = tuple(sorted({(c, m) for c, m in zip(cn.tolist(), maps.tolist(), strict=True)}))
    table, where = _pos_table(combos)
    toff = np.array([where[(c, m)] for c, m in zip(cn.tolist(), maps.tolist(), strict=True)], dtype=np.int64)
    shift = np.repeat(off - sym_start, nk)
    moved = []
    mv = np.flatnonzero(maps != int(RankMap.IDENTITY))
    for kv in sorted(set(k[mv].tolist())):
        sel = mv[k[mv] == kv]
        rows = np.repeat(sym_start[sel], n[sel]) + kv * _ranges(np.zeros(sel.size, dtype=np.int64), n[sel])
        cols = rows[:, None] + np.arange(kv)
        moved.append((kv, cols, (cols + shift[cols]).reshape(-1), rows[:, None] + shift[cols]))
    return _GapPlan(
        total=total,
        nk=nk,
        sym_start=sym_start,
        runs=runs,
        chunk_before=np.maximum(cstart - 1, 0),
        first_chunk=np.flatnonzero(cstart == 0),
        chunk_last=cstart + kk - 1,
        chunk_cn=np.repeat(cn, n),
        chunk_of=np.repeat(np.arange(kk.size, dtype=np.int64), kk),
        table=table,
        toff=np.repeat(toff, nk),
        dest=_ranges(off, nk),
        arange=np.arange(int(k.max()) if k.size else 1, dtype=np.int64),
        moved=moved,
    )


def _unary(s: BitReader, stream: Stream, count: int, max_value: int) -> np.ndarray:
    """``count`` unary codes at the reader's position, from the stream's zero-bit positions."""
    if not count:
        return np.zeros(0, dtype=np.int64)
    z, p = stream.zeros, s.pos
    j0 = int(z.searchsorted(p))
    if j0 + count > z.size:
        raise _Bad
    ends = z[j0 : j0 + count]
    u: np.ndarray = np.diff(ends, prepend=p - 1) - 1
    if int(u.max()) > max_value:
        raise _Bad
    s.pos = int(ends[-1]) + 1
    return u


def _scale_symbols(s: BitReader, stream: Stream | None, count: int, b0: int, w: int) -> np.ndarray:
    """The scale symbols (bucket or Rice code, bmax 12); unary codes from ``stream``'s zeros if given."""
    if stream is None:
        prefix, widths = finish_class(s, start_class(s, count, b0, w), b0, w, _SCALE_BMAX)
        return class_values(prefix, s.varwidth(widths), b0, w)
    if w == RICE:
        q = _unary(s, stream, count, ((1 << _SCALE_BMAX) - 1) >> b0)
        out: np.ndarray = (q << b0) + s.varwidth(np.full(count, b0, dtype=np.int64))
        return out
    rho = s.fields(count, w)
    lim = (1 << w) - 1
    escaped = rho == lim
    rho[escaped] = lim + _unary(s, stream, int(escaped.sum()), max(_SCALE_BMAX - lim, 0))
    if rho.size and int(rho.max()) > _SCALE_BMAX:
        raise _Bad
    widths, highs = _place_tables(b0, _SCALE_BMAX)
    width = widths[rho]
    res: np.ndarray = highs[rho] + s.varwidth(width)
    return res


def _scales(s: BitReader, stream: Stream | None, t: _Table, b0: int, w: int) -> np.ndarray:
    """float32 scale per chunk of every scaled tensor (id order); checks each code's range."""
    sc = np.flatnonzero((t.vc == _INT8) | (t.vc == _SIGN1))
    n = t.n[sc]
    sym = _scale_symbols(s, stream, int(n.sum()), b0, w)
    nonzero = sym > 0
    zz = sym[nonzero] - 1
    c = np.full(sym.size, ZERO_SCALE, dtype=np.int64)
    c[nonzero] = np.cumsum((zz >> 1) ^ -(zz & 1))
    step = np.where((t.vc[sc] == _SIGN1) & (t.k[sc] < 16), 4, 1)
    lo, hi = np.repeat(-(-Q_MIN // step), n), np.repeat(Q_MAX // step, n)
    live = c[nonzero]
    if live.size and bool(((live < lo[nonzero]) | (live > hi[nonzero])).any()):
        raise _Bad
    q = np.where(nonzero, c * np.repeat(step, n), 0)
    out: np.ndarray = np.where(nonzero, scale_from_code(q), np.float32(0)).astype(np.float32)
    return out


def _values(
    rest: bytes, vstart: int, t: _Table, offsets: np.ndarray, scales: np.ndarray | None, signs: np.ndarray
) -> np.ndarray:
    nk = t.n * t.k
    total = int(offsets[-1])
    out = np.empty(total, dtype=np.float32)
    vbytes = nk * _BYTES[t.vc]
    voff = vstart + np.cumsum(vbytes) - vbytes
    scaled = (t.vc == _INT8) | (t.vc == _SIGN1)
    snk = np.where(scaled, nk, 0)
    soff = np.cumsum(snk) - snk  # offset among scaled coefficients
    gnk = np.where(t.vc == _SIGN1, nk, 0)
    goff = np.cumsum(gnk) - gnk  # offset among sign bits
    scale_coef = None
    if scales is not None:
        scale_coef = np.repeat(scales, np.repeat(t.k[scaled], t.n[scaled]))
    if not total:
        return out
    change = np.flatnonzero(np.diff(t.vc)) + 1
    for a, b in zip([0, *change.tolist()], [*change.tolist(), len(t.vc)], strict=True):
        vc, lo, hi_ = int(t.vc[a]), int(offsets[a]), int(offsets[b])
        cnt = hi_ - lo
        if not cnt:
            continue
        if vc == _FP32:
            out[lo:hi_] = np.frombuffer(rest, "<f4", cnt, int(voff[a]))
        elif vc == _FP16:
            out[lo:hi_] = np.frombuffer(rest, "<f2", cnt, int(voff[a]))
        elif vc == _BF16:
            out[lo:hi_] = (np.frombuffer(rest, "<u2", cnt, int(voff[a])).astype(np.uint32) << 16).view(
                np.float32
            )
        else:
            assert scale_coef is not None
            sc = scale_coef[int(soff[a]) : int(soff[a]) + cnt]
            if vc == _SIGN1:
                out[lo:hi_] = np.where(signs[int(goff[a]) : int(goff[a]) + cnt], -sc, sc)
            else:
                ints = np.frombuffer(rest, np.int8, cnt, int(voff[a]))
                with np.errstate(over="ignore"):
                    out[lo:hi_] = ints.astype(np.float32) * sc
    if not bool(np.isfinite(out).all()):
        raise _Bad
    return out


def _params(br: BitReader, bmax: int) -> tuple[int, int]:
    """``(b0, w)``: 4 + 3 bits read as plain integers (checked as the reference does)."""
    p = br.pos
    if p + 7 > br.nbits:
        raise _Bad
    word = (br.buf.item(p >> 3) << 8) | br.buf.item((p >> 3) + 1)  # the buffer has spare bytes
    v = (word >> (9 - (p & 7))) & 0x7F
    br.pos = p + 7
    b0, w = v >> 3, v & 7
    check_params(b0, w, bmax, br.what)
    return b0, w


def _fast(
    layouts: Sequence[tuple[int, int]],
    limits: Limits,
    count: int,
    classes: list[tuple[ValueCoding, IndexCoding, int]],
    rest: bytes,
) -> FlatPayload:
    br = BitReader(rest, "payload bit stream")
    t = _read_table(br, count, classes, _layout_array(tuple(layouts)), limits)
    nk = t.n * t.k
    vbytes = int((nk * _BYTES[t.vc]).sum())
    if vbytes > len(rest):
        raise _Bad
    br.limit(len(rest) - vbytes)
    entropy = (t.ic == _ENTROPY) & (t.k < t.cn)
    groups = sorted(set(t.cn[entropy].tolist()))
    params = {cn: ClassParams(*_params(br, fixed_width(cn)), *_params(br, fixed_width(cn))) for cn in groups}
    scaled = bool(((t.vc == _INT8) | (t.vc == _SIGN1)).any())
    scale_b0, scale_w = _params(br, _SCALE_BMAX) if scaled else (0, 0)
    stream = Stream(br)
    loc = locate(stream, br.pos, t.n.tolist(), t.k.tolist(), t.cn.tolist(), entropy.tolist(), params)
    br.pos = loc.end
    offsets = np.concatenate([[0], np.cumsum(nk)]).astype(np.int64)
    idx = np.empty(int(offsets[-1]), dtype=np.int64)
    _dense_indices(t, idx, offsets)
    _fixed_indices(stream, t, loc, idx, offsets)
    reorder = _entropy_indices(stream, t, loc, params, idx, offsets)
    zeros_known = stream.has_zeros  # then the scales' unary codes cost a binary search
    scales = _scales(br, stream if zeros_known else None, t, scale_b0, scale_w) if scaled else None
    signs = br.flags(int(nk[t.vc == _SIGN1].sum())).astype(bool)
    br.finish()
    val = _values(rest, len(rest) - vbytes, t, offsets, scales, signs)
    if reorder is not None:
        val = reorder(val)
    return FlatPayload(t.ids, t.n, t.k, t.cn, offsets, idx, val)


def _cat(xs: list[np.ndarray], dt: type) -> np.ndarray:
    return np.concatenate([x.reshape(-1) for x in xs]).astype(dt) if xs else np.zeros(0, dt)


def _from_reference(tensors: list[DecodedTensor], layouts: Sequence[tuple[int, int]]) -> FlatPayload:
    ids = np.array([d.tensor_id for d in tensors], dtype=np.int64)
    n = np.array([d.idx.shape[0] for d in tensors], dtype=np.int64)
    k = np.array([d.idx.shape[1] for d in tensors], dtype=np.int64)
    cn = np.array([layouts[i][1] for i in ids.tolist()], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(n * k)]).astype(np.int64)
    return FlatPayload(
        ids,
        n,
        k,
        cn,
        offsets,
        _cat([d.idx for d in tensors], np.int64),
        _cat([d.val for d in tensors], np.float32),
    )


def decode_payload_flat(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits = DEFAULT_LIMITS
) -> FlatPayload:
    """Decode a payload against ``layouts[tensor_id] = (n_chunks, chunk_numel)``, all tensors flat.

    Same checks, codes and results as the reference decoder (module doc). Raises Rejected
    (TOO_LARGE, TRUNCATED, MALFORMED, UNSUPPORTED_VERSION, LIMIT_EXCEEDED, LAYOUT_MISMATCH,
    INDEX_OUT_OF_RANGE, DUPLICATE_INDEX, NON_FINITE_VALUE); KernelError if ``layouts`` itself is
    out of limits. Cost O(len(data) + sum of n * k) in a fixed number of array passes, plus a
    few integer operations per gap-coded tensor.
    """
    count, classes, rest = read_header(data, layouts, limits)  # the reference's own first checks
    try:
        return _fast(layouts, limits, count, classes, rest)
    except (_Bad, Short, Rejected, IndexError, ValueError, OverflowError):
        pass  # the reference decides, with its exact error
    return _from_reference(decode_payload_reference(data, layouts, limits), layouts)


def decode_payload(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits = DEFAULT_LIMITS
) -> list[DecodedTensor]:
    """Decode a payload against ``layouts[tensor_id] = (n_chunks, chunk_numel)``.

    Returns the tensors in ascending id order (views into one flat decode). Raises as
    :func:`decode_payload_flat`. Cost as :func:`decode_payload_flat`.
    """
    return decode_payload_flat(data, layouts, limits).tensors()
