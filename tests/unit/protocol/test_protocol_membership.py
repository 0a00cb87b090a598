"""The membership record's codec (protocol/membership.py): sealed values open, and every
rejection path — including validly signed records that lie about whose they are."""

from __future__ import annotations

import msgpack
import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.limits import DEFAULT_LIMITS, Limits
from distronet.protocol.membership import (
    member_maddrs,
    member_value,
    open_record_value,
    record_signing_bytes,
    seal_record_value,
    subkey_peer,
)

ME = Identity.from_seed(bytes(range(32)))
OTHER = Identity.from_seed(bytes(32))
KEY = b"k" * 20
SUB = msgpack.packb(ME.peer_id_b58)
INNER = msgpack.packb(member_value(["/ip4/127.0.0.1/tcp/1"]))


def _code(subkey: bytes, value: bytes, expiration: float = 100.0, **kw: object) -> RejectCode:
    with pytest.raises(Rejected) as e:
        open_record_value(KEY, subkey, expiration, value, **kw)  # type: ignore[arg-type]
    return e.value.code


def test_a_sealed_record_opens_to_its_map() -> None:
    value = seal_record_value(ME, KEY, SUB, 100.0, INNER)
    assert value[:4] == b"DNM1" and value[68:] == INNER
    assert open_record_value(KEY, SUB, 100.0, value) == INNER
    assert member_maddrs(msgpack.unpackb(INNER)) == ("/ip4/127.0.0.1/tcp/1",)
    assert subkey_peer(SUB) == ME.peer_id


def test_a_record_moved_extended_or_signed_by_another_is_refused() -> None:
    value = seal_record_value(ME, KEY, SUB, 100.0, INNER)
    assert _code(SUB, value, expiration=200.0) == RejectCode.BAD_SIGNATURE  # extended
    with pytest.raises(Rejected):
        open_record_value(b"other-key", SUB, 100.0, value)  # moved to another run's key
    forged = seal_record_value(OTHER, KEY, SUB, 100.0, INNER)  # OTHER writes ME's record
    assert _code(SUB, forged) == RejectCode.BAD_SIGNATURE
    assert _code(SUB, value[:-1] + b"\x00") == RejectCode.BAD_SIGNATURE


def test_bad_values_and_sub_keys_are_refused_before_the_signature() -> None:
    value = seal_record_value(ME, KEY, SUB, 100.0, INNER)
    assert _code(SUB, value, limits=Limits(max_member_record_bytes=len(value) - 1)) == RejectCode.TOO_LARGE
    assert _code(SUB, b"DNM1" + bytes(63)) == RejectCode.MALFORMED
    assert _code(SUB, b"XXXX" + value[4:]) == RejectCode.MALFORMED
    for sub in (msgpack.packb("not-a-peer"), msgpack.packb(ME.peer_id), b"\xc1", b""):
        assert subkey_peer(sub) is None
        assert _code(sub, value) == RejectCode.MALFORMED


def test_only_a_live_members_map_gives_multiaddrs() -> None:
    assert member_maddrs(member_value(None)) is None  # a tombstone
    too_many = ["/ip4/1.2.3.4/tcp/1"] * (DEFAULT_LIMITS.max_member_maddrs + 1)
    for bad in ([1], "x", {"v": 1}, {"v": 1, "maddrs": too_many}, {"v": 1, "maddrs": [5]},
                {"v": 1, "maddrs": ["/" + "a" * DEFAULT_LIMITS.max_multiaddr_len]}):  # fmt: skip
        assert member_maddrs(bad) is None
    assert len(record_signing_bytes(KEY, SUB, 1.0, b"")) == 4 + 4 + len(KEY) + 4 + len(SUB) + 8
