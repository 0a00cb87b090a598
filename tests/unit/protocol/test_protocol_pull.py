"""The pull protocol's codec (protocol/pull.py): round trips and every rejection path."""

from __future__ import annotations

import hashlib

import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError
from distronet.protocol.pull import (
    PULL_HEADER_BYTES,
    PULL_REQUEST_BYTES,
    PULL_STATUS_MEANING,
    PullHeader,
    PullRequest,
    PullStatus,
    decode_pull_header,
    decode_pull_request,
    encode_pull_header,
    encode_pull_request,
)

SHA = hashlib.sha256(b"frame").digest()


def test_a_request_round_trips_and_is_44_bytes() -> None:
    wire = encode_pull_request(SHA, 1 << 20)
    assert len(wire) == PULL_REQUEST_BYTES and wire[:4] == b"DNP1"
    assert decode_pull_request(wire) == PullRequest(SHA, 1 << 20)


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (encode_pull_request(SHA, 5)[:-1], RejectCode.TRUNCATED),
        (encode_pull_request(SHA, 5) + b"\x00", RejectCode.MALFORMED),
        (b"DNPX" + encode_pull_request(SHA, 5)[4:], RejectCode.MALFORMED),
        (b"", RejectCode.TRUNCATED),
    ],
)
def test_a_bad_request_is_rejected(wire: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_pull_request(wire)
    assert e.value.code == code


def test_encoding_refuses_what_the_wire_cannot_carry() -> None:
    with pytest.raises(EncodeError):
        encode_pull_request(SHA[:31], 5)
    with pytest.raises(EncodeError):
        encode_pull_request(SHA, 1 << 64)
    with pytest.raises(EncodeError):
        encode_pull_header(PullStatus.OK, -1)


def test_headers_round_trip() -> None:
    head = encode_pull_header(PullStatus.OK, 1000)
    assert len(head) == PULL_HEADER_BYTES
    assert decode_pull_header(head, max_bytes=1000, expected_size=1000) == PullHeader(PullStatus.OK, 1000)
    for status in (PullStatus.NOT_FOUND, PullStatus.PRUNED):
        assert decode_pull_header(encode_pull_header(status, 0), max_bytes=1).status is status


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (encode_pull_header(PullStatus.OK, 1001), RejectCode.TOO_LARGE),  # over the asker's max
        (encode_pull_header(PullStatus.OK, 1 << 40), RejectCode.TOO_LARGE),  # a lie of 1 TiB
        (encode_pull_header(PullStatus.TOO_LARGE, 5000), RejectCode.TOO_LARGE),
        (encode_pull_header(PullStatus.OK, 999), RejectCode.MALFORMED),  # not the announced size
        (encode_pull_header(PullStatus.NOT_FOUND, 10), RejectCode.MALFORMED),  # "none" with a size
        (encode_pull_header(PullStatus.PRUNED, 1), RejectCode.MALFORMED),
        (bytes([7]) + bytes(8), RejectCode.MALFORMED),  # unknown status
        (encode_pull_header(PullStatus.OK, 1)[:8], RejectCode.TRUNCATED),
        (encode_pull_header(PullStatus.OK, 1) + b"\x00", RejectCode.MALFORMED),
    ],
)
def test_a_lying_header_is_rejected_before_the_body_is_read(head: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_pull_header(head, max_bytes=1000, expected_size=1000)
    assert e.value.code == code


def test_every_status_has_a_meaning() -> None:
    assert set(PULL_STATUS_MEANING) == set(PullStatus)
