"""The digest protocol, version 2: a peer's signed parameter digest after one step (docs/protocol.md §14.4).

One request per stream, one answer, then the server closes::

    request   b"DND?" | u64 step                                         12 bytes
    answer    u8 status | FOUND only: 32-byte BLAKE3 digest | 64-byte    1 or 97 bytes
              Ed25519 signature over digest_signing_bytes(run, step, digest)

Version 1 answered the digest unsigned; a digest now counts in a drift vote only with the
answering peer's signature over (run, step, digest), so a vote can be attributed to (and
checked against the admission of) one identity, and replayed into no other run or step. Pure
functions on bytes; decoders raise ``Rejected``, encoders ``EncodeError``.
"""

from __future__ import annotations

import enum
import struct

from distronet.protocol.errors import RejectCode, Rejected, require_size
from distronet.protocol.framing import EncodeError
from distronet.protocol.identity import SIGNATURE_BYTES, Identity, verify
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "DIGEST_ANSWER_BYTES",
    "DIGEST_BYTES",
    "DIGEST_MAGIC",
    "DIGEST_PROTOCOL",
    "DIGEST_REQUEST_BYTES",
    "DIGEST_STATUS_MEANING",
    "DIGEST_VERSION",
    "DigestStatus",
    "decode_digest_request",
    "decode_digest_status",
    "digest_signing_bytes",
    "encode_digest_answer",
    "encode_digest_request",
    "open_digest_answer",
]

DIGEST_VERSION = 2
DIGEST_PROTOCOL = f"/distronet/digest/{DIGEST_VERSION}"
DIGEST_MAGIC = b"DND?"
DIGEST_REQUEST_BYTES = 12
DIGEST_BYTES = 32
DIGEST_ANSWER_BYTES = DIGEST_BYTES + SIGNATURE_BYTES  # what follows a FOUND status
_DOMAIN = b"distronet/digest/v2\x00"
_REQUEST = struct.Struct(">4sQ")


class DigestStatus(enum.IntEnum):
    """The answer's first byte. Values are on the wire: never renumber."""

    FOUND = 0
    UNKNOWN = 1


DIGEST_STATUS_MEANING: dict[DigestStatus, str] = {
    DigestStatus.FOUND: "the 32-byte BLAKE3 digest of the server's parameters after step follows, "
    "then the server's 64-byte Ed25519 signature over it",
    DigestStatus.UNKNOWN: "the server holds no digest of that step (too old, or not reached in time)",
}


def encode_digest_request(step: int, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The 12 request bytes. Raises EncodeError for a step outside 0..max_step."""
    if not 0 <= step <= limits.max_step:
        raise EncodeError(f"digest request for step {step}")
    return _REQUEST.pack(DIGEST_MAGIC, step)


def decode_digest_request(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> int:
    """The step asked for. Raises Rejected: TRUNCATED (short), MALFORMED (long, bad magic, a
    step over ``max_step``)."""
    require_size(data, DIGEST_REQUEST_BYTES, "digest request")
    magic, step = _REQUEST.unpack(data)
    if magic != DIGEST_MAGIC:
        raise Rejected(RejectCode.MALFORMED, f"digest request magic {magic!r}")
    if step > limits.max_step:
        raise Rejected(RejectCode.MALFORMED, f"digest request for step {step}", step=step)
    return int(step)


def digest_signing_bytes(run: str, step: int, digest: bytes) -> bytes:
    """``"distronet/digest/v2" 00 | u8 len(run) | run | u64 step | digest (32)``. Raises
    EncodeError for a run id over 255 bytes or a step outside u64."""
    r = run.encode()
    if len(r) > 255 or not 0 <= step < 2**64:
        raise EncodeError(f"digest of run {run[:40]!r} step {step}")
    return b"".join((_DOMAIN, struct.pack(">B", len(r)), r, struct.pack(">Q", step), digest))


def encode_digest_answer(digest: bytes | None, *, identity: Identity | None, run: str, step: int) -> bytes:
    """FOUND, the digest and ``identity``'s signature over (run, step, digest); UNKNOWN for a
    digest or identity of None. Raises EncodeError for a digest not 32 bytes."""
    if digest is None or identity is None:
        return bytes([DigestStatus.UNKNOWN])
    if len(digest) != DIGEST_BYTES:
        raise EncodeError(f"a digest is {DIGEST_BYTES} bytes, got {len(digest)}")
    return bytes([DigestStatus.FOUND]) + digest + identity.sign(digest_signing_bytes(run, step, digest))


def open_digest_answer(body: bytes, *, sender: bytes, run: str, step: int) -> bytes:
    """The digest from the ``DIGEST_ANSWER_BYTES`` that follow FOUND, once ``sender``'s (38-byte
    peer id) signature over (run, step, digest) verifies. Raises Rejected: TRUNCATED/MALFORMED
    (size), BAD_SIGNATURE."""
    require_size(body, DIGEST_ANSWER_BYTES, "digest answer")
    digest, sig = bytes(body[:DIGEST_BYTES]), bytes(body[DIGEST_BYTES:])
    if not verify(sender, digest_signing_bytes(run, step, digest), sig):
        raise Rejected(RejectCode.BAD_SIGNATURE, f"digest answer for step {step}", step=step)
    return digest


def decode_digest_status(head: bytes) -> DigestStatus:
    """The answer's status byte; FOUND means ``DIGEST_BYTES`` more follow. Raises Rejected:
    TRUNCATED (no byte), MALFORMED (more than one, or an unknown status)."""
    if len(head) != 1:
        code = RejectCode.TRUNCATED if not head else RejectCode.MALFORMED
        raise Rejected(code, f"digest answer status of {len(head)} bytes")
    try:
        return DigestStatus(head[0])
    except ValueError:
        raise Rejected(RejectCode.MALFORMED, f"digest status {head[0]}") from None
