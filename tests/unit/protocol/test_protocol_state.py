"""The state protocols' codec (protocol/state.py): the signed state manifest and the ask's
framing — round trips, every rejection path, and validly signed manifests that lie."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import msgpack
import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError
from distronet.protocol.identity import Identity
from distronet.protocol.limits import StreamLimits
from distronet.protocol.state import (
    STATE_ASK,
    STATE_STATUS_MEANING,
    StateStatus,
    decode_state_answer_length,
    decode_state_ask,
    encode_state_answer,
    encode_state_ask,
    open_state_manifest,
    seal_state_manifest,
    state_signing_bytes,
)

ME = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes(32))
BLOB = bytes(range(256)) * 40  # 10,240 bytes: 3 chunks of 4,096


def _chunks(blob: bytes, chunk: int) -> list[bytes]:
    return [hashlib.sha256(blob[o : o + chunk]).digest() for o in range(0, len(blob), chunk)]


def _sealed(**over: Any) -> bytes:
    """A manifest signed by ME over its own (possibly lying) fields, keys in the sealer's order."""
    f: dict[str, Any] = {"v": 1, "run": "demo", "step": 9, "size": len(BLOB),
                         "sha": hashlib.sha256(BLOB).digest(), "chunk": 4096,
                         "chunks": _chunks(BLOB, 4096), "peer": ME.peer_id}  # fmt: skip
    f.update(over)
    try:
        sig = ME.sign(state_signing_bytes(f["run"], f["step"], f["size"], f["sha"], f["chunk"], f["chunks"]))
    except struct.error:  # a value no signing input can hold (a negative step): any signature
        sig = bytes(64)
    out: bytes = msgpack.packb({**f, "sig": sig}, use_bin_type=True)
    return out


def _rejected(data: bytes, **kw: Any) -> RejectCode:
    with pytest.raises(Rejected) as e:
        open_state_manifest(data, run_id="demo", sender=ME.peer_id, **kw)
    return e.value.code


def test_a_sealed_manifest_opens_to_the_same_manifest() -> None:
    manifest, wire = seal_state_manifest(ME, "demo", 9, BLOB, 4096, _chunks(BLOB, 4096))
    assert open_state_manifest(wire, run_id="demo", sender=ME.peer_id) == manifest
    assert manifest.root == (9, hashlib.sha256(BLOB).digest())
    assert [manifest.chunk_size(i) for i in range(3)] == [4096, 4096, 2048]
    assert _sealed() == wire  # the test's own signer writes the same bytes


def test_sealing_refuses_what_breaks_the_limits() -> None:
    with pytest.raises(EncodeError):
        seal_state_manifest(ME, "demo", 9, b"", 4096, [])
    with pytest.raises(EncodeError):
        seal_state_manifest(ME, "demo", 9, BLOB, 4096, _chunks(BLOB, 4096)[:2])  # a chunk missing
    with pytest.raises(EncodeError):
        seal_state_manifest(
            ME, "demo", 9, BLOB, 1024, _chunks(BLOB, 1024), limits=StreamLimits(max_state_chunks=9)
        )


@pytest.mark.parametrize(
    ("over", "code"),
    [
        ({"size": len(BLOB) * 2}, RejectCode.MALFORMED),  # a chunk count that its size does not give
        ({"chunk": 1 << 40}, RejectCode.TOO_LARGE),  # a chunk over the chunk limit
        ({"size": 1 << 62, "chunk": 1}, RejectCode.LIMIT_EXCEEDED),  # 2^62 chunks claimed
        ({"v": 2}, RejectCode.UNSUPPORTED_VERSION),
        ({"v": True}, RejectCode.MALFORMED),
        ({"step": -1}, RejectCode.MALFORMED),
        ({"size": 0, "chunks": []}, RejectCode.MALFORMED),
        ({"chunk": 0}, RejectCode.MALFORMED),
        ({"sha": b"short"}, RejectCode.MALFORMED),
        ({"chunks": [b"x" * 31, b"y" * 32, b"z" * 32]}, RejectCode.MALFORMED),
        ({"run": "other"}, RejectCode.WRONG_RUN),
        ({"peer": OTHER.peer_id}, RejectCode.WRONG_PEER),
        ({"peer": b"\x12\x20" + bytes(36)}, RejectCode.MALFORMED),  # not an Ed25519 peer id
    ],
)
def test_a_validly_signed_manifest_that_lies_is_rejected(over: dict[str, Any], code: RejectCode) -> None:
    assert _rejected(_sealed(**over)) == code


