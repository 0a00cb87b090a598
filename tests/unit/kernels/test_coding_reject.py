"""decode_payload is total: every bad payload raises Rejected with the right code, never anything else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distronet.kernels.coding import IndexCoding, ValueCoding, decode_payload, encode_payload, encode_tensor
from distronet.kernels.coding_bits import varint, zigzag
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


def _fixed_tensor(tid_delta: int, k: int, idx: list[int], width: int) -> bytes:
    """A hand-built FP32/FIXED tensor: indices packed MSB-first, values all 1.0."""
    bits = "".join(format(i, f"0{width}b") for i in idx)
    bits += "0" * (-len(bits) % 8)
    packed = int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
    return varint(tid_delta) + bytes([0x11]) + varint(k) + packed + np.ones(len(idx), "<f4").tobytes()


def _head(count: int) -> bytes:
    return bytes([1]) + varint(count)


def _tensor(vc: int, ic: int, k: int, tid_delta: int = 0) -> bytes:
    """The start of a tensor: id delta, codings byte, k."""
    return varint(tid_delta) + bytes([vc << 4 | ic]) + varint(k)


def test_hand_built_payload_decodes() -> None:
    data = _head(1) + _fixed_tensor(1, 2, [0, 63], 6)
    (t,) = decode_payload(data, [(5, 4096), (1, 64)])
    assert t.tensor_id == 1 and t.idx.tolist() == [[0, 63]] and t.val.tolist() == [[1.0, 1.0]]


def test_index_out_of_range() -> None:
    # chunk of 49 positions needs 6 bits; 60 fits in the field but is outside the chunk
    assert _code(_head(1) + _fixed_tensor(0, 2, [3, 60], 6), [(1, 49)]) == RejectCode.INDEX_OUT_OF_RANGE


def test_duplicate_and_unsorted_index() -> None:
    assert _code(_head(1) + _fixed_tensor(0, 3, [3, 9, 9], 6), [(1, 64)]) == RejectCode.DUPLICATE_INDEX
    assert _code(_head(1) + _fixed_tensor(0, 3, [9, 3, 9], 6), [(1, 64)]) == RejectCode.DUPLICATE_INDEX
    assert _code(_head(1) + _fixed_tensor(0, 3, [9, 3, 10], 6), [(1, 64)]) == RejectCode.MALFORMED


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_value(bad: float) -> None:
    body = bytearray(_head(1) + _fixed_tensor(0, 2, [0, 1], 6))
    body[-4:] = np.array([bad], "<f4").tobytes()
    assert _code(bytes(body), [(1, 64)]) == RejectCode.NON_FINITE_VALUE
    h = bytearray(_head(1) + _tensor(2, 1, 1) + bytes([0]))
    h += np.array([bad], "<f2").tobytes()
    assert _code(bytes(h), [(1, 64)]) == RejectCode.NON_FINITE_VALUE


def test_non_finite_scale() -> None:
    # SIGN1, one chunk, k=1 (fixed, 6 bits), scale code base 1024 (> Q_MAX) with width 1, z=1
    word = varint(zigzag(1024) << 4 | 1)
    data = _head(1) + _tensor(5, 1, 1) + word + bytes([0]) + bytes([0x80]) + bytes([0])
    assert _code(data, [(1, 64)]) == RejectCode.NON_FINITE_VALUE
    # an INT8 value 127 times the largest scale overflows float32
    word = varint(zigzag(1023) << 4 | 1)
    data = _head(1) + _tensor(4, 1, 1) + word + bytes([0]) + bytes([0x80]) + bytes([127])
    assert _code(data, [(1, 64)]) == RejectCode.NON_FINITE_VALUE


def test_declared_sizes_over_limits() -> None:
    good = _payload(ValueCoding.SIGN1, IndexCoding.ENTROPY)
    assert _code(good, max_payload_bytes=len(good) - 1) == RejectCode.TOO_LARGE
    assert _code(good, max_k=4) == RejectCode.LIMIT_EXCEEDED
    assert _code(good, max_total_coefficients=10) == RejectCode.LIMIT_EXCEEDED
    assert _code(_head(4) + good[2:]) == RejectCode.LIMIT_EXCEEDED  # more tensors than the layout
    assert _code(_head(1) + _tensor(1, 1, 4097)) == RejectCode.LIMIT_EXCEEDED  # k > chunk
    assert _code(_head(1) + _tensor(1, 1, 0)) == RejectCode.MALFORMED  # k = 0
    assert _code(_head(1) + _tensor(1, 1, 1, tid_delta=7)) == RejectCode.LAYOUT_MISMATCH  # unknown id
    assert _code(_head(1) + _tensor(5, 2, 4) + varint(1 << 30)) == RejectCode.TOO_LARGE  # index bytes
    assert _code(_head(1) + b"\xff\xff\xff\xff\xff\xff") == RejectCode.MALFORMED  # overlong varint
    assert _code(_head(1) + b"\x80\x00" + varint(1)) == RejectCode.MALFORMED  # non-minimal varint
    assert _code(bytes([2, 0])) == RejectCode.UNSUPPORTED_VERSION
    assert _code(_head(1) + _tensor(9, 1, 1)) == RejectCode.MALFORMED  # unknown value coding
    assert _code(_head(1) + _tensor(1, 3, 1)) == RejectCode.MALFORMED  # unknown index coding
    assert _code(good + b"\x00") == RejectCode.MALFORMED  # trailing bytes


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
        out = decode_payload(data, LAYOUTS)
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
    _decode_or_reject(bytes([1, 1, 0, 0x52]) + data)


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
