"""The reference payload decoder: the wire format read tensor by tensor, plain numpy (the oracle).

It is the definition the compiled decoder (:mod:`coding_fast`) is held equal to by the
differential tests and fuzzing, the decoder that names every rejection, and the path
:func:`distronet.kernels.coding.decode_payload` takes until the compiled walk is warm (or
without numba). Total: any byte string either decodes or raises ``Rejected`` with a code; every
count and length is checked against the caller's layouts and ``Limits`` before anything is
allocated, so memory stays O(len(data) + the layouts' n * k).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distronet.kernels.coding_bits import BitReader
from distronet.kernels.coding_bucket import check_params, class_values, finish_class, start_class
from distronet.kernels.coding_index import ClassParams, IndexCoding, decode_indices, fixed_width
from distronet.kernels.coding_payload import FlatPayload
from distronet.kernels.coding_table import VALUE_BYTES, read_header, read_table
from distronet.kernels.coding_values import SCALE_BMAX, ZERO_SCALE, CodedValues, ValueCoding, dequantise
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = ["decode_reference"]

_Entry = tuple[int, int, int, int, ValueCoding, IndexCoding]  # id, n, chunk size, k, codings


def _read_params(br: BitReader, bmax: int) -> tuple[int, int]:
    b0, w = (int(x) for x in br.varwidth(np.array([4, 3])))
    check_params(b0, w, bmax, br.what)
    return b0, w


def _read_scales(br: BitReader, scaled: Sequence[_Entry], b0: int, w: int) -> list[np.ndarray]:
    """Per scaled tensor, its chunks' scale codes; NON_FINITE_VALUE for a code out of range."""
    count = sum(e[1] for e in scaled)
    prefix, widths = finish_class(br, start_class(br, count, b0, w), b0, w, SCALE_BMAX)
    sym = class_values(prefix, br.varwidth(widths), b0, w)
    nonzero = sym > 0
    zz = sym[nonzero] - 1
    c = np.full(count, ZERO_SCALE, dtype=np.int64)
    c[nonzero] = np.cumsum((zz >> 1) ^ -(zz & 1))
    out, pos = [], 0
    for tid, n, _cn, k, vc, _ic in scaled:
        mine = c[pos : pos + n]
        lo, hi = vc.code_range(k)
        live = mine[mine != ZERO_SCALE]
        if live.size and (int(live.min()) < lo or int(live.max()) > hi):
            raise Rejected(
                RejectCode.NON_FINITE_VALUE, f"tensor {tid}: a scale outside the finite normal range"
            )
        out.append(mine)
        pos += n
    return out


def _flat(entries: Sequence[_Entry], idx: list[np.ndarray], val: list[np.ndarray]) -> FlatPayload:
    ids, n, cn, k = (np.array([e[i] for e in entries], dtype=np.int64) for i in range(4))
    offsets = np.zeros(len(entries) + 1, dtype=np.int64)
    np.cumsum(n * k, out=offsets[1:])
    return FlatPayload(
        ids,
        n,
        k,
        cn,
        offsets,
        np.concatenate([x.reshape(-1) for x in idx]).astype(np.int64) if idx else np.zeros(0, np.int64),
        np.concatenate([x.reshape(-1) for x in val]).astype(np.float32) if val else np.zeros(0, np.float32),
    )


def decode_reference(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits = DEFAULT_LIMITS
) -> FlatPayload:
    """Decode a payload against ``layouts[tensor_id] = (n_chunks, chunk_numel)``.

    Returns every tensor, ascending id. Raises Rejected with TOO_LARGE, TRUNCATED, MALFORMED,
    UNSUPPORTED_VERSION, LIMIT_EXCEEDED, LAYOUT_MISMATCH, INDEX_OUT_OF_RANGE, DUPLICATE_INDEX or
    NON_FINITE_VALUE; KernelError if ``layouts`` itself is out of limits.
    Cost O(len(data) + sum of n_chunks * k), a dozen array operations per tensor.
    """
    count, classes, rest = read_header(data, layouts, limits)
    br = BitReader(rest, "payload bit stream")
    t = read_table(br, count, classes, layouts, limits)
    entries: list[_Entry] = [
        (tid, n, cn, k, ValueCoding(vc), IndexCoding(ic))
        for tid, n, cn, k, vc, ic in zip(
            *(a.tolist() for a in (t.ids, t.n, t.cn, t.k, t.vc, t.ic)), strict=True
        )
    ]
    vbytes = int((t.n * t.k * VALUE_BYTES[t.vc]).sum())
    if vbytes > len(rest):
        raise Rejected(RejectCode.TRUNCATED, f"{vbytes} bytes of values, {len(rest)} bytes left")
    br.limit(len(rest) - vbytes)
    groups = sorted({cn for _, _, cn, k, _, ic in entries if ic == IndexCoding.ENTROPY and k < cn})
    params = {
        cn: ClassParams(*_read_params(br, fixed_width(cn)), *_read_params(br, fixed_width(cn)))
        for cn in groups
    }
    scaled = [e for e in entries if e[4].has_scale]
    scale_b0, scale_w = _read_params(br, SCALE_BMAX) if scaled else (0, 0)
    indices = [decode_indices(br, ic, n, k, cn, params.get(cn)) for _, n, cn, k, _, ic in entries]
    codes = iter(_read_scales(br, scaled, scale_b0, scale_w))
    signs = br.flags(sum(n * k for _, n, _, k, vc, _ in entries if vc == ValueCoding.SIGN1)).astype(bool)
    br.finish()
    idx_out, val_out = [], []
    vpos, spos = len(rest) - vbytes, 0
    for (_tid, n, _cn, k, vc, _ic), (idx, order) in zip(entries, indices, strict=True):
        nv = int(VALUE_BYTES[vc]) * n * k
        coded = CodedValues(rest[vpos : vpos + nv])
        vpos += nv
        if vc.has_scale:
            coded = CodedValues(coded.data, scale_codes=next(codes))
        if vc == ValueCoding.SIGN1:
            coded = CodedValues(signs=signs[spos : spos + n * k], scale_codes=coded.scale_codes)
            spos += n * k
        val = dequantise(coded, vc, n, k)
        idx_out.append(idx)
        val_out.append(val if order is None else np.take_along_axis(val, order, axis=1))
    return _flat(entries, idx_out, val_out)
