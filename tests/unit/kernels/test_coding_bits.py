"""Bit-level helpers of the payload codec against a plain-Python reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.kernels import coding_bits
from distronet.kernels.coding import warm
from distronet.kernels.coding_bits import (
    BitReader,
    ByteReader,
    append_flags,
    pack_bits,
    unary_fields,
    varint,
    zigzag,
)
from distronet.kernels.coding_bucket import (
    RICE,
    check_params,
    choose_params,
    class_parts,
    class_values,
    finish_class,
    start_class,
)
from distronet.protocol.errors import RejectCode, Rejected

FIELDS = st.lists(st.integers(0, 25).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, (1 << w) - 1))))


def _reference(fields: list[tuple[int, int]]) -> bytes:
    bits = "".join(format(v, f"0{w}b") if w else "" for w, v in fields)
    bits += "0" * (-len(bits) % 8)
    return bytes(int(bits[i : i + 8], 2) for i in range(0, len(bits), 8))


@settings(max_examples=200, deadline=None)
@given(FIELDS)
def test_pack_bits_matches_reference_and_reads_back(fields: list[tuple[int, int]]) -> None:
    w = np.array([f[0] for f in fields], dtype=np.int64)
    v = np.array([f[1] for f in fields], dtype=np.int64)
    data = pack_bits(v, w)
    assert data == _reference(fields)
    r = BitReader(data, "test")
    np.testing.assert_array_equal(r.varwidth(w), v)
    r.finish()


WIDE = st.lists(st.integers(0, 64).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, (1 << w) - 1))))


@settings(max_examples=200, deadline=None)
@given(WIDE)
def test_compiled_and_vectorised_packing_write_the_same_bytes(fields: list[tuple[int, int]]) -> None:
    """Both paths of ``pack_bits`` (the compiled loop once warm, the numpy passes before), every
    width up to 64, against the bit-string reference."""
    w = np.array([f[0] for f in fields], dtype=np.int64)
    v = np.array([f[1] for f in fields], dtype=np.uint64)
    assert warm()
    compiled = pack_bits(v, w)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(coding_bits, "use_jit", lambda: False)
        vectorised = pack_bits(v, w)
    assert compiled == vectorised == _reference(fields)


def test_zero_width_fields_at_a_word_boundary() -> None:
    assert pack_bits(np.array([1, 0, 0]), np.array([0, 0, 0])) == b""
    data = pack_bits(np.array([2**25 - 1, 2**25 - 1, 2**14 - 1, 0]), np.array([25, 25, 14, 0]))
    assert data == b"\xff" * 8


def test_unary_round_trip_and_limits() -> None:
    q = np.array([0, 3, 1, 0, 7])
    data = pack_bits(*unary_fields(q))
    assert data == _reference([(1, 0), (4, 0b1110), (2, 0b10), (1, 0), (8, 0b11111110)])
    np.testing.assert_array_equal(BitReader(data, "u").unary(5, 7), q)
    with pytest.raises(Rejected) as e:
        BitReader(data, "u").unary(5, 6)
    assert e.value.code == RejectCode.MALFORMED
    with pytest.raises(Rejected) as e:
        BitReader(b"\xff", "u").unary(1, 20)
    assert e.value.code == RejectCode.TRUNCATED


def test_padding_must_be_zero_and_exact() -> None:
    r = BitReader(b"\xa1", "p")
    r.fields(1, 7)
    with pytest.raises(Rejected) as e:
        r.finish()
    assert e.value.code == RejectCode.MALFORMED
    r = BitReader(b"\xa0\x00", "p")
    r.fields(1, 7)
    with pytest.raises(Rejected):
        r.finish()  # a whole spare byte


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**35 - 1])
def test_varint_round_trip(value: int) -> None:
    data = varint(value)
    r = ByteReader(data + b"\x07")
    assert r.varint("v") == value and r.remaining == 1
    assert ByteReader(varint(zigzag(-(value // 2)))).svarint("s") == -(value // 2)


@pytest.mark.parametrize("kind", ["geometric", "peaked", "zeros"])
def test_bucket_and_rice_codes_round_trip(kind: str) -> None:
    rng = np.random.default_rng(7)
    x = {
        "geometric": rng.geometric(1 / 300, 2000) - 1,  # Rice territory
        "peaked": rng.integers(0, 4, 2000) * 97 + 1000,  # a few buckets: the bucket code
        "zeros": np.zeros(50, dtype=np.int64),
    }[kind].astype(np.int64)
    x = np.minimum(x, 4095)
    b0, w = choose_params(x, 12)
    assert (w == RICE) == (kind == "geometric")
    fields, escapes, mant = class_parts(x, b0, w, 12)
    data = pack_bits(*(np.concatenate(a) for a in zip(fields, escapes, mant, strict=True)))
    r = BitReader(data, "t")
    prefix, widths = finish_class(r, start_class(r, x.size, b0, w), b0, w, 12)
    np.testing.assert_array_equal(class_values(prefix, r.varwidth(widths), b0, w), x)
    r.finish()
    with pytest.raises(Rejected):
        check_params(b0, 5, 12, "t")
    with pytest.raises(Rejected):
        check_params(13, w, 12, "t")


@pytest.mark.parametrize("nbits", [0, 1, 7, 8, 13])
def test_append_flags(nbits: int) -> None:
    rng = np.random.default_rng(nbits)
    lead = rng.integers(0, 2, nbits)
    flags = rng.integers(0, 2, 11).astype(bool)
    head = pack_bits(lead, np.ones(nbits, dtype=np.int64))
    want = pack_bits(np.concatenate([lead, flags]), np.ones(nbits + 11, dtype=np.int64))
    assert append_flags(head, nbits, flags) == want
