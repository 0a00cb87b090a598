"""Round manifests: sign/open round trip and typed rejection of tampered or oversize manifests (no daemon)."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.manifest import leader_rank, open_manifest, seal_manifest

LEADER = Identity.from_seed(b"\x01" * 32)
OTHER = Identity.from_seed(b"\x02" * 32)
ENTRIES = [
    (OTHER.peer_id, hashlib.sha256(b"o").digest(), 10),
    (LEADER.peer_id, hashlib.sha256(b"l").digest(), 20),
]


def opened(data: bytes, **kw: object) -> object:
    return open_manifest(
        data, run_id="r", max_entries=kw.get("max_entries", 8), max_size=kw.get("max_size", 100)
    )  # type: ignore[arg-type]


def test_round_trip_sorts_entries_and_verifies() -> None:
    m = open_manifest(seal_manifest(LEADER, "r", 5, ENTRIES), run_id="r", max_entries=8, max_size=100)
    assert m.leader == LEADER.peer_id and m.step == 5
    assert [p for p, _, _ in m.entries] == sorted([LEADER.peer_id, OTHER.peer_id])
    assert m.rank == leader_rank(5, LEADER.peer_id)
    assert leader_rank(5, LEADER.peer_id) != leader_rank(6, LEADER.peer_id)


def test_a_late_leader_may_seal_an_earlier_manifests_entries_without_its_own() -> None:
    theirs = [ENTRIES[0]]  # the entries of a manifest that leaves LEADER's late frame out
    m = open_manifest(seal_manifest(LEADER, "r", 5, theirs), run_id="r", max_entries=8, max_size=100)
    assert m.leader == LEADER.peer_id and list(m.entries) == theirs


def _tamper(field: str, value: object) -> bytes:
    body = msgpack.unpackb(seal_manifest(LEADER, "r", 5, ENTRIES))
    body[field] = value
    return msgpack.packb(body)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (_tamper("step", 6), RejectCode.BAD_SIGNATURE),
        (_tamper("run", "other"), RejectCode.WRONG_RUN),
        (_tamper("entries", [[OTHER.peer_id, b"\x00" * 32, 10]]), RejectCode.BAD_SIGNATURE),
        (_tamper("entries", []), RejectCode.MALFORMED),
        (_tamper("entries", [list(e) for e in ENTRIES[::-1]]), RejectCode.MALFORMED),  # unsorted
        (_tamper("entries", [[LEADER.peer_id, b"\x00" * 32, 10**9]]), RejectCode.TOO_LARGE),
        (_tamper("leader", b"\x00" * 38), RejectCode.MALFORMED),
        (b"\xc1garbage", RejectCode.MALFORMED),
        (msgpack.packb([1, 2, 3]), RejectCode.MALFORMED),
    ],
)
def test_tampered_manifests_are_rejected_with_codes(data: bytes, code: RejectCode) -> None:
    with pytest.raises(Rejected) as info:
        opened(data)
    assert info.value.code == code


def test_too_many_entries_is_refused_before_use() -> None:
    many = [(Identity.from_seed(bytes([i]) * 32).peer_id, b"\x00" * 32, 1) for i in range(3, 20)]
    data = seal_manifest(LEADER, "r", 1, [*many, (LEADER.peer_id, b"\x00" * 32, 1)])
    with pytest.raises(Rejected) as info:
        opened(data, max_entries=4)
    assert info.value.code in (RejectCode.LIMIT_EXCEEDED, RejectCode.MALFORMED)
