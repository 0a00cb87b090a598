"""docs/protocol.md stays true: its test vectors, rejection codes and limits match the code."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

from distronet.protocol.errors import REJECT_MEANING, RejectCode
from distronet.protocol.framing import MessageKind, encode_frame
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_canonical_bytes, layout_digest
from distronet.protocol.limits import DEFAULT_LIMITS
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
