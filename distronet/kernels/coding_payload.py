"""The coded payload: every tensor's indices, scales and values in one byte string.

Layout (byte-exact definition in docs/protocol-payload.md)::

    u8 version (=1) | varint tensor count | varint class count m | m x (u8 codings, varint k)
    bit stream: tensor id deltas (unary) | class of each tensor | bucket-code parameters |
                index codes | scale codes (deltas) | sign bits | zero padding
    byte values (fp32 / fp16 / bf16 / int8 tensors, little-endian)

Per-tensor framing is a few bits, not bytes: a 0.9M-parameter model's 53 tensors cost ~10
bytes of header in total. This module holds the payload's types and its one encoder
(:func:`encode_payload`); the header and tensor table are read by :mod:`coding_table`, the
rest by one of the two decoders behind :func:`distronet.kernels.coding.decode_payload`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bits import append_flags, pack_bits, unary_fields, varint
from distronet.kernels.coding_bucket import Part, choose_params, class_parts
from distronet.kernels.coding_index import ClassParams, IndexCode, IndexCoding, fixed_width, index_parts
from distronet.kernels.coding_values import SCALE_BMAX, ZERO_SCALE, CodedValues, ValueCoding
from distronet.protocol.errors import KernelError

__all__ = [
    "MAX_CLASSES",
    "PAYLOAD_VERSION",
    "DecodedTensor",
    "EncodedTensor",
    "FlatPayload",
    "encode_payload",
    "frame_head",
]

PAYLOAD_VERSION = 1
MAX_CLASSES = 15


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


@dataclass(frozen=True)
class FlatPayload:
    """A decoded payload, all tensors concatenated (tensor-major, chunk-major, ``k`` per chunk).

    ``tensor_ids``, ``n``, ``k``, ``cn`` int64 ``(T,)``, ids ascending; tensor ``j`` owns
    ``idx``/``val`` entries ``offsets[j]:offsets[j+1]``, i.e. ``(n[j], k[j])`` arrays flattened.
    ``idx`` int64 ascending and unique within each chunk, in ``[0, cn)``; ``val`` finite float32.
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
        """Per tensor views ``(tensor_id, idx (n, k), val (n, k))``, ascending id (no copy)."""
        out = []
        for j, (tid, n, k) in enumerate(
            zip(self.tensor_ids.tolist(), self.n.tolist(), self.k.tolist(), strict=True)
        ):
            a, b = int(self.offsets[j]), int(self.offsets[j + 1])
            out.append(DecodedTensor(tid, self.idx[a:b].reshape(n, k), self.val[a:b].reshape(n, k)))
        return out


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
    return _scale_parts_of(np.concatenate(codes)) if codes else []


def _scale_parts_of(codes: np.ndarray) -> list[Part]:
    """The scale codes' parameters, then their fields, escapes and mantissas (all tensors' codes,
    concatenated in tensor-id order)."""
    sym = _scale_symbols(codes)
    b0, w = choose_params(sym, SCALE_BMAX)
    return [(np.array([b0, w]), np.array([4, 3])), *class_parts(sym, b0, w, SCALE_BMAX)]


def frame_head(ids: Sequence[int], keys: Sequence[tuple[int, int]]) -> tuple[bytearray, list[Part]]:
    """The payload's head (version, tensor count, the (codings, k) classes) and its first parts
    (tensor-id gaps, each tensor's class) for tensors ``ids`` (ascending, unique) with class
    ``keys`` (codings byte, k; 0 for dense). Raises KernelError past ``MAX_CLASSES`` classes."""
    classes = list(dict.fromkeys(keys))
    if len(classes) > MAX_CLASSES:
        raise KernelError(f"{len(classes)} (codings, k) classes in one payload > {MAX_CLASSES}")
    head = bytearray([PAYLOAD_VERSION]) + varint(len(ids)) + varint(len(classes))
    for codings, k in classes:
        head += bytes([codings]) + varint(k)
    id_arr = np.array(ids, dtype=np.int64)
    parts: list[Part] = [unary_fields(np.diff(id_arr, prepend=-1) - 1)]
    cw = (len(classes) - 1).bit_length()
    parts.append((np.array([classes.index(key) for key in keys], dtype=np.int64), np.full(len(ids), cw)))
    return head, parts


def encode_payload(tensors: Sequence[EncodedTensor]) -> bytes:
    """Frame coded tensors (any order, unique ids; each keeps its own codings and k).

    Raises KernelError on a repeated tensor id or more than 15 (codings, k) classes.
    Cost O(total coefficients).
    """
    ts = sorted(tensors, key=lambda t: t.tensor_id)
    if any(a.tensor_id == b.tensor_id for a, b in itertools.pairwise(ts)):
        raise KernelError("a tensor id appears twice")
    keys = [(int(t.value_coding) << 4 | int(t.index_coding), 0 if t.k == t.chunk_numel else t.k) for t in ts]
    head, parts = frame_head([t.tensor_id for t in ts], keys)
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