def test_bytes_that_are_no_manifest_are_rejected() -> None:
    good = msgpack.unpackb(_sealed())
    assert _rejected(b"\xc1") == RejectCode.MALFORMED
    assert _rejected(_sealed()[:-3]) == RejectCode.MALFORMED  # truncated msgpack
    assert _rejected(msgpack.packb([1, 2])) == RejectCode.MALFORMED
    assert _rejected(msgpack.packb({**good, "extra": 1})) == RejectCode.MALFORMED
    assert _rejected(_sealed() + b"\x00") == RejectCode.MALFORMED  # trailing bytes
    dup = b"\x8a" + _sealed()[1:] + b"\xa1v\x01"  # ten pairs: "v" twice
    assert _rejected(dup) == RejectCode.MALFORMED
    tampered = msgpack.packb({**good, "step": 10})
    assert _rejected(tampered) == RejectCode.BAD_SIGNATURE
    assert _rejected(msgpack.packb({**good, "sig": b"\x00" * 63})) == RejectCode.BAD_SIGNATURE


def test_size_and_count_limits_are_checked_before_decoding() -> None:
    wire = _sealed()
    assert (
        _rejected(wire, limits=StreamLimits(max_state_manifest_bytes=len(wire) - 1)) == RejectCode.TOO_LARGE
    )
    assert _rejected(wire, limits=StreamLimits(max_state_chunks=2)) == RejectCode.LIMIT_EXCEEDED
    assert _rejected(wire, limits=StreamLimits(max_state_chunk_bytes=4095)) == RejectCode.TOO_LARGE


def test_the_ask_and_its_answer_header() -> None:
    assert decode_state_ask(encode_state_ask()) == 0 and encode_state_ask() == STATE_ASK + bytes(8)
    assert decode_state_ask(encode_state_ask(2**63 - 1)) == 2**63 - 1
    assert encode_state_ask(300) == b"DNS2" + (300).to_bytes(8, "big")
    for bad, code in (
        (b"DNS2", RejectCode.TRUNCATED),
        (STATE_ASK + bytes(7), RejectCode.TRUNCATED),
        (b"DNS1" + bytes(8), RejectCode.MALFORMED),  # version 1's ask (it had no step)
        (STATE_ASK + bytes(9), RejectCode.MALFORMED),
        (STATE_ASK + (2**63).to_bytes(8, "big"), RejectCode.MALFORMED),
    ):
        with pytest.raises(Rejected) as e:
            decode_state_ask(bad)
        assert e.value.code == code
    for step in (-1, 2**63):
        with pytest.raises(EncodeError):
            encode_state_ask(step)
    assert encode_state_answer(None) == b"\x01" + bytes(4)
    assert decode_state_answer_length(encode_state_answer(None)) is None
    answer = encode_state_answer(b"manifest")
    assert decode_state_answer_length(answer[:5]) == 8 and answer[5:] == b"manifest"
    with pytest.raises(EncodeError):
        encode_state_answer(bytes(11), limits=StreamLimits(max_state_manifest_bytes=10))


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (struct.pack(">BI", 0, 0xFFFFFFFF), RejectCode.TOO_LARGE),  # a 4 GiB manifest claimed
        (struct.pack(">BI", 1, 5), RejectCode.MALFORMED),  # "none" with a length
        (struct.pack(">BI", 0, 0), RejectCode.MALFORMED),  # "offered" with nothing
        (struct.pack(">BI", 2, 0), RejectCode.MALFORMED),
        (b"\x00\x00", RejectCode.TRUNCATED),
    ],
)
def test_a_lying_answer_header_is_rejected(head: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as e:
        decode_state_answer_length(head)
    assert e.value.code == code


def test_every_status_has_a_meaning() -> None:
    assert set(STATE_STATUS_MEANING) == set(StateStatus)
