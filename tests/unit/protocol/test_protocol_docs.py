"""docs/protocol.md stays true: its test vectors, rejection codes and limits match the code."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import msgpack

from distronet.protocol import digest, manifest_ask, membership, pull, state
from distronet.protocol.errors import REJECT_MEANING, RejectCode
from distronet.protocol.framing import MessageKind, encode_frame
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_canonical_bytes, layout_digest
from distronet.protocol.limits import DEFAULT_LIMITS, DEFAULT_STREAM_LIMITS
from distronet.protocol.manifest import leader_rank, manifest_signing_bytes, open_manifest, seal_manifest
from distronet.protocol.packet import open_packet, packet_signing_bytes

DOC = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text()
FLAT = re.sub(r"\s+", "", DOC)


def test_identity_and_packet_vectors_are_in_the_spec() -> None:
    me = Identity.from_seed(bytes(range(32)))
    entries = [("w", (4, 4), 2), ("b", (3,), 2)]
    digest = layout_digest(entries)
    payload = b"\x01\x02\x03"
    msg = packet_signing_bytes(1, "demo", 42, me.peer_id, digest, hashlib.sha256(payload).digest(), 3)
    sig = me.sign(msg)
    body = {
        "v": 1,
        "run": "demo",
        "step": 42,
        "peer": me.peer_id,
        "layout": digest,
        "payload": payload,
        "sig": sig,
    }
    frame = encode_frame(MessageKind.STEP_PACKET, body, compress=False)
    assert open_packet(frame, run_id="demo", layout_digest=digest).payload == payload
    for blob in (me.to_bytes(), me.peer_id, layout_canonical_bytes(entries), digest, msg, sig, frame):
        assert blob.hex() in FLAT
    assert me.peer_id_b58 in DOC


def test_every_reject_code_is_documented_with_its_meaning() -> None:
    for code in RejectCode:
        assert f"| {code.value} | `{code.name}` | {REJECT_MEANING[code]} |" in DOC


def test_limit_defaults_match_the_table() -> None:
    for f in dataclasses.fields(DEFAULT_LIMITS):
        value = getattr(DEFAULT_LIMITS, f.name)
        if f.name in ("max_step", "max_step_lag", "max_step_lead"):
            assert f"`{f.name}`" in DOC
        else:
            assert re.search(rf"\| `{f.name}` \| {value:,}[ |]", DOC), f.name


def test_stream_limit_defaults_match_the_table() -> None:
    for f in dataclasses.fields(DEFAULT_STREAM_LIMITS):
        value = getattr(DEFAULT_STREAM_LIMITS, f.name)
        assert re.search(rf"\| `{f.name}` \| {value:,}[ |]", DOC), f.name


def test_every_stream_status_is_documented_with_its_meaning() -> None:
    for meaning in (pull.PULL_STATUS_MEANING, digest.DIGEST_STATUS_MEANING, state.STATE_STATUS_MEANING):
        for code, text in meaning.items():
            assert f"| {code.value} | `{code.name}` | {text} |" in DOC
    for kind, text in manifest_ask.ASK_KIND_MEANING.items():
        assert f'| `{kind.value.hex(" ")}` ("{kind.value.decode()}") | `{kind.name}` | {text} |' in DOC


def test_stream_protocol_ids_and_sizes_are_in_the_spec() -> None:
    for proto in (pull.PULL_PROTOCOL, manifest_ask.MANIFEST_ASK_PROTOCOL, digest.DIGEST_PROTOCOL,
                  state.STATE_MANIFEST_PROTOCOL, state.STATE_PULL_PROTOCOL):  # fmt: skip
        assert f"`{proto}`" in DOC
    for magic in (pull.PULL_MAGIC, digest.DIGEST_MAGIC, state.STATE_ASK):
        assert f'`{magic.hex(" ")}` ("{magic.decode()}")' in DOC
    assert "| 36 | 8 | u64 `max_bytes`" in DOC and pull.PULL_REQUEST_BYTES == 36 + 8
    assert "| 9 | size |" in DOC and pull.PULL_HEADER_BYTES == 9
    assert "| 5 | n |" in DOC and state.STATE_ANSWER_HEADER_BYTES == 5
    assert manifest_ask.GONE.hex() == "47" and "byte `47`" in DOC


def test_round_manifest_vector_is_in_the_spec() -> None:
    me = Identity.from_seed(bytes(range(32)))
    entries = [(me.peer_id, hashlib.sha256(b"\x01\x02\x03").digest(), 204)]
    wire = seal_manifest(me, "demo", 42, entries)
    assert open_manifest(wire, run_id="demo", max_entries=1, max_size=204).entries == tuple(entries)
    signed = manifest_signing_bytes("demo", 42, me.peer_id, tuple(entries))
    for blob in (signed, leader_rank(42, me.peer_id), wire):
        assert blob.hex() in FLAT


def test_stream_vectors_are_in_the_spec() -> None:
    me = Identity.from_seed(bytes(range(32)))
    sha = hashlib.sha256(b"\x01\x02\x03").digest()
    chunks = [hashlib.sha256(b"\x01\x02").digest(), hashlib.sha256(b"\x03").digest()]
    man, wire = state.seal_state_manifest(me, "demo", 42, b"\x01\x02\x03", 2, chunks)
    assert state.open_state_manifest(wire, run_id="demo", sender=me.peer_id) == man
    vectors = (
        pull.encode_pull_request(sha, 1 << 20),
        pull.encode_pull_header(pull.PullStatus.OK, 204),
        manifest_ask.encode_ask(manifest_ask.AskKind.DECIDED, 42),
        manifest_ask.encode_ask(manifest_ask.AskKind.NEWEST),
        digest.encode_digest_request(42),
        digest.digest_signing_bytes("demo", 42, b"\x07" * 32),
        digest.encode_digest_answer(b"\x07" * 32, identity=me, run="demo", step=42),
        state.state_signing_bytes("demo", 42, 3, man.sha256, 2, chunks),
        wire,
    )
    for blob in vectors:
        assert blob.hex() in FLAT


def test_membership_vector_is_in_the_spec() -> None:
    me = Identity.from_seed(bytes(range(32)))
    key = hashlib.sha1(msgpack.packb("distronet/demo/members")).digest()
    sub = msgpack.packb(me.peer_id_b58)
    inner = msgpack.packb(membership.member_value(["/ip4/127.0.0.1/tcp/1"]))
    value = membership.seal_record_value(me, key, sub, 1700000000.5, inner)
    assert membership.open_record_value(key, sub, 1700000000.5, value) == inner
    for blob in (key, sub, membership.record_signing_bytes(key, sub, 1700000000.5, inner), value):
        assert blob.hex() in FLAT
