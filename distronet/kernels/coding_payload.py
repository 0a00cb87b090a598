"""The coded payload: every tensor's indices, scales and values in one byte string.

Layout (byte-exact definition in docs/protocol-payload.md)::

    u8 version (=1) | varint tensor count | varint class count m | m x (u8 codings, varint k)
    bit stream: tensor id deltas (unary) | class of each tensor | bucket-code parameters |
                index codes | scale codes (deltas) | sign bits | zero padding
    byte values (fp32 / fp16 / bf16 / int8 tensors, little-endian)

Per-tensor framing is a few bits, not bytes: a 0.9M-parameter model's 53 tensors cost ~10
bytes of header in total. ``decode_payload`` is total: any byte string either decodes or raises
``Rejected`` with a code; every count and length is checked against the caller's layouts and
``Limits`` before anything is allocated, so memory stays O(len(data) + the layouts' n * k).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import BitReader, ByteReader, append_flags, pack_bits, unary_fields, varint
from distronet.kernels.coding_bucket import (
    Part,
    check_params,
    choose_params,
    class_parts,
    class_values,
    finish_class,
    start_class,
)
from distronet.kernels.coding_index import (
    MAX_CHUNK_NUMEL,
    ClassParams,
    IndexCode,
    IndexCoding,
    decode_indices,
    fixed_width,
    index_parts,
)
from distronet.kernels.coding_values import (
    ZERO_SCALE,
    CodedValues,
    ValueCoding,
    dequantise,
    value_section_len,
)
from distronet.protocol.errors import KernelError, RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = ["PAYLOAD_VERSION", "DecodedTensor", "EncodedTensor", "decode_payload_reference", "encode_payload"]

PAYLOAD_VERSION = 1
MAX_CLASSES = 15
_SCALE_BMAX = 12  # scale symbols are < 2**12: 0, or zigzag(delta) + 1 with |delta| <= 2031


@dataclass(frozen=True)
class EncodedTensor:
    """One tensor's coded form, as ``encode_tensor`` makes it and ``encode_payload`` frames it."""

    tensor_id: int
    value_coding: ValueCoding
    index_coding: IndexCoding
    n_chunks: int
    k: int
    chunk_numel: int
    index: IndexCode | None  # None for a dense tensor (k == chunk_numel)
    values: CodedValues

    @property
    def entropy_group(self) -> bool:
        """Shares its chunk size's bucket-code parameters (ENTROPY and not dense)."""
        return self.index_coding == IndexCoding.ENTROPY and self.k < self.chunk_numel


@dataclass(frozen=True)
class DecodedTensor:
    """One decoded tensor: ``idx`` int64 (n_chunks, k), ascending and unique per chunk; ``val`` float32."""

    tensor_id: int
    idx: np.ndarray
    val: np.ndarray


