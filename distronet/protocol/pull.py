"""The pull protocol, version 1: content by sha256 over a direct stream (docs/protocol.md §14.2).

Requests follow one another on one stream; each is answered before the next is read::

    request   b"DNP1" | sha256 (32) | u64 max_bytes                 44 bytes
    response  u8 status | u64 size | size bytes (status OK only)     9 + size bytes

``/distronet/pull/1`` carries step-packet frames; ``/distronet/state/1`` (state chunks, see
``state``) speaks the same wire. ``max_bytes`` is the most the asker will read: a server only
compares it with the size it holds (it allocates nothing by it), and the asker refuses a
declared size over it before reading a byte of the body. Pure functions on bytes; every
decoder raises ``Rejected``, every encoder ``EncodeError``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from distronet.protocol.errors import RejectCode, Rejected, require_size
from distronet.protocol.framing import EncodeError

__all__ = [
    "PULL_HEADER_BYTES",
    "PULL_MAGIC",
    "PULL_PROTOCOL",
    "PULL_REQUEST_BYTES",
    "PULL_STATUS_MEANING",
    "PULL_VERSION",
    "PullHeader",
    "PullRequest",
    "PullStatus",
    "decode_pull_header",
    "decode_pull_request",
    "encode_pull_header",
    "encode_pull_request",
]

PULL_VERSION = 1
PULL_PROTOCOL = f"/distronet/pull/{PULL_VERSION}"
PULL_MAGIC = b"DNP1"
PULL_REQUEST_BYTES = 44
PULL_HEADER_BYTES = 9
_REQUEST = struct.Struct(">4s32sQ")
_HEADER = struct.Struct(">BQ")
_U64_MAX = (1 << 64) - 1


class PullStatus(enum.IntEnum):
    """The first byte of a pull response. Values are on the wire: never renumber."""

    OK = 0
    NOT_FOUND = 1
    TOO_LARGE = 2
    PRUNED = 3


PULL_STATUS_MEANING: dict[PullStatus, str] = {
    PullStatus.OK: "the content follows: exactly size bytes whose sha256 is the one asked for",
    PullStatus.NOT_FOUND: "the server never held this content (as far as it remembers); size is 0",
    PullStatus.TOO_LARGE: "the server holds it, but its size (given) is over the asker's max_bytes",
    PullStatus.PRUNED: "the server held it and dropped it (past its retention); size is 0",
}


@dataclass(frozen=True)
class PullRequest:
    digest: bytes
    """sha256 of the content asked for (32 bytes)."""
    max_bytes: int
    """The largest body the asker will read."""


@dataclass(frozen=True)
class PullHeader:
    status: PullStatus
    size: int
    """Bytes of content that follow (OK), the content's size (TOO_LARGE), else 0."""


def encode_pull_request(digest: bytes, max_bytes: int) -> bytes:
    """The 44 request bytes. Raises EncodeError for a digest not 32 bytes or max_bytes not a u64."""
    if len(digest) != 32 or not 0 <= max_bytes <= _U64_MAX:
        raise EncodeError(
            f"a pull request takes a 32-byte sha256 and a u64 max_bytes, got {len(digest)} bytes"
        )
    return _REQUEST.pack(PULL_MAGIC, digest, max_bytes)


def decode_pull_request(data: bytes) -> PullRequest:
    """Parse one request. Raises Rejected: TRUNCATED (short), MALFORMED (long, or bad magic)."""
    require_size(data, PULL_REQUEST_BYTES, "pull request")
    magic, digest, max_bytes = _REQUEST.unpack(data)
    if magic != PULL_MAGIC:
        raise Rejected(RejectCode.MALFORMED, f"pull request magic {magic!r}")
    return PullRequest(digest, max_bytes)


def encode_pull_header(status: PullStatus, size: int) -> bytes:
    """The 9 header bytes of a response. Raises EncodeError for a size not a u64."""
    if not 0 <= size <= _U64_MAX:
        raise EncodeError(f"pull response size {size} is not a u64")
    return _HEADER.pack(int(status), size)


def decode_pull_header(data: bytes, *, max_bytes: int, expected_size: int | None = None) -> PullHeader:
    """Parse a response header against the request's ``max_bytes`` (and the size the content was
    announced with, when known), before any byte of the body is read.

    Returns the header for OK (``size`` <= ``max_bytes``), NOT_FOUND and PRUNED. Raises Rejected:
    TRUNCATED/MALFORMED (not 9 bytes), MALFORMED (unknown status; NOT_FOUND or PRUNED with a
    size; OK with a size other than ``expected_size``), TOO_LARGE (status TOO_LARGE, or OK with
    a size over ``max_bytes``).
    """
    require_size(data, PULL_HEADER_BYTES, "pull response header")
    raw_status, size = _HEADER.unpack(data)
    try:
        status = PullStatus(raw_status)
    except ValueError:
        raise Rejected(RejectCode.MALFORMED, f"pull status {raw_status}") from None
    if status in (PullStatus.NOT_FOUND, PullStatus.PRUNED):
        if size:
            raise Rejected(RejectCode.MALFORMED, f"pull status {status.name} with size {size}")
        return PullHeader(status, 0)
    if status is PullStatus.TOO_LARGE or size > max_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"payload of {size} > {max_bytes} bytes")
    if expected_size is not None and size != expected_size:
        raise Rejected(RejectCode.MALFORMED, f"declared {size} bytes, announced {expected_size}")
    return PullHeader(status, size)
