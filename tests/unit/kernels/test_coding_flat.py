"""The whole-payload decoder (coding_flat) against the reference decoder: same accepts, same bits."""

from __future__ import annotations

import numpy as np
import pytest

from distronet.kernels import coding_flat, coding_locate
from distronet.kernels.coding import (
    EncodedTensor,
    IndexCoding,
    ValueCoding,
    decode_payload,
    decode_payload_flat,
    decode_payload_reference,
    encode_payload,
    encode_tensor,
)
from distronet.kernels.coding_payload import read_header
from distronet.protocol.errors import Rejected
from distronet.protocol.limits import DEFAULT_LIMITS

CHUNKS = [1, 7, 9, 49, 64, 256, 4096]


def _payload(rng: np.random.Generator) -> tuple[bytes, list[tuple[int, int]]]:
    layouts = [(int(rng.integers(1, 9)), int(rng.choice(CHUNKS))) for _ in range(int(rng.integers(1, 12)))]
    coded: list[EncodedTensor] = []
    for tid, (n, cn) in enumerate(layouts):
        if rng.random() < 0.3:
            continue
        k = min(cn, int(rng.choice([1, 2, 4, 32, cn])))
        weight = (1.0 + np.arange(cn)) if rng.random() < 0.5 else np.ones(cn)  # low-frequency or uniform
        idx = np.sort(np.argsort(rng.random((n, cn)) * weight, axis=1)[:, :k], axis=1).astype(np.int64)
        val = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-6, 1, (n, 1))).astype(np.float32)
        if rng.random() < 0.05:
            val[:] = 0
        vc, ic = ValueCoding(int(rng.integers(1, 6))), IndexCoding(int(rng.integers(1, 3)))
        coded.append(encode_tensor(tid, idx, val, cn, vc, ic)[0])
    if len({(t.value_coding, t.index_coding, t.k) for t in coded}) > 15:
        coded = coded[:10]
    return encode_payload(coded), layouts


def _fast_only(data: bytes, layouts: list[tuple[int, int]]) -> coding_flat.FlatPayload:
    """The fast path itself, no fallback to the reference."""
    return coding_flat._fast(layouts, DEFAULT_LIMITS, *read_header(data, layouts, DEFAULT_LIMITS))


def _same(a: list, b: list) -> bool:  # type: ignore[type-arg]
    return len(a) == len(b) and all(
        x.tensor_id == y.tensor_id and np.array_equal(x.idx, y.idx) and x.val.tobytes() == y.val.tobytes()
        for x, y in zip(a, b, strict=True)
    )


def _mutate(rng: np.random.Generator, data: bytes) -> bytes:
    d = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 3))
        if op == 0 and d:
            d[int(rng.integers(0, len(d)))] ^= 1 << int(rng.integers(0, 8))
        elif op == 1 and len(d) > 1:
            del d[int(rng.integers(0, len(d))) :]
        else:
            d.insert(int(rng.integers(0, len(d) + 1)), int(rng.integers(0, 256)))
    return bytes(d)


@pytest.mark.parametrize("table_bits", [0, coding_locate.TABLE_BITS_PER_TENSOR, 1 << 40])
def test_fast_path_equals_reference_on_valid_and_mutated_payloads(
    table_bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both ways of locating bodies (direct, tables) accept exactly what the reference accepts."""
    monkeypatch.setattr(coding_locate, "TABLE_BITS_PER_TENSOR", table_bits)
    rng = np.random.default_rng(table_bits % 1000)
    for _ in range(30):
        data, layouts = _payload(rng)
        want = decode_payload_reference(data, layouts)
        got = _fast_only(data, layouts)
        assert _same(got.tensors(), want)
        for _ in range(8):
            bad = _mutate(rng, data)
            try:
                ref: list | None = decode_payload_reference(bad, layouts)  # type: ignore[type-arg]
                code = None
            except Rejected as e:
                ref, code = None, e.code
            try:
                fast: list | None = _fast_only(bad, layouts).tensors()  # type: ignore[type-arg]
            except Exception:
                fast = None
            if ref is None:
                assert fast is None, f"fast path accepted a payload the reference rejects ({code})"
                with pytest.raises(Rejected) as info:
                    decode_payload(bad, layouts)
                assert info.value.code == code  # the public decoder reports the reference's code
            else:
                assert fast is None or _same(fast, ref)
                assert _same(decode_payload(bad, layouts), ref)


def test_flat_layout_and_views() -> None:
    rng = np.random.default_rng(7)
    idx = np.sort(np.argsort(rng.random((3, 64)), axis=1)[:, :4], axis=1).astype(np.int64)
    val = rng.standard_normal((3, 4)).astype(np.float32)
    a, deq_a = encode_tensor(0, idx, val, 64, ValueCoding.SIGN1, IndexCoding.ENTROPY)
    b, deq_b = encode_tensor(2, idx[:2], val[:2], 64, ValueCoding.FP32, IndexCoding.FIXED)
    flat = decode_payload_flat(encode_payload([b, a]), [(3, 64), (5, 16), (2, 64)])
    assert flat.tensor_ids.tolist() == [0, 2] and flat.k.tolist() == [4, 4] and flat.n.tolist() == [3, 2]
    assert (
        flat.offsets.tolist() == [0, 12, 20] and flat.idx.dtype == np.int64 and flat.val.dtype == np.float32
    )
    np.testing.assert_array_equal(flat.idx, np.concatenate([idx.ravel(), idx[:2].ravel()]))
    assert flat.val.tobytes() == np.concatenate([deq_a.ravel(), deq_b.ravel()]).tobytes()
    t0, t2 = flat.tensors()
    assert t0.idx.shape == (3, 4) and t2.val.shape == (2, 4)
    empty = decode_payload_flat(encode_payload([]), [(1, 4)])
    assert empty.idx.size == 0 and empty.tensors() == []
