"""The manifest-ask protocol's codec (protocol/manifest_ask.py): round trips and rejections."""

from __future__ import annotations

import struct

import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError
from distronet.protocol.limits import DEFAULT_LIMITS, StreamLimits
from distronet.protocol.manifest_ask import (
    ASK_KIND_MEANING,
    ASK_REQUEST_BYTES,
    AskKind,
    AskRequest,
    decode_answer_length,
    decode_ask,
    decode_newest,
    encode_answer,
    encode_ask,
    encode_newest,
)


@pytest.mark.parametrize("kind", list(AskKind))
def test_every_ask_round_trips(kind: AskKind) -> None:
    step = 0 if kind is AskKind.NEWEST else 41
    wire = encode_ask(kind, step)
    assert len(wire) == ASK_REQUEST_BYTES and wire[:4] == kind.value
    assert decode_ask(wire) == AskRequest(kind, step)


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"DNM?" + bytes(7), RejectCode.TRUNCATED),
        (b"DNM?" + bytes(9), RejectCode.MALFORMED),
        (b"XXXX" + bytes(8), RejectCode.MALFORMED),
        (b"DNN?" + struct.pack(">Q", 3), RejectCode.MALFORMED),  # "which step" carries none
        (b"DNR?" + struct.pack(">Q", DEFAULT_LIMITS.max_step + 1), RejectCode.MALFORMED),
    ],
)
def test_a_bad_ask_is_rejected(wire: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_ask(wire)
    assert e.value.code == code


def test_encoding_refuses_bad_steps_and_oversized_answers() -> None:
    with pytest.raises(EncodeError):
        encode_ask(AskKind.SEALED, -1)
    with pytest.raises(EncodeError):
        encode_ask(AskKind.NEWEST, 5)
    with pytest.raises(EncodeError):
        encode_answer(bytes(11), limits=StreamLimits(max_manifest_answer_bytes=10))


def test_answers_round_trip_and_their_length_is_checked_before_reading() -> None:
    wire = encode_answer(b"manifest")
    assert decode_answer_length(wire[:4]) == 8 and wire[4:] == b"manifest"
    assert encode_answer(b"") == bytes(4)
    with pytest.raises(Rejected) as e:
        decode_answer_length(struct.pack(">I", 0xFFFFFFFF))  # a 4 GiB lie
    assert e.value.code == RejectCode.TOO_LARGE
    with pytest.raises(Rejected) as e:
        decode_answer_length(bytes(3))
    assert e.value.code == RejectCode.TRUNCATED


def test_newest_step_round_trips_and_lies_are_refused() -> None:
    assert decode_newest(encode_newest(41)) == 41
    assert encode_newest(-1) == b"" and decode_newest(b"") == -1
    for body in (bytes(4), bytes(9), struct.pack(">Q", DEFAULT_LIMITS.max_step + 1)):
        with pytest.raises(Rejected) as e:
            decode_newest(body)
        assert e.value.code == RejectCode.MALFORMED


def test_every_kind_has_a_meaning() -> None:
    assert set(ASK_KIND_MEANING) == set(AskKind)