def _zigzag(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.where(x >= 0, 2 * x, -2 * x - 1)
    return out


def _params_bits(params: ClassParams) -> Part:
    p = params
    return np.array([p.b0_a, p.w_a, p.b0_b, p.w_b]), np.array([4, 3, 4, 3])


def _group_params(ts: Sequence[EncodedTensor], cn: int) -> ClassParams:
    """Cheapest shared parameters for the ENTROPY tensors of chunk size ``cn``."""
    codes = [t.index for t in ts if t.entropy_group and t.chunk_numel == cn]
    gaps = [c.values for c in codes if c is not None and c.buckets is not None]
    if not gaps:
        return ClassParams()
    bmax = fixed_width(cn)
    b0a, wa = choose_params(np.concatenate([g[:, 0] for g in gaps]), bmax)
    b0b, wb = choose_params(np.concatenate([g[:, 1:].reshape(-1) for g in gaps]), bmax)
    return ClassParams(b0a, wa, b0b, wb)


def _scale_symbols(c: np.ndarray) -> np.ndarray:
    """0 for a zero scale, else zigzag(c - previous non-zero chunk's c) + 1 (previous starts at 0)."""
    nonzero = c != ZERO_SCALE
    cn = c[nonzero]
    sym = np.zeros(c.size, dtype=np.int64)
    sym[nonzero] = _zigzag(np.diff(cn, prepend=0)) + 1
    return sym


def _scale_parts(ts: Sequence[EncodedTensor]) -> list[Part]:
    codes = [t.values.scale_codes for t in ts if t.values.scale_codes is not None]
    if not codes:
        return []
    sym = _scale_symbols(np.concatenate(codes))
    b0, w = choose_params(sym, _SCALE_BMAX)
    return [(np.array([b0, w]), np.array([4, 3])), *class_parts(sym, b0, w, _SCALE_BMAX)]


def encode_payload(tensors: Sequence[EncodedTensor]) -> bytes:
    """Frame coded tensors (any order, unique ids; each keeps its own codings and k).

    Raises KernelError on a repeated tensor id or more than 15 (codings, k) classes.
    Cost O(total coefficients).
    """
    ts = sorted(tensors, key=lambda t: t.tensor_id)
    if any(a.tensor_id == b.tensor_id for a, b in itertools.pairwise(ts)):
        raise KernelError("a tensor id appears twice")
    keys = [(int(t.value_coding) << 4 | int(t.index_coding), 0 if t.k == t.chunk_numel else t.k) for t in ts]
    classes = list(dict.fromkeys(keys))
    if len(classes) > MAX_CLASSES:
        raise KernelError(f"{len(classes)} (codings, k) classes in one payload > {MAX_CLASSES}")
    head = bytearray([PAYLOAD_VERSION]) + varint(len(ts)) + varint(len(classes))
    for codings, k in classes:
        head += bytes([codings]) + varint(k)
    ids = np.array([t.tensor_id for t in ts], dtype=np.int64)
    parts: list[Part] = [unary_fields(np.diff(ids, prepend=-1) - 1)]
    cw = (len(classes) - 1).bit_length()
    parts.append((np.array([classes.index(key) for key in keys], dtype=np.int64), np.full(len(ts), cw)))
    groups = sorted({t.chunk_numel for t in ts if t.entropy_group})
    params = {cn: _group_params(ts, cn) for cn in groups}
    parts += [_params_bits(params[cn]) for cn in groups]
    scale_parts = _scale_parts(ts)
    parts += scale_parts[:1]
    for t in ts:
        if t.index is not None:
            parts += index_parts(t.index, t.chunk_numel, params.get(t.chunk_numel, ClassParams()))
    parts += scale_parts[1:]
    widths = np.concatenate([p[1] for p in parts])
    bits = pack_bits(np.concatenate([p[0] for p in parts]), widths)
    signs = [t.values.signs for t in ts if t.values.signs is not None]
    if signs:  # the stream's last part: one packbits instead of a field per bit
        bits = append_flags(bits, int(widths.sum()), np.concatenate(signs))
    return bytes(head) + bits + b"".join(t.values.data for t in ts)


@dataclass(frozen=True)
class _Entry:
    tid: int
    n: int
    cn: int
    k: int
    vc: ValueCoding
    ic: IndexCoding


def _check_layouts(layouts: Sequence[tuple[int, int]], limits: Limits) -> None:
    if len(layouts) > limits.max_tensors:
        raise KernelError(f"{len(layouts)} tensors in the layout > limit {limits.max_tensors}")
    cap = min(limits.max_chunk_numel, MAX_CHUNK_NUMEL)
    for i, (n, cn) in enumerate(layouts):
        if not (1 <= n <= limits.max_chunks_per_tensor and 1 <= cn <= cap):
            raise KernelError(f"layout {i}: n_chunks={n}, chunk_numel={cn} outside the limits")


def _read_classes(r: ByteReader, limits: Limits) -> list[tuple[ValueCoding, IndexCoding, int]]:
    m = r.varint("class count")
    if m > MAX_CLASSES:
        raise Rejected(RejectCode.MALFORMED, f"{m} classes > {MAX_CLASSES}")
    out = []
    for _ in range(m):
        byte, k = r.u8("codings"), r.varint("k")
        vc, ic = byte >> 4, byte & 15
        if vc not in ValueCoding._value2member_map_ or ic not in IndexCoding._value2member_map_:
            raise Rejected(RejectCode.MALFORMED, f"unknown coding (value {vc}, index {ic})")
        if k > limits.max_k:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"k={k} > max_k {limits.max_k}")
        out.append((ValueCoding(vc), IndexCoding(ic), k))
    return out


