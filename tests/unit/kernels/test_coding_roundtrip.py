"""Round trips of the payload codec: every value coding x index coding x k, bit-exact values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.kernels.coding import (
    IndexCoding,
    ValueCoding,
    decode_payload,
    encode_payload,
    encode_tensor,
)
from distronet.kernels.coding_index import fixed_width
from distronet.protocol.errors import KernelError


def _topk(rng: np.random.Generator, n: int, cn: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.sort(np.argsort(rng.random((n, cn)), axis=1)[:, :k], axis=1)
    val = (rng.standard_normal((n, k)) * 10.0 ** rng.uniform(-6, 1, (n, 1))).astype(np.float32)
    return idx.astype(np.int64), val


CASES = [(4096, 1), (4096, 4), (4096, 32), (4096, 4096), (64, 1), (64, 4), (64, 64), (1, 1), (7, 3), (49, 5)]


@pytest.mark.parametrize("vc", list(ValueCoding))
@pytest.mark.parametrize("ic", list(IndexCoding))
@pytest.mark.parametrize(("cn", "k"), CASES)
@pytest.mark.parametrize("n", [1, 6])
def test_round_trip_bit_exact(vc: ValueCoding, ic: IndexCoding, cn: int, k: int, n: int) -> None:
    rng = np.random.default_rng(cn * 1000 + k + n)
    idx, val = _topk(rng, n, cn, k)
    enc, deq = encode_tensor(2, idx, val, cn, vc, ic)
    data = encode_payload([enc])
    (dec,) = decode_payload(data, [(9, 16), (1, 1), (n, cn)]).tensors()
    assert dec.tensor_id == 2
    np.testing.assert_array_equal(dec.idx, idx)
    assert dec.val.dtype == np.float32 and dec.val.tobytes() == deq.tobytes()


def test_dequantised_values_are_close() -> None:
    rng = np.random.default_rng(1)
    idx, val = _topk(rng, 50, 4096, 32)
    for vc, rtol in [(ValueCoding.FP32, 0), (ValueCoding.FP16, 1e-3), (ValueCoding.BF16, 8e-3)]:
        _, deq = encode_tensor(0, idx, val, 4096, vc, IndexCoding.FIXED)
        np.testing.assert_allclose(deq, val, rtol=rtol, atol=1e-7 if vc == ValueCoding.FP16 else 0)
    _, deq = encode_tensor(0, idx, val, 4096, ValueCoding.INT8, IndexCoding.FIXED)
    err = np.abs(deq - val).max(axis=1) / np.abs(val).max(axis=1)
    assert (err < 0.5 / 127 * 1.1 + 1e-6).all()
    _, deq = encode_tensor(0, idx, val, 4096, ValueCoding.SIGN1, IndexCoding.FIXED)
    assert (np.sign(deq) == np.where(val < 0, -1, 1)).all()
    scale = np.abs(deq)[:, 0]  # k >= 16: 1/8-octave steps, within 2**(1/16) of the mean magnitude
    np.testing.assert_allclose(scale, np.abs(val).mean(axis=1), rtol=0.045)
    _, deq4 = encode_tensor(0, idx[:, :4], val[:, :4], 4096, ValueCoding.SIGN1, IndexCoding.FIXED)
    ratio = np.abs(deq4)[:, 0] / np.abs(val[:, :4]).mean(axis=1)  # k < 16: half octaves
    assert (ratio > 2**-0.26).all() and (ratio < 2**0.26).all() and np.ptp(np.log2(ratio)) > 0.3


def test_unsorted_input_keeps_caller_order() -> None:
    rng = np.random.default_rng(2)
    idx, val = _topk(rng, 4, 4096, 8)
    perm = rng.permuted(np.tile(np.arange(8), (4, 1)), axis=1)
    uidx, uval = np.take_along_axis(idx, perm, 1), np.take_along_axis(val, perm, 1)
    enc, deq = encode_tensor(0, uidx, uval, 4096, ValueCoding.FP16, IndexCoding.ENTROPY)
    (dec,) = decode_payload(encode_payload([enc]), [(4, 4096)]).tensors()
    np.testing.assert_array_equal(dec.idx, idx)
    np.testing.assert_array_equal(np.take_along_axis(dec.val, perm, 1), deq)


def test_many_tensors_any_subset_order_and_codings() -> None:
    rng = np.random.default_rng(3)
    layouts = [(3, 4096), (2, 64), (5, 4096), (1, 64)]
    encs, want = [], {}
    codings = {3: (ValueCoding.FP32, IndexCoding.FIXED), 0: (ValueCoding.SIGN1, IndexCoding.ENTROPY)}
    for tid in (3, 0, 2):
        n, cn = layouts[tid]
        k = [4, 0, 32, 64][tid]
        idx, val = _topk(rng, n, cn, k)
        vc, ic = codings.get(tid, (ValueCoding.INT8, IndexCoding.ENTROPY))
        enc, deq = encode_tensor(tid, idx, val, cn, vc, ic)
        encs.append(enc)
        want[tid] = (idx, deq)
    out = decode_payload(encode_payload(encs), layouts).tensors()
    assert [t.tensor_id for t in out] == [0, 2, 3]
    for t in out:
        np.testing.assert_array_equal(t.idx, want[t.tensor_id][0])
        np.testing.assert_array_equal(t.val, want[t.tensor_id][1])
    assert decode_payload(encode_payload([]), layouts).tensors() == []


def _size(idx: np.ndarray, cn: int, ic: IndexCoding) -> int:
    """Payload bytes of one FP32 tensor (values: 4 bytes each) minus its values."""
    val = np.ones(idx.shape, np.float32)
    return len(encode_payload([encode_tensor(0, idx, val, cn, ValueCoding.FP32, ic)[0]])) - 4 * idx.size


def test_fixed_width_is_minimal() -> None:
    assert [fixed_width(c) for c in (1, 2, 3, 4, 5, 64, 65, 4096, 4097)] == [0, 1, 2, 2, 3, 6, 7, 12, 13]
    rng = np.random.default_rng(4)
    idx, _ = _topk(rng, 10, 4096, 4)
    # header: version, count, one class (codings, k); then id bit + 480 index bits -> 61 bytes
    assert _size(idx, 4096, IndexCoding.FIXED) == 5 + (1 + 10 * 4 * 12 + 7) // 8
    assert _size(np.tile(np.arange(64), (2, 1)), 64, IndexCoding.ENTROPY) == 5 + 1  # dense: no index bits


def test_entropy_beats_fixed_on_low_frequency_indices() -> None:
    rng = np.random.default_rng(5)
    n, s, k = 64, 64, 32
    # energy decaying with frequency radius, like DCT coefficients of smooth momentum
    u, v = np.divmod(np.arange(s * s), s)
    energy = 1.0 / (1.0 + u + v) ** 1.5
    coef = rng.standard_normal((n, s * s)) * energy
    idx = np.sort(np.argsort(-np.abs(coef), axis=1)[:, :k], axis=1)
    assert _size(idx, s * s, IndexCoding.ENTROPY) < 0.75 * _size(idx, s * s, IndexCoding.FIXED)
    # and about as small as fixed width (one rank-map field and parameters more) on uniform indices
    uidx, _ = _topk(rng, n, s * s, k)
    assert _size(uidx, s * s, IndexCoding.ENTROPY) <= _size(uidx, s * s, IndexCoding.FIXED) + 2


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_encode_rejects_non_finite(bad: float) -> None:
    val = np.ones((2, 4), np.float32)
    val[1, 2] = bad
    with pytest.raises(KernelError):
        encode_tensor(0, np.tile(np.arange(4), (2, 1)), val, 64, ValueCoding.SIGN1, IndexCoding.FIXED)


def test_encode_rejects_bad_arguments() -> None:
    ok_idx, ok_val = np.tile(np.arange(4), (2, 1)), np.ones((2, 4), np.float32)
    with pytest.raises(KernelError):
        encode_tensor(0, ok_idx, ok_val, 3, ValueCoding.FP32, IndexCoding.FIXED)  # k > chunk
    with pytest.raises(KernelError):
        encode_tensor(0, ok_idx + 61, ok_val, 64, ValueCoding.FP32, IndexCoding.FIXED)  # out of range
    with pytest.raises(KernelError):
        encode_tensor(0, np.zeros((2, 4), np.int64), ok_val, 64, ValueCoding.FP32, IndexCoding.FIXED)
    with pytest.raises(KernelError):
        encode_tensor(0, ok_idx, ok_val[:, :3], 64, ValueCoding.FP32, IndexCoding.FIXED)
    a, _ = encode_tensor(1, ok_idx, ok_val, 64, ValueCoding.FP32, IndexCoding.FIXED)
    b, _ = encode_tensor(1, ok_idx, ok_val, 64, ValueCoding.FP32, IndexCoding.FIXED)
    with pytest.raises(KernelError):
        encode_payload([a, b])


def test_zero_chunks_and_extreme_magnitudes() -> None:
    idx = np.tile(np.arange(4), (3, 1))
    val = np.array([[0, 0, 0, 0], [1e-30, -1e-30, 0, 0], [3e38, -3e38, 1, 0]], np.float32)
    for vc in ValueCoding:
        enc, deq = encode_tensor(0, idx, val, 64, vc, IndexCoding.FIXED)
        (dec,) = decode_payload(encode_payload([enc]), [(3, 64)]).tensors()
        assert np.isfinite(deq).all() and dec.val.tobytes() == deq.tobytes()
        assert (deq[0] == 0).all()


def test_worked_example_of_the_spec() -> None:
    """docs/protocol-payload.md §6, byte for byte (an interoperability vector)."""
    a, _ = encode_tensor(
        0, np.array([[0, 5], [1, 63]]), np.array([[1.5, -0.25], [2, -3]], np.float32), 64,
        ValueCoding.FP16, IndexCoding.FIXED,
    )  # fmt: skip
    b, deq = encode_tensor(
        2, np.array([[0, 1, 8, 70]]), np.array([[0.5, -0.75, 0.25, 1.0]], np.float32), 4096,
        ValueCoding.SIGN1, IndexCoding.ENTROPY,
    )  # fmt: skip
    data = encode_payload([b, a])
    assert data.hex(" ") == WORKED_EXAMPLE
    h = np.float32(2**-0.5)  # mean |v| = 0.625 -> c = rint(2 log2 0.625) = -1 -> q = -4
    np.testing.assert_array_equal(deq, [[h, -h, h, h]])
    (_, db) = decode_payload(data, [(2, 64), (1, 1), (1, 4096)]).tensors()
    assert db.tensor_id == 2 and db.idx.tolist() == [[0, 1, 8, 70]]
    np.testing.assert_array_equal(db.val, deq)


WORKED_EXAMPLE = "01 02 02 21 02 52 04 48 00 64 00 14 1f e1 5a e1 00 00 3e 00 b4 00 40 00 c2"


Spec = tuple[int, np.ndarray, np.ndarray, int, ValueCoding, IndexCoding]


@st.composite
def _payloads(
    draw: st.DrawFn,
) -> tuple[list[tuple[int, int]], list[Spec]]:
    layouts = draw(
        st.lists(
            st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 5, 16, 49, 64, 256])), min_size=1, max_size=6
        )
    )
    present = draw(st.lists(st.booleans(), min_size=len(layouts), max_size=len(layouts)))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    tensors = []
    for tid, ((n, cn), here) in enumerate(zip(layouts, present, strict=True)):
        if not here:
            continue
        k = draw(st.integers(1, cn))
        idx, val = _topk(rng, n, cn, k)
        if draw(st.booleans()):
            val[rng.random(val.shape) < 0.3] = 0.0
        vc = draw(st.sampled_from(list(ValueCoding)))
        ic = draw(st.sampled_from(list(IndexCoding)))
        tensors.append((tid, idx, val, cn, vc, ic))
    return layouts, tensors


@settings(max_examples=150, deadline=None)
@given(_payloads())
def test_random_payloads_round_trip(case: tuple[list[tuple[int, int]], list[Spec]]) -> None:
    layouts, tensors = case
    encs, want = [], {}
    for tid, idx, val, cn, vc, ic in tensors:
        enc, deq = encode_tensor(tid, idx, val, cn, vc, ic)
        encs.append(enc)
        want[tid] = (idx, deq)
    out = decode_payload(encode_payload(encs), layouts).tensors()
    assert [t.tensor_id for t in out] == sorted(want)
    for t in out:
        np.testing.assert_array_equal(t.idx, want[t.tensor_id][0])
        assert t.val.tobytes() == want[t.tensor_id][1].tobytes()
