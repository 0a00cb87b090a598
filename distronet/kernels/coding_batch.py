"""The payload encoder for many tensors at once: one pass per coding group, not per tensor.

``encode_tensor`` + ``encode_payload`` (:mod:`coding`, :mod:`coding_payload`) code a payload
tensor by tensor: a model's ~50-400 tensors cost ~50 small numpy operations each, which on the
built-in GPT's 53 tensors is most of an encode. :func:`encode_groups` writes the SAME bytes (the
wire format is unchanged; ``test_coding_batch.py`` holds the two equal byte for byte) from
*coding groups*: every tensor of one ``(chunk_numel, k, value coding, index coding)`` sits in one
``(N, k)`` array, side by side, so each step of the coding runs once per group:

* the canonical order check, the value quantisation (per chunk: row-wise, so a group's result
  is its members' results stacked);
* ENTROPY's choice of a rank map per tensor, its gaps and wire order (:mod:`coding_batch_plan`:
  compiled, every group's tensors in pieces over a few threads, or whole-array numpy passes);
* the bucket code's parameters per chunk size, and its fields, escapes and mantissas of all
  members: one compiled pass per group once warm (:func:`_fields_compiled`), else numpy passes
  (escapes as zero-width fields where there is none: ``pack_bits`` drops those).

What stays per tensor is slicing: the payload's bit stream is ordered by tensor id, so each
tensor's fields are cut from its group's arrays and joined once (a few slices a tensor).
Cost: O(coefficients) numpy work in a few dozen operations per group, plus ~10 slices a tensor.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distronet.kernels import coding_batch_plan
from distronet.kernels.coding_batch_plan import _entropy, _plan_job, _PlanJob, _put_rows, _take_rows
from distronet.kernels.coding_bits import append_flags, pack_bits, unary_fields
from distronet.kernels.coding_bucket import (
    RICE,
    Part,
    best_params_hist,
    buckets_of,
    centre_out,
    choose_params,
    rice_best,
)
from distronet.kernels.coding_index import (
    MAX_CHUNK_NUMEL,
    ClassParams,
    IndexCoding,
    RankMap,
    fixed_width,
)
from distronet.kernels.coding_payload import _scale_parts_of, frame_head
from distronet.kernels.coding_values import ValueCoding, quantise
from distronet.kernels.fanout import map_in_order
from distronet.kernels.jit_state import use_jit
from distronet.protocol.errors import KernelError

__all__ = ["CodingGroup", "encode_batch", "encode_groups"]


@dataclass(frozen=True)
class CodingGroup:
    """Tensors of one coding class, their chunks stacked: tensor ``tensor_ids[j]`` owns rows
    ``sum(rows[:j]) .. sum(rows[:j + 1])`` of ``idx`` int64 ``(N, k)`` (unique per chunk, in
    ``[0, chunk_numel)``) and ``val`` float32 ``(N, k)``."""

    tensor_ids: tuple[int, ...]
    rows: tuple[int, ...]
    idx: np.ndarray
    val: np.ndarray
    chunk_numel: int
    value_coding: ValueCoding
    index_coding: IndexCoding


@dataclass
class _Coded:
    """One group after coding (internal): what the payload assembly slices per tensor."""

    group: CodingGroup
    start: np.ndarray  # (T + 1,) row offsets
    k: int
    dense: bool
    rank_map: list[RankMap | None]  # per tensor (None: FIXED, or dense)
    idx: np.ndarray  # sorted per chunk
    gaps: np.ndarray | None  # (N, k) ENTROPY gaps (rows of FALLBACK tensors unused)
    values: np.ndarray  # the coded values' byte view per row: (N, bytes per row), or signs
    signs: np.ndarray | None  # bool (N, k) for SIGN1
    scale_codes: np.ndarray | None  # (N,)
    deq: np.ndarray  # (N, k) dequantised, in the caller's idx order


@dataclass
class _Checked:
    """A group's checked arrays, indices ascending in every row (``canon``: the permutation that
    sorted them, None where they already were), and its rows' tensor boundaries (internal)."""

    idx: np.ndarray
    val: np.ndarray
    canon: np.ndarray | None
    start: np.ndarray

    def entropy(self, g: CodingGroup) -> bool:
        """Whether its indices are ENTROPY-coded (not dense)."""
        return g.index_coding == IndexCoding.ENTROPY and self.idx.shape[1] < g.chunk_numel


