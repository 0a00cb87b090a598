"""The one reader of a payload's header and tensor table (docs/protocol-payload.md §2 steps 1-3).

Both decoders start here, so their first rejections are the same: :func:`read_header` checks the
caller's layouts, the size, the version, the tensor count and the class table;
:func:`read_table` reads the tensor ids and classes from the bit stream and checks every
tensor's ``k`` and the coefficient total against the layouts and ``Limits`` before anything of
that size is allocated (every coefficient's value takes at least one bit, so a payload cannot
declare more coefficients than it has bits).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import BitReader, ByteReader
from distronet.kernels.coding_index import MAX_CHUNK_NUMEL, IndexCoding
from distronet.kernels.coding_payload import MAX_CLASSES, PAYLOAD_VERSION
from distronet.kernels.coding_values import ValueCoding
from distronet.protocol.errors import KernelError, RejectCode, Rejected
from distronet.protocol.limits import Limits

__all__ = ["VALUE_BITS", "VALUE_BYTES", "Class", "Table", "read_header", "read_table"]

#: Byte-stream bytes per value, indexed by ValueCoding (SIGN1's bits travel in the bit stream).
VALUE_BYTES = np.array([0, 4, 2, 2, 1, 0], dtype=np.int64)
#: Wire bits per value, indexed by ValueCoding.
VALUE_BITS = np.array([0, 32, 16, 16, 8, 1], dtype=np.int64)

Class = tuple[ValueCoding, IndexCoding, int]
"""One entry of the class table: (value coding, index coding, k; 0 for a dense tensor)."""


@dataclass(frozen=True)
class Table:
    """The tensor table, one int64 entry per tensor in id order: ``ids``, ``n`` (chunks), ``cn``
    (chunk size), ``k`` (dense: ``cn``), ``vc`` / ``ic`` (the codings as plain ints)."""

    ids: np.ndarray
    n: np.ndarray
    cn: np.ndarray
    k: np.ndarray
    vc: np.ndarray
    ic: np.ndarray


def _check_layouts(layouts: Sequence[tuple[int, int]], limits: Limits) -> None:
    if len(layouts) > limits.max_tensors:
        raise KernelError(f"{len(layouts)} tensors in the layout > limit {limits.max_tensors}")
    cap = min(limits.max_chunk_numel, MAX_CHUNK_NUMEL)
    for i, (n, cn) in enumerate(layouts):
        if not (1 <= n <= limits.max_chunks_per_tensor and 1 <= cn <= cap):
            raise KernelError(f"layout {i}: n_chunks={n}, chunk_numel={cn} outside the limits")


def _read_classes(r: ByteReader, limits: Limits) -> list[Class]:
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


def read_header(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits
) -> tuple[int, list[Class], bytes]:
    """Checks up to the class table: (tensor count, classes, the bytes after the table).

    Raises KernelError for out-of-limit ``layouts``; Rejected (TOO_LARGE, UNSUPPORTED_VERSION,
    LIMIT_EXCEEDED, MALFORMED, TRUNCATED). Cost O(len(layouts) + classes).
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


@functools.lru_cache(maxsize=16)
def _layout_array(layouts: tuple[tuple[int, int], ...]) -> np.ndarray:
    return np.array(layouts, dtype=np.int64).reshape(-1, 2)


def read_table(
    br: BitReader, count: int, classes: list[Class], layouts: Sequence[tuple[int, int]], limits: Limits
) -> Table:
    """Tensor ids (unary deltas) and classes at ``br``'s position; leaves ``br`` after them.

    Checks ids against the layouts, each ``k <= chunk_numel`` and ``<= max_k``, the coefficient
    total against ``max_total_coefficients`` and against the stream's bits, tensor by tensor in
    id order (the first failing tensor names the rejection). Raises Rejected (MALFORMED,
    LAYOUT_MISMATCH, LIMIT_EXCEEDED, TRUNCATED). Cost O(count) in whole-array passes.
    """
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
    if not count:
        z = np.zeros(0, dtype=np.int64)
        return Table(z, z, z, z, z, z)
    lay = _layout_array(tuple(layouts))
    cvc, cic, ck = (np.array([c[i] for c in classes], dtype=np.int64) for i in range(3))
    n, cn = lay[ids, 0], lay[ids, 1]
    vc, ic, k = cvc[cls], cic[cls], ck[cls]
    k = np.where(k == 0, cn, k)
    nk = n * k
    total = np.cumsum(nk)
    bad_k = (k > cn) | (k > limits.max_k)
    bad_total = total > limits.max_total_coefficients
    bad_bits = np.cumsum(nk * VALUE_BITS[vc]) > br.nbits
    bad = bad_k | bad_total | bad_bits
    if bool(bad.any()):
        i = int(np.argmax(bad))
        if bad_k[i]:
            raise Rejected(
                RejectCode.LIMIT_EXCEEDED,
                f"tensor {int(ids[i])}: k={int(k[i])} > chunk {int(cn[i])} or max_k {limits.max_k}",
            )
        if bad_total[i]:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {limits.max_total_coefficients} coefficients")
        raise Rejected(
            RejectCode.TRUNCATED, f"{int(total[i])} coefficients declared in {br.nbits // 8} bytes"
        )
    return Table(ids, n, cn, k, vc, ic)
