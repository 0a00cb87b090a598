"""The payload codec's public face: encode one tensor, frame a payload, decode a peer's payload.

``encode_tensor`` turns one tensor's ``(idx, val)`` into an ``EncodedTensor`` (and returns the
values exactly as a receiver will rebuild them, for error feedback); ``encode_payload`` frames
any subset of a run's tensors; ``decode_payload`` checks and decodes a peer's payload, raising
``Rejected`` with a code for anything malformed. The wire format is specified byte for byte in
docs/protocol-payload.md.

Behind ``decode_payload`` are exactly two implementations, held equal by the differential tests
and fuzzing: the reference (:mod:`coding_reference`, plain numpy; the oracle, and the path until
the compiled walk is warm) and the compiled walk (:mod:`coding_fast`, numba), which hands
anything it does not accept to the reference, so every rejection has the reference's code and
message. :func:`warm` compiles the walk (or loads numba's cache of it) and switches to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distronet.kernels.coding_fast import decode_compiled, jit_cache_dir, jit_stamp
from distronet.kernels.coding_index import MAX_CHUNK_NUMEL, IndexCoding, encode_indices
from distronet.kernels.coding_payload import (
    PAYLOAD_VERSION,
    DecodedTensor,
    EncodedTensor,
    FlatPayload,
    encode_payload,
)
from distronet.kernels.coding_reference import decode_reference
from distronet.kernels.coding_values import ValueCoding, quantise
from distronet.kernels.jit_state import HAVE_JIT, mark_warm, use_jit
from distronet.protocol.errors import KernelError
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "HAVE_JIT",
    "PAYLOAD_VERSION",
    "DecodedTensor",
    "EncodedTensor",
    "FlatPayload",
    "IndexCoding",
    "ValueCoding",
    "decode_payload",
    "encode_payload",
    "encode_tensor",
    "jit_cache_dir",
    "jit_stamp",
    "mark_warm",
    "use_jit",
    "warm",
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


def decode_payload(
    data: bytes, layouts: Sequence[tuple[int, int]], limits: Limits = DEFAULT_LIMITS
) -> FlatPayload:
    """Decode a payload against ``layouts[tensor_id] = (n_chunks, chunk_numel)``, all tensors flat
    (``.tensors()`` gives them one by one, ascending id).

    Raises Rejected (TOO_LARGE, TRUNCATED, MALFORMED, UNSUPPORTED_VERSION, LIMIT_EXCEEDED,
    LAYOUT_MISMATCH, INDEX_OUT_OF_RANGE, DUPLICATE_INDEX, NON_FINITE_VALUE); KernelError if
    ``layouts`` itself is out of limits. Cost: warm, one compiled pass over the bit stream plus a
    few array copies (a payload structure not seen recently adds ~0.1-0.3 ms); otherwise, or
    for a payload the compiled walk refuses, the reference's O(len(data) + sum of n * k) with a
    dozen array operations per tensor.
    """
    if use_jit():
        flat = decode_compiled(data, layouts, limits)
        if flat is not None:
            return flat
    return decode_reference(data, layouts, limits)


def warm() -> bool:
    """Compile the walk and the decode's loops (:mod:`decode_jit`) now, or load them from numba's
    on-disk cache, and use them from now on (:func:`mark_warm`).

    Returns whether the compiled path is available. Writes no file of ours (numba fills its own
    cache); a caller that wants later processes to trust that cache keeps :func:`jit_stamp`.
    Cost: ~10 s (up to ~40 s on a loaded 2-core machine) the first time in a checkout, ~1 s when
    cached; nothing without numba. Call it at start-up, off the packet path.
    """
    if not HAVE_JIT:
        return False
    from distronet.kernels.dct import basis_numpy
    from distronet.kernels.decode_jit import spread_flat, spread_part

    idx = np.array([[0, 1, 9, 17]], dtype=np.int64)
    val = np.array([[1.0, -2.0, 0.5, 3.0]], dtype=np.float32)
    data = encode_payload([encode_tensor(0, idx, val, 64, ValueCoding.SIGN1, IndexCoding.ENTROPY)[0]])
    flat = decode_compiled(data, [(1, 64)], DEFAULT_LIMITS)
    if flat is None:  # pragma: no cover - the walk refusing a payload of our own is a bug
        raise KernelError("the compiled walk refused the warm-up payload")
    zero, one, sixty_four = (np.full(1, n, dtype=np.int64) for n in (0, 1, 64))
    table = np.arange(64, dtype=np.int64)
    basis = basis_numpy(64).astype(np.float32).reshape(-1)
    out = np.zeros(64, dtype=np.float32)
    items = np.array([[0, 0, 1]], dtype=np.int64)  # tensor 0, block row 0
    ints = (zero, sixty_four, one, sixty_four, zero)  # its region, row size, chunks, width, basis
    for local_at in (zero - 1, zero):  # chunk order and spatial order (decode.decode_flat)
        spread_flat(
            out, np.empty(64, np.float32), items, *ints, basis, zero, zero, table, local_at,
            flat.k.reshape(1, 1), flat.offsets[:1].reshape(1, 1), flat.idx, flat.val,
        )  # fmt: skip
    spread_part(out, flat.idx.reshape(1, -1), flat.val.reshape(1, -1), zero, table, 64, basis)  # decode_sum
    from distronet.kernels.coding_jit_sum import pack  # coding_bits.pack_bits

    pack(np.array([5, 1], dtype=np.int64), np.array([3, 40], dtype=np.int64), np.empty(6, np.uint8))
    from distronet.kernels.coding_bucket import _tables
    from distronet.kernels.coding_jit_index import plan  # coding_batch_plan._entropy (ENTROPY indices)

    two = np.array([[0, 3], [1, 2], [0, 5]], dtype=np.int64)
    ranks = np.stack([table, table])
    flags, order = np.empty(1, np.bool_), np.empty_like(two)
    plan(
        two,
        np.array([0, 3]),
        ranks,
        6,
        512,
        *_tables(6),
        np.empty(1, np.int64),
        flags,
        np.empty_like(two),
        order,
    )
    from distronet.kernels.coding_jit_index import streams  # coding_batch._fields_compiled

    place = np.arange(7, dtype=np.int64)
    fields = np.empty(3 * two.size + 1, dtype=np.int64)
    streams(
        two,
        two,
        np.array([0, 3]),
        np.zeros(1, np.int64),
        6,
        1,
        2,
        place,
        1,
        7,
        place,
        fields,
        fields.copy(),
        np.empty(2, np.int64),
    )
    from distronet.kernels.coding_jit_index import class_stats, shifted_sum  # coding_batch._choose_compiled

    rows = np.array([0], dtype=np.int64), np.array([3], dtype=np.int64)
    class_stats(two, *rows, True, np.zeros(7, np.int64))
    shifted_sum(two, *rows, False, 1)
    from distronet.kernels.coding_jit_index import put_rows, take_rows  # coding_batch wire orders

    vals, perm = np.zeros(two.shape, dtype=np.float32), np.tile(np.array([1, 0], dtype=np.int64), (3, 1))
    take_rows(vals, perm, vals.copy())
    put_rows(vals, perm, vals.copy())
    from distronet.kernels.coding_jit_sum import feed_back  # packets.feed_back_all

    feed_back(out, np.zeros((1, 2), np.int64), np.zeros((1, 2), np.float32), 8, 8, 8, -1.0)
    from distronet.kernels.topk_jit import select  # the compiled top-k (topk._select_compiled)

    y = np.arange(64, dtype=np.float32)
    select(
        y.view(np.uint32),
        y,
        0x7F800000,
        1,
        1,
        1,
        1,
        64,
        4,
        16,
        0,
        1,
        np.empty((1, 4), np.int64),
        np.empty((1, 4), np.float32),
    )
    from distronet.kernels.topk_jit import B, dct_select, factors  # topk.dct_select_compiled

    dct_select(
        np.ones((1, B, B), np.float32),
        1,
        1,
        *factors(),
        4,
        16,
        0,
        1,
        0,
        np.empty((1, 4), np.int64),
        np.empty((1, 4), np.float32),
    )
    mark_warm()
    return True
