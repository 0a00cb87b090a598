"""The digest protocol's codec (protocol/digest.py): round trips and rejections."""

from __future__ import annotations

import struct

import pytest

from distronet.protocol.digest import (
    DIGEST_REQUEST_BYTES,
    DIGEST_STATUS_MEANING,
    DigestStatus,
    decode_digest_request,
    decode_digest_status,
    encode_digest_answer,
    encode_digest_request,
)
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError
from distronet.protocol.limits import DEFAULT_LIMITS


def test_a_request_round_trips() -> None:
    wire = encode_digest_request(7)
    assert len(wire) == DIGEST_REQUEST_BYTES and wire[:4] == b"DND?"
    assert decode_digest_request(wire) == 7


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"DND?" + bytes(7), RejectCode.TRUNCATED),
        (b"DND?" + bytes(9), RejectCode.MALFORMED),
        (b"DNX?" + bytes(8), RejectCode.MALFORMED),
        (b"DND?" + struct.pack(">Q", DEFAULT_LIMITS.max_step + 1), RejectCode.MALFORMED),
    ],
)
def test_a_bad_request_is_rejected(wire: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_digest_request(wire)
    assert e.value.code == code


def test_answers_round_trip() -> None:
    found = encode_digest_answer(b"d" * 32)
    assert decode_digest_status(found[:1]) is DigestStatus.FOUND and found[1:] == b"d" * 32
    assert encode_digest_answer(None) == b"\x01"
    assert decode_digest_status(b"\x01") is DigestStatus.UNKNOWN


@pytest.mark.parametrize(("head", "code"), [(b"", RejectCode.TRUNCATED), (b"\x02", RejectCode.MALFORMED)])
def test_a_bad_status_is_rejected(head: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_digest_status(head)
    assert e.value.code == code


def test_encoding_refuses_bad_values() -> None:
    with pytest.raises(EncodeError):
        encode_digest_request(-1)
    with pytest.raises(EncodeError):
        encode_digest_answer(b"short")
    assert set(DIGEST_STATUS_MEANING) == set(DigestStatus)
