"""The membership credential, version 1 (docs/protocol.md section 16): the coordinator's signed,
expiring statement "peer P is admitted to run R as a producer until T".

The coordinator signs it with its run-wide Ed25519 key (whose peer id is the run's
``coordinator_key``, published in the run's public definition); any node verifies it offline.
Fixed binary layout, integers big-endian::

    b"DNC1" | u8 role | u8 len(run) | run ASCII | peer (38) | u64 issued_at | u64 not_after
            | ticket (16) | signature (64)

``issued_at`` and ``not_after`` are whole seconds of wall-clock time; ``ticket`` is a value the
coordinator derives from its secret key, the run and the peer: the same in every credential it
issues that peer for that run, unknown to the peer before it is admitted. The leader ranking is
computed from it (docs/decisions/leader-rank.md). The signature covers ``CREDENTIAL_DOMAIN``
followed by every byte before the signature. Between 141 and 204 bytes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import (
    PEER_ID_BYTES,
    SIGNATURE_BYTES,
    Identity,
    is_ed25519_peer_id,
    peer_id_to_b58,
    verify,
)
from distronet.protocol.limits import DEFAULT_LIMITS, Limits
from distronet.protocol.packet import check_run_id

__all__ = [
    "CREDENTIAL_DOMAIN",
    "CREDENTIAL_MAGIC",
    "MAX_CREDENTIAL_BYTES",
    "MIN_CREDENTIAL_BYTES",
    "ROLE_PRODUCER",
    "TICKET_BYTES",
    "Credential",
    "credential_ticket",
    "open_credential",
    "seal_credential",
]

CREDENTIAL_MAGIC = b"DNC1"
CREDENTIAL_DOMAIN = b"distronet/credential/v1\x00"
ROLE_PRODUCER = 1
ROLES = frozenset({ROLE_PRODUCER})
TICKET_BYTES = 16
_TAIL = struct.Struct(">QQ")
MIN_CREDENTIAL_BYTES = 4 + 2 + 1 + PEER_ID_BYTES + _TAIL.size + TICKET_BYTES + SIGNATURE_BYTES
MAX_CREDENTIAL_BYTES = MIN_CREDENTIAL_BYTES - 1 + DEFAULT_LIMITS.max_run_id_len
MAX_LIFETIME_S = 7 * 86400  # a credential claiming a longer life than this is refused


@dataclass(frozen=True)
class Credential:
    """An opened (verified) credential; ``raw`` is its exact bytes (what announcements carry)."""

    run_id: str
    peer_id: bytes
    role: int
    issued_at: int
    not_after: int
    ticket: bytes
    raw: bytes

    @property
    def digest(self) -> bytes:
        """SHA-256 of ``raw``: the key verifications are cached under."""
        return self.digest_of(self.raw)

    @staticmethod
    def digest_of(raw: bytes) -> bytes:
        return hashlib.sha256(raw).digest()

    def valid_at(self, now: float) -> bool:
        return self.issued_at <= now + 60 and now < self.not_after  # 60 s of clock skew tolerated


def credential_ticket(secret: bytes, run_id: str, peer_id: bytes) -> bytes:
    """The coordinator's ticket for ``peer_id`` in ``run_id`` under its ``secret`` (module doc)."""
    run = run_id.encode("ascii")
    msg = b"distronet/ticket/v1\x00" + struct.pack(">B", len(run)) + run + peer_id
    return hashlib.sha256(secret + msg).digest()[:TICKET_BYTES]


def _body(run_id: str, peer_id: bytes, role: int, issued_at: int, not_after: int, ticket: bytes) -> bytes:
    run = run_id.encode("ascii")
    head = CREDENTIAL_MAGIC + struct.pack(">BB", role, len(run)) + run + peer_id
    return head + _TAIL.pack(issued_at, not_after) + ticket


def seal_credential(
    coordinator: Identity,
    run_id: str,
    peer_id: bytes,
    *,
    issued_at: int,
    lifetime_s: int,
    ticket: bytes,
    role: int = ROLE_PRODUCER,
) -> bytes:
    """The credential bytes for ``peer_id``, signed by the ``coordinator`` key. Raises ValueError
    on a bad run id, peer id, role, time or ticket (the coordinator's own bug, not a peer's)."""
    if not check_run_id(run_id) or not is_ed25519_peer_id(peer_id) or role not in ROLES:
        raise ValueError("credential: bad run id, peer id or role")
    if len(ticket) != TICKET_BYTES or not 0 <= issued_at < 2**63 or not 0 < lifetime_s <= MAX_LIFETIME_S:
        raise ValueError("credential: bad ticket, issue time or lifetime")
    body = _body(run_id, peer_id, role, issued_at, issued_at + lifetime_s, ticket)
    return body + coordinator.sign(CREDENTIAL_DOMAIN + body)


def open_credential(
    data: bytes,
    *,
    run_id: str,
    coordinator_key: bytes,
    now: float,
    peer_id: bytes | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Credential:
    """Decode and verify a credential for ``run_id`` signed by ``coordinator_key`` (a peer id),
    valid at ``now`` (and naming ``peer_id`` when given). Raises Rejected: TOO_LARGE,
    TRUNCATED, MALFORMED (magic, role, run id or peer id), WRONG_RUN, WRONG_PEER,
    BAD_SIGNATURE, NOT_ADMITTED (expired or not yet valid). Cost: one Ed25519 verify."""
    if len(data) > MAX_CREDENTIAL_BYTES:
        raise Rejected(RejectCode.TOO_LARGE, f"credential of {len(data)} bytes")
    if len(data) < MIN_CREDENTIAL_BYTES:
        raise Rejected(RejectCode.TRUNCATED, f"credential of {len(data)} bytes")
    if not data.startswith(CREDENTIAL_MAGIC):
        raise Rejected(RejectCode.MALFORMED, "not a credential")
    role, n = data[4], data[5]
    if len(data) != MIN_CREDENTIAL_BYTES - 1 + n:
        raise Rejected(RejectCode.MALFORMED, f"credential of {len(data)} bytes for a run id of {n}")
    at = 6 + n
    try:
        run = data[6:at].decode("ascii")
    except UnicodeDecodeError:
        raise Rejected(RejectCode.MALFORMED, "credential run id") from None
    peer = data[at : at + PEER_ID_BYTES]
    at += PEER_ID_BYTES
    issued_at, not_after = _TAIL.unpack_from(data, at)
    at += _TAIL.size
    ticket, sig = data[at : at + TICKET_BYTES], data[at + TICKET_BYTES :]
    if role not in ROLES or not check_run_id(run, limits) or not is_ed25519_peer_id(peer):
        raise Rejected(RejectCode.MALFORMED, "credential role, run id or peer id")
    who = peer_id_to_b58(peer)
    if run != run_id:
        raise Rejected(RejectCode.WRONG_RUN, f"credential of run {run!r}", peer_id=who)
    if peer_id is not None and peer != peer_id:
        raise Rejected(RejectCode.WRONG_PEER, "credential names another peer", peer_id=who)
    if not verify(coordinator_key, CREDENTIAL_DOMAIN + data[:-SIGNATURE_BYTES], sig):
        raise Rejected(RejectCode.BAD_SIGNATURE, "credential", peer_id=who)
    cred = Credential(run, peer, role, issued_at, not_after, ticket, bytes(data))
    if not_after - issued_at > MAX_LIFETIME_S or not cred.valid_at(now):
        raise Rejected(RejectCode.NOT_ADMITTED, f"credential valid {issued_at}..{not_after}", peer_id=who)
    return cred