def _check_group(g: CodingGroup) -> _Checked:
    idx = np.asarray(g.idx, dtype=np.int64)
    val = np.asarray(g.val, dtype=np.float32)
    cn = g.chunk_numel
    if idx.ndim != 2 or val.shape != idx.shape:
        raise KernelError(f"idx {idx.shape} and val {val.shape} must both be (n_chunks, k)")
    if len(g.rows) != len(g.tensor_ids) or any(r < 1 for r in g.rows) or sum(g.rows) != idx.shape[0]:
        raise KernelError(f"rows {g.rows[:8]} do not split {idx.shape[0]} chunks among the tensors")
    if any(t < 0 for t in g.tensor_ids):
        raise KernelError("a tensor id < 0")
    k = idx.shape[1]
    if not 1 <= cn <= MAX_CHUNK_NUMEL:
        raise KernelError(f"chunk_numel {cn} outside 1..{MAX_CHUNK_NUMEL}")
    if not 1 <= k <= cn:
        raise KernelError(f"need 1 <= k <= chunk_numel, got k = {k} for {cn}")
    if int(idx.min()) < 0 or int(idx.max()) >= cn:
        raise KernelError(f"indices must lie in [0, {cn})")
    canon = None
    if k > 1 and (np.diff(idx, axis=1) <= 0).any():
        canon = np.argsort(idx, axis=1, kind="stable")
        idx = np.take_along_axis(idx, canon, axis=1)
        if (np.diff(idx, axis=1) == 0).any():
            raise KernelError("an index repeats within a chunk")
        val = np.take_along_axis(val, canon, axis=1)
    return _Checked(idx, val, canon, np.concatenate([[0], np.cumsum(g.rows)]).astype(np.int64))


def _code_group(g: CodingGroup, checked: _Checked, job: _PlanJob | None = None) -> _Coded:
    """Code a checked group; ``job``: its ENTROPY planning, already run (else planned here)."""
    idx, val, canon, start = checked.idx, checked.val, checked.canon, checked.start
    cn, vc, k, t = g.chunk_numel, g.value_coding, idx.shape[1], len(g.tensor_ids)
    dense = k == cn
    gaps, wire = None, None
    rank_map: list[RankMap | None] = [None] * t
    if checked.entropy(g):
        rank_map, gaps, wire = job.result() if job is not None else _entropy(idx, cn, start)
    wval = val if wire is None else _take_rows(val, wire)
    coded, deq_wire = quantise(wval, vc)
    if wire is None:
        deq = deq_wire
    else:
        deq = np.empty_like(deq_wire)
        _put_rows(deq, wire, deq_wire)
    if canon is not None:
        out = np.empty_like(deq)
        np.put_along_axis(out, canon, deq, axis=1)
        deq = out
    n = idx.shape[0]
    values = (
        np.frombuffer(coded.data, dtype=np.uint8).reshape(n, -1) if coded.data else np.zeros((n, 0), np.uint8)
    )
    signs = None if coded.signs is None else coded.signs.reshape(n, k)
    return _Coded(g, start, k, dense, rank_map, idx, gaps, values, signs, coded.scale_codes, deq)


@dataclass
class _Streams:
    """A group's bucket-code fields for its ENTROPY rows, per element (internal)."""

    fa: Part
    fb: Part
    ea: Part
    eb: Part
    mant: Part  # (n, k) interleaved: class A's mantissa then class B's


