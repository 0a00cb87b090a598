"""The digest protocol's codec (protocol/digest.py): round trips and rejections."""

from __future__ import annotations

import struct

import pytest

from distronet.protocol.digest import (
    DIGEST_ANSWER_BYTES,
    DIGEST_PROTOCOL,
    DIGEST_REQUEST_BYTES,
    DIGEST_STATUS_MEANING,
    DigestStatus,
    decode_digest_request,
    decode_digest_status,
    encode_digest_answer,
    encode_digest_request,
    open_digest_answer,
)
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError
from distronet.protocol.identity import Identity
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


ME = Identity.from_seed(b"m" * 32)
OTHER = Identity.from_seed(b"o" * 32)


def test_answers_round_trip_signed() -> None:
    found = encode_digest_answer(b"d" * 32, identity=ME, run="r", step=7)
    assert DIGEST_PROTOCOL == "/distronet/digest/2" and len(found) == 1 + DIGEST_ANSWER_BYTES
    assert decode_digest_status(found[:1]) is DigestStatus.FOUND and found[1:33] == b"d" * 32
    assert open_digest_answer(found[1:], sender=ME.peer_id, run="r", step=7) == b"d" * 32
    assert encode_digest_answer(None, identity=ME, run="r", step=7) == b"\x01"
    assert encode_digest_answer(b"d" * 32, identity=None, run="r", step=7) == b"\x01"
    assert decode_digest_status(b"\x01") is DigestStatus.UNKNOWN


@pytest.mark.parametrize(
    ("sender", "run", "step", "body", "code"),
    [
        (OTHER.peer_id, "r", 7, None, RejectCode.BAD_SIGNATURE),  # signed by another peer
        (ME.peer_id, "other-run", 7, None, RejectCode.BAD_SIGNATURE),  # replayed into another run
        (ME.peer_id, "r", 8, None, RejectCode.BAD_SIGNATURE),  # replayed for another step
        (ME.peer_id, "r", 7, b"d" * 32 + bytes(64), RejectCode.BAD_SIGNATURE),  # unsigned (v1-like + zeros)
        (ME.peer_id, "r", 7, b"e" + b"d" * 31 + b"s" * 64, RejectCode.BAD_SIGNATURE),  # forged digest
        (ME.peer_id, "r", 7, b"d" * 32, RejectCode.TRUNCATED),  # a v1 answer: no signature
    ],
)
def test_an_unsigned_or_forged_digest_is_refused(
    sender: bytes, run: str, step: int, body: bytes | None, code: RejectCode
) -> None:
    if body is None:
        body = encode_digest_answer(b"d" * 32, identity=ME, run="r", step=7)[1:]
    with pytest.raises(Rejected) as e:
        open_digest_answer(body, sender=sender, run=run, step=step)
    assert e.value.code == code


@pytest.mark.parametrize(("head", "code"), [(b"", RejectCode.TRUNCATED), (b"\x02", RejectCode.MALFORMED)])
def test_a_bad_status_is_rejected(head: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_digest_status(head)
    assert e.value.code == code


def test_encoding_refuses_bad_values() -> None:
    with pytest.raises(EncodeError):
        encode_digest_request(-1)
    with pytest.raises(EncodeError):
        encode_digest_answer(b"short", identity=ME, run="r", step=0)
    assert set(DIGEST_STATUS_MEANING) == set(DigestStatus)