def _read_table(
    br: BitReader,
    count: int,
    classes: list[tuple[ValueCoding, IndexCoding, int]],
    layouts: Sequence[tuple[int, int]],
    limits: Limits,
) -> list[_Entry]:
    """Tensor ids and classes; checks ids, k <= chunk_numel and the coefficient total."""
    if count and not classes:
        raise Rejected(RejectCode.MALFORMED, f"{count} tensors but no class")
    ids = np.cumsum(br.unary(count, len(layouts)) + 1) - 1
    if count and int(ids[-1]) >= len(layouts):
        raise Rejected(
            RejectCode.LAYOUT_MISMATCH, f"tensor id {int(ids[-1])} not in a layout of {len(layouts)}"
        )
    cls = br.fields(count, (len(classes) - 1).bit_length())
    if count and int(cls.max()) >= len(classes):
        raise Rejected(RejectCode.MALFORMED, f"class {int(cls.max())} of {len(classes)}")
    out, total, value_bits = [], 0, 0
    for tid, c in zip(ids.tolist(), cls.tolist(), strict=True):
        n, cn = layouts[tid]
        vc, ic, k = classes[c]
        k = k or cn
        if k > cn or k > limits.max_k:
            raise Rejected(
                RejectCode.LIMIT_EXCEEDED, f"tensor {tid}: k={k} > chunk {cn} or max_k {limits.max_k}"
            )
        total += n * k
        if total > limits.max_total_coefficients:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {limits.max_total_coefficients} coefficients")
        value_bits += n * k * (1 if vc == ValueCoding.SIGN1 else 8 * value_section_len(vc, 1))
        if value_bits > br.nbits:  # every coefficient's value takes >= 1 bit: no amplification
            raise Rejected(RejectCode.TRUNCATED, f"{total} coefficients declared in {br.nbits // 8} bytes")
        out.append(_Entry(tid, n, cn, k, vc, ic))
    return out


def _read_params(br: BitReader, bmax: int) -> tuple[int, int]:
    b0, w = (int(x) for x in br.varwidth(np.array([4, 3])))
    check_params(b0, w, bmax, br.what)
    return b0, w


def _read_scales(br: BitReader, scaled: Sequence[_Entry], b0: int, w: int) -> list[np.ndarray]:
    """Per scaled tensor, its chunks' scale codes; NON_FINITE_VALUE for a code out of range."""
    count = sum(e.n for e in scaled)
    prefix, widths = finish_class(br, start_class(br, count, b0, w), b0, w, _SCALE_BMAX)
    sym = class_values(prefix, br.varwidth(widths), b0, w)
    nonzero = sym > 0
    zz = sym[nonzero] - 1
    c = np.full(count, ZERO_SCALE, dtype=np.int64)
    c[nonzero] = np.cumsum((zz >> 1) ^ -(zz & 1))
    out, pos = [], 0
    for e in scaled:
        mine = c[pos : pos + e.n]
        lo, hi = e.vc.code_range(e.k)
        live = mine[mine != ZERO_SCALE]
        if live.size and (int(live.min()) < lo or int(live.max()) > hi):
            raise Rejected(
                RejectCode.NON_FINITE_VALUE, f"tensor {e.tid}: a scale outside the finite normal range"
            )
        out.append(mine)
        pos += e.n
    return out