def _class_elems(x: np.ndarray, b0: int, w: int, bmax: int) -> tuple[Part, Part, Part]:
    """``class_parts`` with one field, one escape and one mantissa per symbol (width 0 where
    ``class_parts`` writes none): pack_bits drops zero-width fields, so the bits are the same."""
    if w == RICE:
        q = x >> b0
        return (
            (np.zeros_like(x), np.zeros_like(x)),
            unary_fields(q),
            (x & ((1 << b0) - 1), np.full(x.size, b0)),
        )
    b = buckets_of(x)
    place = np.empty(bmax + 1, dtype=np.int64)
    place[centre_out(b0, bmax)] = np.arange(bmax + 1)
    rho = place[b]
    lim = (1 << w) - 1
    field = (np.minimum(rho, lim), np.full(rho.size, w, dtype=np.int64))
    esc = rho >= lim
    q = np.where(esc, rho - lim, 0)
    escape = (np.where(esc, (np.int64(1) << (q + 1)) - 2, 0), np.where(esc, q + 1, 0))
    width = np.maximum(b - 1, 0)
    return field, escape, (x & ((np.int64(1) << width) - 1), width)


def _streams(c: _Coded, params: ClassParams) -> _Streams:
    assert c.gaps is not None
    n, k = c.gaps.shape
    bmax = fixed_width(c.group.chunk_numel)
    p = params
    fa, ea, (va, wa) = _class_elems(c.gaps[:, 0], p.b0_a, p.w_a, bmax)
    fb, eb, (vb, wb) = _class_elems(c.gaps[:, 1:].reshape(-1), p.b0_b, p.w_b, bmax)
    mant_v = np.concatenate([va[:, None], vb.reshape(n, k - 1)], axis=1).reshape(-1)
    mant_w = np.concatenate([wa[:, None], wb.reshape(n, k - 1)], axis=1).reshape(-1)
    return _Streams(fa, fb, ea, eb, (mant_v, mant_w))


def _fields_compiled(c: _Coded, params: ClassParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An ENTROPY group's bit fields, tensor after tensor (:func:`coding_jit_index.streams`:
    one compiled pass for what :func:`_streams`, the per-tensor cuts and the rank-map and
    fallback parts build with some thirty numpy passes): ``(values, widths, at)``, tensor ``j``'s
    fields from ``at[j]`` to ``at[j + 1]``."""
    from distronet.kernels.coding_jit_index import streams

    assert c.gaps is not None
    g = c.group
    n, k = c.gaps.shape
    t = len(g.tensor_ids)
    bmax = fixed_width(g.chunk_numel)
    maps = np.array([int(m) for m in c.rank_map if m is not None], dtype=np.int64)
    values = np.empty(3 * n * k + t, dtype=np.int64)
    widths = np.empty_like(values)
    at = np.empty(t + 1, dtype=np.int64)
    streams(
        c.gaps,
        np.ascontiguousarray(c.idx),
        c.start,
        maps,
        bmax,
        params.b0_a,
        params.w_a,
        _place(params.b0_a, bmax),
        params.b0_b,
        params.w_b,
        _place(params.b0_b, bmax),
        values,
        widths,
        at,
    )
    return values, widths, at


@functools.lru_cache(maxsize=256)
def _place(b0: int, bmax: int) -> np.ndarray:
    """Each bucket's place in the centre-out order from ``b0`` (do not modify)."""
    place = np.zeros(bmax + 1, dtype=np.int64)
    if b0 <= bmax:
        place[centre_out(b0, bmax)] = np.arange(bmax + 1)
    return place


def _choose_compiled(live: Sequence[tuple[_Coded, int]], bmax: int, first: bool) -> tuple[int, int]:
    """``choose_params`` of one class (``first``: each row's first gap, else the others) of the
    tensors ``live`` (group, member), from compiled passes over their rows where they lie
    (:func:`coding_jit_index.class_stats`, ``shifted_sum``) instead of concatenated copies: the
    same parameters (integer sums; the mean and its log2 taken as ``choose_params`` takes them)."""
    from distronet.kernels.coding_jit_index import class_stats, shifted_sum

    by: dict[int, tuple[_Coded, list[int]]] = {}
    for c, j in live:
        by.setdefault(id(c), (c, []))[1].append(j)
    spans = []
    for c, js in by.values():
        assert c.gaps is not None
        sel = np.array(js, dtype=np.int64)
        spans.append((c.gaps, c.start[sel], c.start[sel + 1]))
    hist = np.zeros(bmax + 1, dtype=np.int64)
    total = count = top = 0
    for gaps, r0s, r1s in spans:
        s, n, t = class_stats(gaps, r0s, r1s, first, hist)
        total, count, top = total + s, count + n, max(top, t)
    if count == 0:
        return 0, 0
    cost, b0, w = best_params_hist(hist, bmax)
    rice, m = rice_best(
        float(np.float64(total) / count),
        top,
        count,
        lambda m: sum(int(shifted_sum(g, a, b, first, m)) for g, a, b in spans),
        bmax,
    )
    return (m, RICE) if rice < cost else (b0, w)


