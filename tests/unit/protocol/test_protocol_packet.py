"""Step packets: seal/open, every rejection code open_packet can give, and the signature's coverage."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError, MessageKind, decode_frame, encode_frame
from distronet.protocol.identity import Identity
from distronet.protocol.limits import DEFAULT_LIMITS, Limits
from distronet.protocol.packet import (
    PACKET_DOMAIN,
    StepPacket,
    open_packet,
    packet_signing_bytes,
    seal_packet,
)

ME = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes(range(1, 33)))
RUN = "run-1"
LAYOUT = hashlib.sha256(b"layout").digest()
PAYLOAD = bytes(range(256)) * 4


def opened(frame: bytes, **kw: Any) -> StepPacket:
    args: dict[str, Any] = {"run_id": RUN, "layout_digest": LAYOUT, **kw}
    return open_packet(frame, **args)


def rejected(frame: bytes, **kw: Any) -> Rejected:
    with pytest.raises(Rejected) as info:
        opened(frame, **kw)
    return info.value


def body_of(frame: bytes) -> dict[str, Any]:
    return decode_frame(frame, MessageKind.STEP_PACKET)


def reframe(body: dict[str, Any]) -> bytes:
    return encode_frame(MessageKind.STEP_PACKET, body, compress=True)


def test_seal_open_roundtrip() -> None:
    frame = seal_packet(ME, RUN, 7, LAYOUT, PAYLOAD)
    pkt = opened(frame)
    assert (pkt.version, pkt.run_id, pkt.step, pkt.peer_id) == (1, RUN, 7, ME.peer_id)
    assert pkt.layout_digest == LAYOUT and pkt.payload == PAYLOAD
    assert pkt.peer_id_b58 == ME.peer_id_b58
    assert pkt.payload_sha256 == hashlib.sha256(PAYLOAD).digest()
    assert opened(seal_packet(ME, RUN, 0, LAYOUT, b"")).payload == b""
    assert len(frame) < len(PAYLOAD)  # zstd used when it helps


def test_known_answer_vector() -> None:
    """Fixed inputs give fixed bytes (Ed25519 is deterministic): the vector in docs/protocol.md."""
    msg = packet_signing_bytes(1, "demo", 42, ME.peer_id, bytes(32), hashlib.sha256(b"").digest(), 0)
    assert msg.startswith(PACKET_DOMAIN + b"\x00\x01\x04demo" + (42).to_bytes(8, "big") + b"\x26")
    assert len(msg) == len(PACKET_DOMAIN) + 2 + 1 + 4 + 8 + 1 + 38 + 32 + 32 + 8
    assert ME.peer_id_b58 == "12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB"
    assert (
        hashlib.sha256(msg).hexdigest() == "8044b2210188c533a7959902f9a117c368367e2a102cdf68ae8a06fd83990c6d"
    )
    assert ME.sign(msg).hex() == (
        "33411f924c99f32882024d10a08f7a2be90aa5dca155d3c4b0e5d91d95011384"
        "3949d8c8b135b7a6e31d55ecf5806e93c26665e22eb15a33e53d15be062a860d"
    )


def test_wrong_run_layout_step_peer_carry_context() -> None:
    frame = seal_packet(ME, RUN, 7, LAYOUT, PAYLOAD)
    e = rejected(frame, run_id="run-2")
    assert (e.code, e.run_id, e.peer_id, e.step) == (RejectCode.WRONG_RUN, RUN, ME.peer_id_b58, 7)
    assert rejected(frame, layout_digest=bytes(32)).code == RejectCode.LAYOUT_MISMATCH
    assert rejected(frame, current_step=30).code == RejectCode.STALE_STEP
    assert rejected(frame, current_step=4).code == RejectCode.STALE_STEP
    assert opened(frame, current_step=8).step == 7
    assert rejected(frame, expected_peer=OTHER.peer_id).code == RejectCode.WRONG_PEER
    assert opened(frame, expected_peer=ME.peer_id).step == 7


def test_bad_signature_on_every_field() -> None:
    frame = seal_packet(ME, RUN, 7, LAYOUT, PAYLOAD)
    base = body_of(frame)
    changes: list[tuple[str, Any, dict[str, Any]]] = [
        ("run", "run-x", {"run_id": "run-x"}),
        ("step", 8, {}),
        ("peer", OTHER.peer_id, {}),
        ("layout", bytes(32), {"layout_digest": bytes(32)}),
        ("payload", PAYLOAD[:-1] + b"\0", {}),
        ("sig", bytes(64), {}),
    ]
    for key, value, kw in changes:
        e = rejected(reframe({**base, key: value}), **kw)
        assert e.code == RejectCode.BAD_SIGNATURE, key
    # A valid signature by another key, claiming to be ME, also fails.
    forged = {**base, "sig": OTHER.sign(b"anything")}
    assert rejected(reframe(forged)).code == RejectCode.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("key", "value", "code"),
    [
        ("v", 2, RejectCode.UNSUPPORTED_VERSION),
        ("v", "1", RejectCode.MALFORMED),
        ("v", True, RejectCode.MALFORMED),
        ("v", 1.0, RejectCode.MALFORMED),
        ("v", None, RejectCode.MALFORMED),
        ("step", -1, RejectCode.MALFORMED),
        ("step", True, RejectCode.MALFORMED),
        ("step", 1.0, RejectCode.MALFORMED),
        ("run", "", RejectCode.MALFORMED),
        ("run", "bad run", RejectCode.MALFORMED),
        ("run", "x" * 65, RejectCode.MALFORMED),
        ("run", b"run-1", RejectCode.MALFORMED),
        ("peer", b"\0" * 38, RejectCode.MALFORMED),
        ("peer", ME.peer_id[:-1], RejectCode.MALFORMED),
        ("layout", bytes(31), RejectCode.MALFORMED),
        ("sig", bytes(63), RejectCode.MALFORMED),
        ("payload", "text", RejectCode.MALFORMED),
        ("extra", 1, RejectCode.MALFORMED),
    ],
)
def test_field_validation(key: str, value: Any, code: RejectCode) -> None:
    body = {**body_of(seal_packet(ME, RUN, 7, LAYOUT, PAYLOAD)), key: value}
    assert rejected(reframe(body)).code == code


def test_missing_field_and_oversize_payload() -> None:
    body = body_of(seal_packet(ME, RUN, 7, LAYOUT, PAYLOAD))
    del body["sig"]
    assert rejected(reframe(body)).code == RejectCode.MALFORMED
    frame = seal_packet(ME, RUN, 7, LAYOUT, PAYLOAD)
    tight = dataclasses.replace(DEFAULT_LIMITS, max_payload_bytes=100)
    assert rejected(frame, limits=tight).code == RejectCode.TOO_LARGE


def test_seal_refuses_what_peers_would_reject() -> None:
    for kw in (
        {"run_id": "no spaces"},
        {"step": -1},
        {"step": True},
        {"layout_digest": b"short"},
    ):
        args: dict[str, Any] = {"run_id": RUN, "step": 1, "layout_digest": LAYOUT, **kw}
        with pytest.raises(EncodeError):
            seal_packet(ME, args["run_id"], args["step"], args["layout_digest"], PAYLOAD)
    with pytest.raises(EncodeError):
        seal_packet(ME, RUN, 1, LAYOUT, PAYLOAD, limits=Limits(max_payload_bytes=10))
    with pytest.raises(EncodeError):
        seal_packet(ME, RUN, 1, LAYOUT, PAYLOAD, limits=Limits(max_frame_bytes=100))
