"""decode_payload is total: every bad payload raises Rejected with the right code, never anything else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distronet.kernels.coding import IndexCoding, ValueCoding, decode_payload, encode_payload, encode_tensor
from distronet.kernels.coding_bits import pack_bits, varint
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS

LAYOUTS = [(3, 4096), (2, 64), (1, 1)]


def _payload(vc: ValueCoding, ic: IndexCoding, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    encs = []
    for tid, (n, cn) in enumerate(LAYOUTS):
        k = min(cn, 5)
        idx = np.sort(np.argsort(rng.random((n, cn)), axis=1)[:, :k], axis=1)
        val = rng.standard_normal((n, k)).astype(np.float32)
        encs.append(encode_tensor(tid, idx, val, cn, vc, ic)[0])
    return encode_payload(encs)


def _code(data: bytes, layouts: list[tuple[int, int]] = LAYOUTS, **kw: int) -> RejectCode:
    limits = dataclasses.replace(DEFAULT_LIMITS, **kw)
    with pytest.raises(Rejected) as info:
        decode_payload(data, layouts, limits)
    return info.value.code


def _bits(*fields: tuple[int, int]) -> bytes:
    """(width, value) fields packed MSB-first."""
    return pack_bits(np.array([v for _, v in fields]), np.array([w for w, _ in fields]))


def _head(count: int, codings: int, k: int) -> bytes:
    """version 1, ``count`` tensors, one class (codings, k)."""
    return bytes([1]) + varint(count) + bytes([1, codings]) + varint(k)


def _fixed_fp32(idx: list[int], width: int, values: list[float], tid: int = 0) -> bytes:
    """One FP32/FIXED tensor of one chunk, built by hand."""
    bits = _bits((tid + 1, (1 << (tid + 1)) - 2), *[(width, i) for i in idx])
    return _head(1, 0x11, len(idx)) + bits + np.array(values, "<f4").tobytes()


def test_hand_built_payload_decodes() -> None:
    (t,) = decode_payload(_fixed_fp32([0, 63], 6, [1.0, 1.0], tid=1), [(5, 4096), (1, 64)]).tensors()
    assert t.tensor_id == 1 and t.idx.tolist() == [[0, 63]] and t.val.tolist() == [[1.0, 1.0]]


def test_index_out_of_range() -> None:
    # chunk of 49 positions needs 6 bits; 60 fits in the field but is outside the chunk
    assert _code(_fixed_fp32([3, 60], 6, [1, 1]), [(1, 49)]) == RejectCode.INDEX_OUT_OF_RANGE


def test_duplicate_and_unsorted_index() -> None:
    assert _code(_fixed_fp32([3, 9, 9], 6, [1, 1, 1]), [(1, 64)]) == RejectCode.DUPLICATE_INDEX
    assert _code(_fixed_fp32([9, 3, 9], 6, [1, 1, 1]), [(1, 64)]) == RejectCode.DUPLICATE_INDEX
    assert _code(_fixed_fp32([9, 3, 10], 6, [1, 1, 1]), [(1, 64)]) == RejectCode.MALFORMED


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_value(bad: float) -> None:
    assert _code(_fixed_fp32([0, 1], 6, [1.0, bad]), [(1, 64)]) == RejectCode.NON_FINITE_VALUE
    fp16 = _head(1, 0x21, 1) + _bits((1, 0), (6, 5)) + np.array([bad], "<f2").tobytes()
    assert _code(fp16, [(1, 64)]) == RejectCode.NON_FINITE_VALUE


def _scaled(codings: int, delta: int, value: bytes) -> bytes:
    """One chunk, k=1, index 0, scale code ``delta`` away from 0 (b0 = its bucket, w = 0)."""
    sym = 2 * delta + 1 if delta >= 0 else -2 * delta  # zigzag(delta) + 1
    b = sym.bit_length()
    sign = [(1, 0)] if codings >> 4 == 5 else []
    bits = _bits((1, 0), (4, b), (3, 0), (6, 0), (1, 0), (b - 1, sym - (1 << (b - 1))), *sign)
    return _head(1, codings, 1) + bits + value


def test_scales() -> None:
    assert decode_payload(_scaled(0x51, -3, b""), [(1, 64)]).tensors()[0].val[0, 0] == np.float32(2.0**-1.5)
    assert _code(_scaled(0x51, 256, b""), [(1, 64)]) == RejectCode.NON_FINITE_VALUE  # 2**128
    assert _code(_scaled(0x51, -253, b""), [(1, 64)]) == RejectCode.NON_FINITE_VALUE  # 2**-126.5
    assert decode_payload(_scaled(0x41, 1023, bytes([1])), [(1, 64)]).tensors()[0].val[0, 0] == np.float32(
        2.0**127.875
    )
    # the same scale times 127 overflows float32
    assert _code(_scaled(0x41, 1023, bytes([127])), [(1, 64)]) == RejectCode.NON_FINITE_VALUE


def test_declared_sizes_over_limits() -> None:
    good = _payload(ValueCoding.SIGN1, IndexCoding.ENTROPY)
    assert _code(good, max_payload_bytes=len(good) - 1) == RejectCode.TOO_LARGE
    assert _code(good, max_k=4) == RejectCode.LIMIT_EXCEEDED
    assert _code(good, max_total_coefficients=10) == RejectCode.LIMIT_EXCEEDED
    dense = _head(1, 0x51, 0) + _bits((1, 0))  # one dense SIGN1 tensor of chunks of 4096
    assert _code(dense + bytes(600), [(1, 4096)], max_k=64) == RejectCode.LIMIT_EXCEEDED
    assert _code(bytes([1, 4]) + good[2:]) == RejectCode.LIMIT_EXCEEDED  # more tensors than the layout
    assert _code(_head(1, 0x11, 4097) + _bits((1, 0))) == RejectCode.LIMIT_EXCEEDED  # k > chunk
    assert _code(_head(1, 0x11, 4) + _bits((4, 0b1110))) == RejectCode.LAYOUT_MISMATCH  # tensor id 3
    assert _code(_head(1, 0x11, 4) + _bits((5, 0b11110))) == RejectCode.MALFORMED  # id delta > layout
    assert _code(bytes([1, 1, 16])) == RejectCode.MALFORMED  # 16 classes
    assert _code(bytes([1, 1, 0])) == RejectCode.MALFORMED  # a tensor and no class
    assert _code(bytes([1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])) == RejectCode.MALFORMED  # overlong varint
    assert _code(bytes([1, 0x80, 0x00])) == RejectCode.MALFORMED  # non-minimal varint
    assert _code(bytes([2, 0, 0])) == RejectCode.UNSUPPORTED_VERSION
    assert _code(_head(1, 0x91, 1)) == RejectCode.MALFORMED  # unknown value coding
    assert _code(_head(1, 0x13, 1)) == RejectCode.MALFORMED  # unknown index coding
    assert _code(good + b"\x00") == RejectCode.MALFORMED  # trailing bytes
    assert _code(_head(1, 0x11, 2) + _bits((1, 0))) == RejectCode.TRUNCATED  # values missing


@pytest.mark.parametrize("vc", list(ValueCoding))
@pytest.mark.parametrize("ic", list(IndexCoding))
def test_every_truncation_is_rejected(vc: ValueCoding, ic: IndexCoding) -> None:
    good = _payload(vc, ic)
    decode_payload(good, LAYOUTS)
    for cut in range(len(good)):
        with pytest.raises(Rejected) as info:
            decode_payload(good[:cut], LAYOUTS)
        assert info.value.code in (RejectCode.TRUNCATED, RejectCode.MALFORMED, RejectCode.LIMIT_EXCEEDED)


def _decode_or_reject(data: bytes) -> None:
    try:
        out = decode_payload(data, LAYOUTS).tensors()
    except Rejected as e:
        assert isinstance(e.code, RejectCode)
        return
    for t in out:
        n, cn = LAYOUTS[t.tensor_id]
        assert t.idx.shape == t.val.shape and t.idx.shape[0] == n
        assert (t.idx >= 0).all() and (t.idx < cn).all() and (np.diff(t.idx, axis=1) > 0).all()
        assert np.isfinite(t.val).all()


GOOD = [_payload(vc, ic, seed) for vc in ValueCoding for ic in IndexCoding for seed in (0, 1)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_or_reject(data)
    _decode_or_reject(_head(1, 0x52, 4) + data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(GOOD),
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 3)), min_size=1, max_size=4
    ),
)
def test_fuzz_mutated_payloads(good: bytes, edits: list[tuple[int, int, int]]) -> None:
    data = bytearray(good)
    for pos, byte, kind in edits:
        p = pos % (len(data) + 1)
        if kind == 0 and p < len(data):
            data[p] = byte
        elif kind == 1:
            data.insert(p, byte)
        elif kind == 2 and p < len(data):
            del data[p]
        elif p < len(data):
            data[p] ^= 1 << (byte % 8)
    _decode_or_reject(bytes(data))


def test_a_small_payload_cannot_declare_many_coefficients() -> None:
    # one class "dense SIGN1" for 3 tensors of 1000 chunks x 4096: 12M coefficients in 8 bytes
    data = bytes([1, 3, 1, 0x51, 0]) + _bits((3, 0))
    assert _code(data, [(1000, 4096)] * 3) == RejectCode.TRUNCATED


def _entropy_fp32(*fields: tuple[int, int]) -> bytes:
    """One FP32/ENTROPY tensor, k=2, of layout (1, 48): id bit, group parameters all 0, then ``fields``."""
    return _head(1, 0x12, 2) + _bits((1, 0), (14, 0), *fields) + np.ones(2, "<f4").tobytes()


def test_entropy_rejections() -> None:
    lay = [(1, 48)]
    # gaps 40 and 10: escapes (unary buckets 6 and 4, b0=0 w=0), mantissas 8 (5 bits) and 2 (3 bits)
    ok = _entropy_fp32((2, 0), (7, 0b1111110), (5, 0b11110), (5, 8), (3, 2))
    assert _code(ok, lay) == RejectCode.INDEX_OUT_OF_RANGE  # ranks 40, 51 >= 48
    fine = _entropy_fp32((2, 0), (7, 0b1111110), (4, 0b1110), (5, 8), (2, 2))  # gaps 40, 6
    assert decode_payload(fine, lay).tensors()[0].idx.tolist() == [[40, 47]]
    assert _code(_entropy_fp32((2, 1), (7, 0b1111110)), lay) == RejectCode.MALFORMED  # transpose, 48 not s*s
    assert _code(_entropy_fp32((2, 0), (8, 0b11111110)), lay) == RejectCode.MALFORMED  # bucket 7 > 6
    assert _code(_entropy_fp32((2, 0), (7, 0b1111110)), lay) == RejectCode.TRUNCATED  # stream ends