def _cut(part: Part, a: int, b: int) -> Part:
    return part[0][a:b], part[1][a:b]


def encode_groups(groups: Sequence[CodingGroup]) -> tuple[bytes, list[np.ndarray]]:
    """The payload of every tensor of ``groups`` (unique ids, any order), byte for byte what
    ``encode_payload([encode_tensor(...) for each tensor])`` writes, and each group's dequantised
    values ``(N, k)`` in its ``idx`` order (``encode_tensor``'s second result, stacked).

    Raises KernelError as ``encode_tensor`` and ``encode_payload`` do (bad shapes, indices out of
    range or repeated, NaN/Inf values, a repeated tensor id, more than 15 classes).
    """
    checked = [_check_group(g) for g in groups]
    jobs = {
        gi: job
        for gi, (g, c) in enumerate(zip(groups, checked, strict=True))
        if c.entropy(g) and (job := _plan_job(c.idx, g.chunk_numel, c.start)) is not None
    }
    size = coding_batch_plan.PLAN_PIECE_ROWS
    pieces = [(job, t0, t1) for job in jobs.values() for t0, t1 in job.pieces(size)]
    if pieces:  # the compiled planning holds no GIL: every group's pieces over a few threads
        import torch

        map_in_order(
            lambda i: pieces[i][0].run(pieces[i][1], pieces[i][2]), len(pieces), torch.get_num_threads()
        )
    coded = [_code_group(g, c, jobs.get(gi)) for gi, (g, c) in enumerate(zip(groups, checked, strict=True))]
    # (tensor id, group, member) in id order
    members = sorted((tid, gi, j) for gi, c in enumerate(coded) for j, tid in enumerate(c.group.tensor_ids))
    if any(a[0] == b[0] for a, b in itertools.pairwise(members)):
        raise KernelError("a tensor id appears twice")
    keys = []
    for _, gi, _j in members:
        c = coded[gi]
        g = c.group
        keys.append((int(g.value_coding) << 4 | int(g.index_coding), 0 if c.dense else c.k))
    head, parts = frame_head([m[0] for m in members], keys)
    # Bucket-code parameters per chunk size of the ENTROPY tensors (``_group_params``).
    ent = [(gi, j) for _, gi, j in members if _entropy_member(coded[gi])]
    cns = sorted({coded[gi].group.chunk_numel for gi, _ in ent})
    params: dict[int, ClassParams] = {}
    for cn in cns:
        rows = [(coded[gi], j) for gi, j in ent if coded[gi].group.chunk_numel == cn]
        live = [(c, j) for c, j in rows if c.rank_map[j] is not RankMap.FALLBACK]
        if not live:
            params[cn] = ClassParams()
            continue
        bmax = fixed_width(cn)
        if use_jit():
            b0a, wa = _choose_compiled(live, bmax, True)
            b0b, wb = _choose_compiled(live, bmax, False)
        else:
            gap_rows = [c.gaps[c.start[j] : c.start[j + 1]] for c, j in live]  # type: ignore[index]
            b0a, wa = choose_params(np.concatenate([r[:, 0] for r in gap_rows]), bmax)
            b0b, wb = choose_params(np.concatenate([r[:, 1:].reshape(-1) for r in gap_rows]), bmax)
        params[cn] = ClassParams(b0a, wa, b0b, wb)
    for cn in cns:
        p = params[cn]
        parts.append((np.array([p.b0_a, p.w_a, p.b0_b, p.w_b]), np.array([4, 3, 4, 3])))
    codes = [
        coded[gi].scale_codes[coded[gi].start[j] : coded[gi].start[j + 1]]  # type: ignore[index]
        for _, gi, j in members
        if coded[gi].scale_codes is not None
    ]
    scale_parts = _scale_parts_of(np.concatenate(codes)) if codes else []
    parts += scale_parts[:1]
    compiled = use_jit()
    fields = {
        gi: _fields_compiled(c, params[c.group.chunk_numel])
        for gi, c in enumerate(coded)
        if compiled and c.gaps is not None and _entropy_member(c)
    }
    streams = {
        gi: _streams(c, params[c.group.chunk_numel])
        for gi, c in enumerate(coded)
        if gi not in fields and c.gaps is not None and any(m is not RankMap.FALLBACK for m in c.rank_map)
    }
    for _, gi, j in members:
        c = coded[gi]
        if c.dense:
            continue
        if gi in fields:  # the tensor's rank map and every field of its indices, as below
            fv, fw, at = fields[gi]
            parts.append((fv[at[j] : at[j + 1]], fw[at[j] : at[j + 1]]))
            continue
        a, b = int(c.start[j]), int(c.start[j + 1])
        rm = c.rank_map[j]
        if rm is not None:
            parts.append((np.array([int(rm)]), np.array([2])))
        if rm is None or rm is RankMap.FALLBACK:
            v = c.idx[a:b].reshape(-1)
            parts.append((v, np.full(v.size, fixed_width(c.group.chunk_numel), dtype=np.int64)))
            continue
        s, k1 = streams[gi], c.k - 1
        parts += [
            _cut(s.fa, a, b),
            _cut(s.fb, a * k1, b * k1),
            _cut(s.ea, a, b),
            _cut(s.eb, a * k1, b * k1),
            _cut(s.mant, a * c.k, b * c.k),
        ]
    parts += scale_parts[1:]
    widths = np.concatenate([p[1] for p in parts])
    bits = pack_bits(np.concatenate([p[0] for p in parts]), widths)
    signs = [
        coded[gi].signs[coded[gi].start[j] : coded[gi].start[j + 1]].reshape(-1)  # type: ignore[index]
        for _, gi, j in members
        if coded[gi].signs is not None
    ]
    if signs:
        bits = append_flags(bits, int(widths.sum()), np.concatenate(signs))
    data = b"".join(
        coded[gi].values[coded[gi].start[j] : coded[gi].start[j + 1]].tobytes()
        for _, gi, j in members
        if coded[gi].values.shape[1]
    )
    return bytes(head) + bits + data, [c.deq for c in coded]