def read_header(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits
) -> tuple[int, list[tuple[ValueCoding, IndexCoding, int]], bytes]:
    """Checks up to the class table: (tensor count, classes, the bytes after the table).

    Shared by every decoder, so their first rejections are the same. Raises KernelError for
    out-of-limit ``layouts``; Rejected (TOO_LARGE, UNSUPPORTED_VERSION, LIMIT_EXCEEDED,
    MALFORMED, TRUNCATED).
    """
    _check_layouts(layouts, limits)
    if len(data) > limits.max_payload_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"payload of {len(data)} bytes > {limits.max_payload_bytes}")
    r = ByteReader(bytes(data))
    version = r.u8("version")
    if version != PAYLOAD_VERSION:
        raise Rejected(RejectCode.UNSUPPORTED_VERSION, f"payload version {version}")
    count = r.varint("tensor count")
    if count > min(limits.max_tensors, len(layouts)):
        raise Rejected(RejectCode.LIMIT_EXCEEDED, f"{count} tensors, layout has {len(layouts)}")
    classes = _read_classes(r, limits)
    return count, classes, r.take(r.remaining, "body")


def decode_payload_reference(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits = DEFAULT_LIMITS
) -> list[DecodedTensor]:
    """Decode a payload against ``layouts[tensor_id] = (n_chunks, chunk_numel)``.

    Returns the tensors in ascending id order. Raises Rejected with TOO_LARGE, TRUNCATED,
    MALFORMED, UNSUPPORTED_VERSION, LIMIT_EXCEEDED, LAYOUT_MISMATCH, INDEX_OUT_OF_RANGE,
    DUPLICATE_INDEX or NON_FINITE_VALUE; KernelError if ``layouts`` itself is out of limits.
    Cost O(len(data) + sum of n_chunks * k).
    """
    count, classes, rest = read_header(data, layouts, limits)
    br = BitReader(rest, "payload bit stream")
    entries = _read_table(br, count, classes, layouts, limits)
    vbytes = sum(value_section_len(e.vc, e.n * e.k) for e in entries)
    if vbytes > len(rest):
        raise Rejected(RejectCode.TRUNCATED, f"{vbytes} bytes of values, {len(rest)} bytes left")
    br.limit(len(rest) - vbytes)
    groups = sorted({e.cn for e in entries if e.ic == IndexCoding.ENTROPY and e.k < e.cn})
    params = {
        cn: ClassParams(*_read_params(br, fixed_width(cn)), *_read_params(br, fixed_width(cn)))
        for cn in groups
    }
    scaled = [e for e in entries if e.vc.has_scale]
    scale_b0, scale_w = _read_params(br, _SCALE_BMAX) if scaled else (0, 0)
    indices = [decode_indices(br, e.ic, e.n, e.k, e.cn, params.get(e.cn)) for e in entries]
    codes = iter(_read_scales(br, scaled, scale_b0, scale_w))
    signs = br.flags(sum(e.n * e.k for e in entries if e.vc == ValueCoding.SIGN1)).astype(bool)
    br.finish()
    out: list[DecodedTensor] = []
    vpos, spos = len(rest) - vbytes, 0
    for e, (idx, order) in zip(entries, indices, strict=True):
        nv = value_section_len(e.vc, e.n * e.k)
        coded = CodedValues(rest[vpos : vpos + nv])
        vpos += nv
        if e.vc.has_scale:
            coded = CodedValues(coded.data, scale_codes=next(codes))
        if e.vc == ValueCoding.SIGN1:
            coded = CodedValues(signs=signs[spos : spos + e.n * e.k], scale_codes=coded.scale_codes)
            spos += e.n * e.k
        val = dequantise(coded, e.vc, e.n, e.k)
        out.append(
            DecodedTensor(e.tid, idx, val if order is None else np.take_along_axis(val, order, axis=1))
        )
    return out
