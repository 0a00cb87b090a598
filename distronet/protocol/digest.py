"""The digest protocol, version 1: a peer's parameter digest after one step (docs/protocol.md §14.4).

One request per stream, one answer, then the server closes::

    request   b"DND?" | u64 step                                    12 bytes
    answer    u8 status | 32-byte BLAKE3 digest (FOUND only)        1 or 33 bytes

The answer is not signed: the stream's peer is authenticated by libp2p (Noise), and a digest
only decides whether the asker resyncs (``node/catchup/digests.py``). Pure functions on bytes;
decoders raise ``Rejected``, encoders ``EncodeError``.
"""

from __future__ import annotations

import enum
import struct

from distronet.protocol.errors import RejectCode, Rejected, require_size
from distronet.protocol.framing import EncodeError
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "DIGEST_BYTES",
    "DIGEST_MAGIC",
    "DIGEST_PROTOCOL",
    "DIGEST_REQUEST_BYTES",
    "DIGEST_STATUS_MEANING",
    "DIGEST_VERSION",
    "DigestStatus",
    "decode_digest_request",
    "decode_digest_status",
    "encode_digest_answer",
    "encode_digest_request",
]

DIGEST_VERSION = 1
DIGEST_PROTOCOL = f"/distronet/digest/{DIGEST_VERSION}"
DIGEST_MAGIC = b"DND?"
DIGEST_REQUEST_BYTES = 12
DIGEST_BYTES = 32
_REQUEST = struct.Struct(">4sQ")


class DigestStatus(enum.IntEnum):
    """The answer's first byte. Values are on the wire: never renumber."""

    FOUND = 0
    UNKNOWN = 1


DIGEST_STATUS_MEANING: dict[DigestStatus, str] = {
    DigestStatus.FOUND: "the 32-byte BLAKE3 digest of the server's parameters after step follows",
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


def encode_digest_answer(digest: bytes | None) -> bytes:
    """FOUND and the digest, or UNKNOWN for None. Raises EncodeError for a digest not 32 bytes."""
    if digest is None:
        return bytes([DigestStatus.UNKNOWN])
    if len(digest) != DIGEST_BYTES:
        raise EncodeError(f"a digest is {DIGEST_BYTES} bytes, got {len(digest)}")
    return bytes([DigestStatus.FOUND]) + digest


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