def _entropy_member(c: _Coded) -> bool:
    return c.group.index_coding == IndexCoding.ENTROPY and not c.dense


def encode_batch(
    items: Sequence[tuple[int, np.ndarray, np.ndarray, int, ValueCoding, IndexCoding]],
) -> tuple[bytes, list[np.ndarray]]:
    """``encode_groups`` of per-tensor ``(tensor_id, idx, val, chunk_numel, value coding, index
    coding)`` (``encode_tensor``'s arguments): tensors of one class are stacked into one group
    (a copy). Returns the payload and each tensor's dequantised values, in ``items`` order."""
    by: dict[tuple[int, int, ValueCoding, IndexCoding], list[int]] = {}
    for i, (_tid, idx, _val, cn, vc, ic) in enumerate(items):
        if np.ndim(idx) != 2:
            raise KernelError(f"idx of shape {np.shape(idx)} must be (n_chunks, k)")
        by.setdefault((cn, int(np.shape(idx)[1]), vc, ic), []).append(i)
    groups, where = [], []
    for (cn, _k, vc, ic), members in by.items():
        groups.append(
            CodingGroup(
                tuple(items[i][0] for i in members),
                tuple(int(np.shape(items[i][1])[0]) for i in members),
                np.concatenate([np.asarray(items[i][1], dtype=np.int64) for i in members]),
                np.concatenate([np.asarray(items[i][2], dtype=np.float32) for i in members]),
                cn,
                vc,
                ic,
            )
        )
        where.append(members)
    payload, deqs = encode_groups(groups)
    out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(items)
    for members, g, deq in zip(where, groups, deqs, strict=True):
        row = 0
        for i, n in zip(members, g.rows, strict=True):
            out[i] = deq[row : row + n]
            row += n
    return payload, out
