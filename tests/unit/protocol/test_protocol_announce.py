"""Gossip announcements: <= 1 KiB by construction, signed, strictly validated."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from distronet.protocol.announce import (
    MAX_ADDRS,
    Announcement,
    open_announcement,
    seal_announcement,
)
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError, MessageKind, decode_frame, encode_frame
from distronet.protocol.identity import Identity
from distronet.protocol.limits import DEFAULT_LIMITS
from distronet.protocol.packet import seal_packet

ME = Identity.from_seed(b"\7" * 32)
OTHER = Identity.generate()
RUN = "run-1"
FRAME = seal_packet(ME, RUN, 3, hashlib.sha256(b"l").digest(), b"payload" * 100)
ADDR = "/ip4/127.0.0.1/tcp/4001/p2p/" + ME.peer_id_b58


def opened(frame: bytes, **kw: Any) -> Announcement:
    return open_announcement(frame, **{"run_id": RUN, **kw})


def code_of(frame: bytes, **kw: Any) -> RejectCode:
    with pytest.raises(Rejected) as info:
        opened(frame, **kw)
    return info.value.code


def body_of(frame: bytes) -> dict[str, Any]:
    return decode_frame(frame, MessageKind.ANNOUNCEMENT, max_array_len=MAX_ADDRS)


def reframe(body: dict[str, Any]) -> bytes:
    return encode_frame(MessageKind.ANNOUNCEMENT, body, compress=False)


def test_roundtrip_and_matches_the_frame() -> None:
    ann = opened(seal_announcement(ME, RUN, 3, FRAME, addrs=[ADDR]))
    assert (ann.run_id, ann.step, ann.peer_id, ann.addrs) == (RUN, 3, ME.peer_id, (ADDR,))
    assert ann.packet_size == len(FRAME) and ann.peer_id_b58 == ME.peer_id_b58
    assert ann.matches(FRAME)
    assert not ann.matches(FRAME[:-1] + b"\0")
    assert not ann.matches(FRAME + b"\0")


def test_worst_case_fits_one_kibibyte() -> None:
    run = "r" * DEFAULT_LIMITS.max_run_id_len
    addrs = ["/" + "a" * 127] * MAX_ADDRS  # 512 bytes of hints: the most allowed
    frame = seal_announcement(ME, run, DEFAULT_LIMITS.max_step, FRAME, addrs=addrs)
    assert opened(frame, run_id=run).addrs == tuple(addrs)
    widest = {**body_of(frame), "size": 2**64 - 1}  # every int at its widest msgpack encoding
    assert len(frame) <= len(reframe(widest)) <= 1024


def test_rejections() -> None:
    frame = seal_announcement(ME, RUN, 3, FRAME, addrs=[ADDR])
    assert code_of(frame, run_id="other") == RejectCode.WRONG_RUN
    assert code_of(frame, current_step=100) == RejectCode.STALE_STEP
    assert code_of(frame + b"\0" * 1100) == RejectCode.TOO_LARGE
    assert code_of(frame[:-3]) == RejectCode.TRUNCATED
    assert code_of(FRAME) in (RejectCode.MALFORMED, RejectCode.TOO_LARGE)  # a packet is no announcement
    base = body_of(frame)
    for key, value in (
        ("size", 999),
        ("sha", bytes(32)),
        ("step", 4),
        ("addrs", []),
        ("peer", OTHER.peer_id),
    ):
        assert code_of(reframe({**base, key: value})) == RejectCode.BAD_SIGNATURE, key
    for key, value in (
        ("v", 2),
        ("size", 0),
        ("sha", b"short"),
        ("addrs", ["no-slash"]),
        ("addrs", ["/a b"]),
        ("addrs", "/ip4"),
        ("addrs", ["/" + "a" * 300]),
        ("extra", 1),
    ):
        expected = RejectCode.UNSUPPORTED_VERSION if key == "v" else RejectCode.MALFORMED
        assert code_of(reframe({**base, key: value})) == expected, (key, value)


def test_seal_refuses_bad_input() -> None:
    for args, kw in (
        ((RUN, 3, b""), {}),
        (("bad run", 3, FRAME), {}),
        ((RUN, -1, FRAME), {}),
        ((RUN, 3, FRAME), {"addrs": ["/x"] * (MAX_ADDRS + 1)}),
        ((RUN, 3, FRAME), {"addrs": ["/" + "a" * 200] * 3}),
        ((RUN, 3, FRAME), {"addrs": ["/é"]}),
    ):
        with pytest.raises(EncodeError):
            seal_announcement(ME, *args, **kw)  # type: ignore[arg-type]


def test_warm_up_mark_is_signed_and_optional() -> None:
    plain = seal_announcement(ME, RUN, 3, FRAME, addrs=[ADDR])
    warm = seal_announcement(ME, RUN, 3, FRAME, addrs=[ADDR], warmup=True)
    assert "warm" not in body_of(plain) and body_of(warm)["warm"] is True
    assert not opened(plain).warmup and opened(warm).warmup
    assert len(warm) <= len(plain) + 8
    # the mark is covered by the signature: it can be neither stripped nor added by a relay
    stripped = {k: v for k, v in body_of(warm).items() if k != "warm"}
    assert code_of(reframe(stripped)) == RejectCode.BAD_SIGNATURE
    assert code_of(reframe({**body_of(plain), "warm": True})) == RejectCode.BAD_SIGNATURE
    for value in (False, 1, "yes"):
        assert code_of(reframe({**body_of(warm), "warm": value})) == RejectCode.MALFORMED, value


def test_unmarked_announcement_signs_the_first_schema_bytes() -> None:
    from distronet.protocol.announce import announcement_signing_bytes

    args = (1, RUN, 3, ME.peer_id, bytes(32), 10, [ADDR])
    assert announcement_signing_bytes(*args) == announcement_signing_bytes(*args, False)
    assert announcement_signing_bytes(*args, True) == announcement_signing_bytes(*args) + b"\x01"
