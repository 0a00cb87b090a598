"""The coded payload: every tensor's indices, scales and values in one byte string.

Layout (byte-exact definition in docs/protocol-payload.md)::

    u8 version (=1) | varint tensor count
    per tensor:  varint id delta | u8 codings (value << 4 | index) | varint k
                 [varint index bytes] | [varint scale word] | index | scales | values

``decode_payload`` is total: any byte string either decodes or raises ``Rejected`` with a
code, and every count and length is checked against the caller's layouts and ``Limits``
before anything is allocated, so memory stays O(len(data) + the layouts' coefficients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import ByteReader, varint, zigzag
from distronet.kernels.coding_index import (
    MAX_CHUNK_NUMEL,
    IndexCoding,
    decode_indices,
    fixed_width,
    max_index_section_len,
)
from distronet.kernels.coding_values import (
    MAX_SCALE_WIDTH,
    CodedValues,
    ValueCoding,
    dequantise,
    value_section_len,
)
from distronet.protocol.errors import KernelError, RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = ["PAYLOAD_VERSION", "DecodedTensor", "EncodedTensor", "decode_payload", "encode_payload"]

PAYLOAD_VERSION = 1


@dataclass(frozen=True)
class EncodedTensor:
    """One tensor's coded form, as ``encode_tensor`` makes it and ``encode_payload`` frames it."""

    tensor_id: int
    value_coding: ValueCoding
    index_coding: IndexCoding
    n_chunks: int
    k: int
    chunk_numel: int
    index_section: bytes
    values: CodedValues

    @property
    def nbytes(self) -> int:
        """Bytes of its sections (without the few bytes of per-tensor framing)."""
        v = self.values
        return len(self.index_section) + len(v.scales) + len(v.values)


@dataclass(frozen=True)
class DecodedTensor:
    """One decoded tensor: ``idx`` int64 (n_chunks, k), ascending and unique per chunk; ``val`` float32."""

    tensor_id: int
    idx: np.ndarray
    val: np.ndarray


def _has_index_len(index_coding: IndexCoding, k: int, chunk_numel: int) -> bool:
    return index_coding == IndexCoding.ENTROPY and k < chunk_numel


def encode_payload(tensors: Sequence[EncodedTensor]) -> bytes:
    """Frame coded tensors (any order, unique ids; each tensor keeps its own codings).

    Raises KernelError on a repeated tensor id. Cost O(total bytes).
    """
    out = bytearray([PAYLOAD_VERSION])
    out += varint(len(tensors))
    prev = -1
    for t in sorted(tensors, key=lambda t: t.tensor_id):
        if t.tensor_id <= prev:
            raise KernelError(f"tensor id {t.tensor_id} appears twice")
        out += varint(t.tensor_id - prev - 1)
        prev = t.tensor_id
        out.append(int(t.value_coding) << 4 | int(t.index_coding))
        out += varint(t.k)
        if _has_index_len(t.index_coding, t.k, t.chunk_numel):
            out += varint(len(t.index_section))
        if t.value_coding.has_scale:
            out += varint(zigzag(t.values.scale_base) << 4 | t.values.scale_width)
        out += t.index_section + t.values.scales + t.values.values
    return bytes(out)


def _check_layouts(layouts: Sequence[tuple[int, int]], limits: Limits) -> None:
    if len(layouts) > limits.max_tensors:
        raise KernelError(f"{len(layouts)} tensors in the layout > limit {limits.max_tensors}")
    cap = min(limits.max_chunk_numel, MAX_CHUNK_NUMEL)
    for i, (n, cn) in enumerate(layouts):
        if not (1 <= n <= limits.max_chunks_per_tensor and 1 <= cn <= cap):
            raise KernelError(f"layout {i}: n_chunks={n}, chunk_numel={cn} outside the limits")


def _read_coding(r: ByteReader, tid: int) -> tuple[ValueCoding, IndexCoding]:
    byte = r.u8("codings")
    vc, ic = byte >> 4, byte & 15
    if vc not in ValueCoding._value2member_map_ or ic not in IndexCoding._value2member_map_:
        raise Rejected(RejectCode.MALFORMED, f"tensor {tid}: unknown coding (value {vc}, index {ic})")
    return ValueCoding(vc), IndexCoding(ic)


def _read_tensor(
    r: ByteReader,
    tid: int,
    layout: tuple[int, int],
    limits: Limits,
    budget: int,
) -> DecodedTensor:
    """One tensor's fields and sections; ``budget`` is how many coefficients may still come."""
    n, cn = layout
    vc, ic = _read_coding(r, tid)
    k = r.varint("k")
    if k == 0:
        raise Rejected(RejectCode.MALFORMED, f"tensor {tid}: k = 0")
    if k > cn or k > limits.max_k:
        raise Rejected(RejectCode.LIMIT_EXCEEDED, f"tensor {tid}: k={k} > chunk {cn} or max_k {limits.max_k}")
    if n * k > budget:
        raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {limits.max_total_coefficients} coefficients")
    if _has_index_len(ic, k, cn):
        index_len = r.varint("index length")
        if index_len > max_index_section_len(ic, n * k, cn):
            raise Rejected(RejectCode.TOO_LARGE, f"tensor {tid}: index section of {index_len} bytes")
    else:
        index_len = 0 if k == cn else (n * k * fixed_width(cn) + 7) // 8
    base, width = 0, 0
    if vc.has_scale:
        word = r.varint("scale word")
        width, zz = word & 15, word >> 4
        base = (zz >> 1) ^ -(zz & 1)
        if width > MAX_SCALE_WIDTH:
            raise Rejected(RejectCode.MALFORMED, f"tensor {tid}: scale width {width}")
    section = r.take(index_len, "index section")
    scales = r.take((n * width + 7) // 8, "scale section")
    values = r.take(value_section_len(vc, n * k), "value section")
    idx, order = decode_indices(section, ic, n, k, cn)
    val = dequantise(CodedValues(values, base, width, scales), vc, n, k)
    return DecodedTensor(tid, idx, val if order is None else np.take_along_axis(val, order, axis=1))


def decode_payload(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits = DEFAULT_LIMITS
) -> list[DecodedTensor]:
    """Decode a payload against ``layouts[tensor_id] = (n_chunks, chunk_numel)``.

    Returns the tensors in ascending id order. Raises Rejected with TOO_LARGE, TRUNCATED,
    MALFORMED, UNSUPPORTED_VERSION, LIMIT_EXCEEDED, LAYOUT_MISMATCH, INDEX_OUT_OF_RANGE,
    DUPLICATE_INDEX or NON_FINITE_VALUE; KernelError if ``layouts`` itself is out of limits.
    Cost O(len(data) + sum of n_chunks * k).
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
    out: list[DecodedTensor] = []
    tid, total = -1, 0
    for _ in range(count):
        tid += r.varint("tensor id") + 1
        if tid >= len(layouts):
            raise Rejected(RejectCode.LAYOUT_MISMATCH, f"tensor id {tid} not in a layout of {len(layouts)}")
        t = _read_tensor(r, tid, layouts[tid], limits, limits.max_total_coefficients - total)
        total += t.idx.size
        out.append(t)
    if r.remaining:
        raise Rejected(RejectCode.MALFORMED, f"{r.remaining} trailing bytes after the last tensor")
    return out
