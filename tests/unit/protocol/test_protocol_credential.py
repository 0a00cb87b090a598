"""Membership credentials (protocol/credential.py): round trip, the test vector of
docs/protocol.md section 16, and typed refusals; the node's Admission registry over them."""

from __future__ import annotations

import pytest

from distronet.node.swarm.admission import Admission
from distronet.protocol.credential import (
    MAX_CREDENTIAL_BYTES,
    credential_ticket,
    open_credential,
    seal_credential,
)
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity

COORD = Identity.from_seed(b"\x07" * 32)
PEER = Identity.from_seed(b"\x01" * 32)
TICKET = credential_ticket(b"secret", "demo", PEER.peer_id)
T0 = 1_700_000_000


def cred(run: str = "demo", signer: Identity = COORD, life: int = 600) -> bytes:
    return seal_credential(signer, run, PEER.peer_id, issued_at=T0, lifetime_s=life, ticket=TICKET)


def opened(data: bytes, now: float = T0 + 1, run: str = "demo") -> object:
    return open_credential(data, run_id=run, coordinator_key=COORD.peer_id, now=now)


def test_round_trip_and_vector() -> None:
    raw = cred()
    c = open_credential(raw, run_id="demo", coordinator_key=COORD.peer_id, now=T0 + 1, peer_id=PEER.peer_id)
    assert (c.peer_id, c.run_id, c.issued_at, c.not_after, c.ticket, c.raw) == (
        PEER.peer_id, "demo", T0, T0 + 600, TICKET, raw,
    )  # fmt: skip
    assert len(raw) == 144 and raw == cred()  # Ed25519 is deterministic: a stable vector
    assert raw.hex().startswith("444e4331010464656d6f")
    assert len(cred(run="r" * 64)) == MAX_CREDENTIAL_BYTES


@pytest.mark.parametrize(
    ("data", "now", "run", "code"),
    [
        (cred(), T0 + 600, "demo", RejectCode.NOT_ADMITTED),  # expired
        (cred(), T0 - 3600, "demo", RejectCode.NOT_ADMITTED),  # not yet valid
        (cred(), T0 + 1, "other", RejectCode.WRONG_RUN),
        (cred(signer=PEER), T0 + 1, "demo", RejectCode.BAD_SIGNATURE),  # another key
        (cred()[:-1], T0 + 1, "demo", RejectCode.MALFORMED),  # length disagrees with the run id
        (cred()[:100], T0 + 1, "demo", RejectCode.TRUNCATED),
        (cred() + b"\x00" * 80, T0 + 1, "demo", RejectCode.TOO_LARGE),
        (b"XXXX" + cred()[4:], T0 + 1, "demo", RejectCode.MALFORMED),
        (cred()[:4] + b"\x09" + cred()[5:], T0 + 1, "demo", RejectCode.MALFORMED),  # role
        (cred()[:-70] + b"\xff" + cred()[-69:], T0 + 1, "demo", RejectCode.BAD_SIGNATURE),  # ticket
    ],
)
def test_bad_credentials_are_refused_with_codes(data: bytes, now: float, run: str, code: RejectCode) -> None:
    with pytest.raises(Rejected) as info:
        opened(data, now, run)
    assert info.value.code == code


def test_a_credential_naming_another_peer_is_refused() -> None:
    with pytest.raises(Rejected) as info:
        open_credential(cred(), run_id="demo", coordinator_key=COORD.peer_id, now=T0, peer_id=COORD.peer_id)
    assert info.value.code == RejectCode.WRONG_PEER


def test_admission_verifies_once_and_respects_expiry() -> None:
    now = [float(T0)]
    adm = Admission("demo", COORD.peer_id, clock=lambda: now[0])
    assert adm.enforced and not adm.admits(PEER.peer_id) and adm.ticket(PEER.peer_id) is None
    for _ in range(3):
        adm.offer(cred(), PEER.peer_id)
    assert adm.verified == 1 and adm.admits(PEER.peer_id) and adm.ticket(PEER.peer_id) == TICKET
    with pytest.raises(Rejected) as info:
        adm.offer(cred(), COORD.peer_id)
    assert info.value.code == RejectCode.WRONG_PEER
    now[0] = T0 + 600
    assert not adm.admits(PEER.peer_id)
    with pytest.raises(Rejected):
        adm.offer(cred(signer=PEER))


def test_an_open_registry_admits_anyone_and_ranks_by_the_old_formula() -> None:
    adm = Admission("demo", None)
    assert not adm.enforced and adm.admits(PEER.peer_id) and adm.offer(b"junk") is None
    assert adm.ticket(PEER.peer_id) is None


def test_the_spec_vector() -> None:
    import re
    from pathlib import Path

    from distronet.protocol.manifest import leader_rank

    doc = re.sub(r"\s+", "", (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text())
    coord = Identity.from_seed(bytes(range(32)))
    ticket = credential_ticket(b"secret", "demo", PEER.peer_id)
    raw = seal_credential(coord, "demo", PEER.peer_id, issued_at=T0, lifetime_s=600, ticket=ticket)
    for blob in (ticket, raw, leader_rank(42, PEER.peer_id, ticket)):
        assert blob.hex() in doc
    assert open_credential(raw, run_id="demo", coordinator_key=coord.peer_id, now=T0).ticket == ticket


def test_membership_maps_carry_a_credential_only_when_well_sized() -> None:
    from distronet.protocol.membership import member_credential, member_maddrs, member_value

    value = member_value(["/ip4/127.0.0.1/tcp/1"], cred())
    assert member_credential(value) == cred() and member_maddrs(value) == ("/ip4/127.0.0.1/tcp/1",)
    assert member_credential(member_value(["/ip4/127.0.0.1/tcp/1"])) is None
    assert member_credential(member_value(None)) is None
    assert member_credential({"v": 1, "maddrs": [], "cred": b"x" * 10}) is None
    assert member_credential({"v": 1, "maddrs": [], "cred": "text"}) is None
