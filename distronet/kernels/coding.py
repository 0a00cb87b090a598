"""Coding of per-chunk top-k DCT coefficients into wire bytes, and back (pure numpy).

The public entry of the codec: ``encode_tensor`` turns one tensor's ``(idx, val)`` into an
``EncodedTensor`` (and returns the values exactly as a receiver will rebuild them, for error
feedback); ``encode_payload`` frames any subset of a run's tensors; ``decode_payload`` checks
and decodes a peer's payload, raising ``Rejected`` with a code for anything malformed.
The wire format is specified byte for byte in docs/protocol-payload.md.
"""

from __future__ import annotations

import numpy as np

from distronet.kernels.coding_fast import decode_payload, decode_payload_flat
from distronet.kernels.coding_flat import FlatPayload
from distronet.kernels.coding_index import MAX_CHUNK_NUMEL, IndexCoding, encode_indices
from distronet.kernels.coding_payload import (
    PAYLOAD_VERSION,
    DecodedTensor,
    EncodedTensor,
    decode_payload_reference,
    encode_payload,
)
from distronet.kernels.coding_values import ValueCoding, quantise
from distronet.protocol.errors import KernelError

__all__ = [
    "PAYLOAD_VERSION",
    "DecodedTensor",
    "EncodedTensor",
    "FlatPayload",
    "IndexCoding",
    "ValueCoding",
    "decode_payload",
    "decode_payload_flat",
    "decode_payload_reference",
    "encode_payload",
    "encode_tensor",
]


def _canonical(idx: np.ndarray, val: np.ndarray, chunk_numel: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Check idx/val and return (idx sorted per chunk, the sorting order or None when already sorted)."""
    if idx.ndim != 2 or val.shape != idx.shape:
        raise KernelError(f"idx {idx.shape} and val {val.shape} must both be (n_chunks, k)")
    n, k = idx.shape
    if not 1 <= chunk_numel <= MAX_CHUNK_NUMEL:
        raise KernelError(f"chunk_numel {chunk_numel} outside 1..{MAX_CHUNK_NUMEL}")
    if n < 1 or not 1 <= k <= chunk_numel:
        raise KernelError(f"need n_chunks >= 1 and 1 <= k <= chunk_numel, got ({n}, {k}) for {chunk_numel}")
    if int(idx.min()) < 0 or int(idx.max()) >= chunk_numel:
        raise KernelError(f"indices must lie in [0, {chunk_numel})")
    order = None
    if (np.diff(idx, axis=1) <= 0).any():
        order = np.argsort(idx, axis=1, kind="stable")
        idx = np.take_along_axis(idx, order, axis=1)
        if (np.diff(idx, axis=1) == 0).any():
            raise KernelError("an index repeats within a chunk")
    return idx, order


def encode_tensor(
    tensor_id: int,
    idx: np.ndarray,
    val: np.ndarray,
    chunk_numel: int,
    value_coding: ValueCoding,
    index_coding: IndexCoding,
) -> tuple[EncodedTensor, np.ndarray]:
    """Code one tensor's top-k: ``idx`` int (n_chunks, k) unique per chunk, ``val`` float32 (n_chunks, k).

    Returns (coded tensor, dequantised float32 (n_chunks, k) in ``idx``'s order): exactly the
    values ``decode_payload`` will return at those indices. Raises KernelError on bad shapes,
    out-of-range or repeated indices, and NaN/Inf values. Cost O(n_chunks * k * log k).
    """
    if tensor_id < 0:
        raise KernelError(f"tensor id {tensor_id} < 0")
    idx = np.asarray(idx, dtype=np.int64)
    val = np.asarray(val, dtype=np.float32)
    sidx, order = _canonical(idx, val, chunk_numel)
    sval = val if order is None else np.take_along_axis(val, order, axis=1)
    code, wire = encode_indices(sidx, chunk_numel, index_coding)
    if wire is None:
        coded, deq_sorted = quantise(sval, value_coding)
    else:
        coded, deq_wire = quantise(np.take_along_axis(sval, wire, axis=1), value_coding)
        deq_sorted = np.empty_like(deq_wire)
        np.put_along_axis(deq_sorted, wire, deq_wire, axis=1)
    if order is None:
        deq = deq_sorted
    else:
        deq = np.empty_like(deq_sorted)
        np.put_along_axis(deq, order, deq_sorted, axis=1)
    n, k = sidx.shape
    enc = EncodedTensor(tensor_id, value_coding, index_coding, n, k, chunk_numel, code, coded)
    return enc, deq
