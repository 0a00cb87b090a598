"""The round manifest's codec (protocol/manifest.py): round trip, every rejection path, and
validly signed manifests that lie."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.manifest import (
    Entry,
    encode_manifest,
    leader_rank,
    manifest_signing_bytes,
    open_manifest,
    seal_manifest,
)

LEADER = Identity.from_seed(bytes(range(32)))
PEERS = sorted(Identity.from_seed(bytes([i]) * 32).peer_id for i in (1, 2, 3))
SHA = hashlib.sha256(b"frame").digest()


def _open(data: bytes, **kw: Any) -> Any:
    return open_manifest(data, run_id=kw.pop("run_id", "demo"), max_entries=kw.pop("max_entries", 8),
                         max_size=kw.pop("max_size", 1000))  # fmt: skip


def _signed(entries: list[Any], *, run: str = "demo", step: int = 5, **over: Any) -> bytes:
    """A manifest LEADER signs over exactly these (possibly lying) entries, in this order."""
    try:
        sig = LEADER.sign(manifest_signing_bytes(run, step, LEADER.peer_id, tuple(tuple(e) for e in entries)))
    except Exception:  # entries no signing input can hold: any signature
        sig = bytes(64)
    body = {"v": 1, "run": run, "step": step, "leader": LEADER.peer_id, "entries": entries, "sig": sig}
    body.update(over)
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def _code(data: bytes, **kw: Any) -> RejectCode:
    with pytest.raises(Rejected) as e:
        _open(data, **kw)
    return e.value.code


def test_a_sealed_manifest_round_trips_sorted() -> None:
    entries: list[Entry] = [(PEERS[2], SHA, 10), (PEERS[0], SHA, 20)]
    man = _open(seal_manifest(LEADER, "demo", 5, entries))
    assert man.entries == tuple(sorted(entries)) and man.leader == LEADER.peer_id and man.step == 5
    assert encode_manifest(man) == seal_manifest(LEADER, "demo", 5, entries)
    assert man.rank == leader_rank(5, LEADER.peer_id)


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ([[PEERS[1], SHA, 1], [PEERS[0], SHA, 1]], RejectCode.MALFORMED),  # unsorted
        ([[PEERS[0], SHA, 1], [PEERS[0], SHA, 2]], RejectCode.MALFORMED),  # one peer twice
        ([], RejectCode.MALFORMED),  # an empty accepted set
        ([[PEERS[0], SHA, 1001]], RejectCode.TOO_LARGE),  # a frame over max_size
        ([[PEERS[0], SHA, 0]], RejectCode.TOO_LARGE),
        ([[PEERS[0], SHA[:31], 1]], RejectCode.MALFORMED),
        ([[PEERS[0][:37], SHA, 1]], RejectCode.MALFORMED),
        ([[PEERS[0], SHA]], RejectCode.MALFORMED),
        ([[PEERS[0], SHA, "1"]], RejectCode.MALFORMED),
    ],
)
def test_a_validly_signed_manifest_that_lies_is_rejected(entries: list[Any], code: RejectCode) -> None:
    assert _code(_signed(entries)) == code


def test_counts_runs_and_signatures_are_checked() -> None:
    many = [[p, SHA, 1] for p in PEERS]
    assert _code(_signed(many), max_entries=2) == RejectCode.LIMIT_EXCEEDED
    assert _code(_signed(many), max_entries=0) == RejectCode.LIMIT_EXCEEDED
    assert _code(_signed(many, run="other")) == RejectCode.WRONG_RUN
    good = msgpack.unpackb(_signed(many))
    assert _code(msgpack.packb({**good, "step": 6})) == RejectCode.BAD_SIGNATURE
    assert _code(msgpack.packb({**good, "sig": good["sig"][:63]})) == RejectCode.BAD_SIGNATURE
    assert _code(msgpack.packb({**good, "entries": "x"})) == RejectCode.MALFORMED


@pytest.mark.parametrize(
    "over",
    [{"v": 2}, {"step": -1}, {"step": 1 << 63}, {"leader": b"\x12\x20" + bytes(36)}, {"sig": "text"}],
)
def test_bad_fields_are_malformed(over: dict[str, Any]) -> None:
    assert _code(_signed([[PEERS[0], SHA, 1]], **over)) == RejectCode.MALFORMED


def test_bytes_that_are_no_manifest_are_malformed() -> None:
    wire = _signed([[PEERS[0], SHA, 1]])
    for data in (b"", b"\xc1", wire[:-5], wire + b"\x00", msgpack.packb([1]), msgpack.packb({"v": 1})):
        assert _code(data) == RejectCode.MALFORMED
