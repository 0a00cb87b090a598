"""The manifest-ask protocol, version 1: three questions about rounds (docs/protocol.md §14.3).

One request per stream, one answer, then the server closes::

    request   u8[4] tag | u64 step                                  12 bytes
    answer    u32 n | n bytes                                       n <= max_manifest_answer_bytes

The tag (``AskKind``) picks the question; the answer's n bytes are, for ``SEALED`` and
``DECIDED``, a round manifest's bytes (``manifest``; opened and checked like a gossiped one) or
``GONE``, and for ``NEWEST`` a u64 step. n = 0 means "none": nothing sealed or decided for that
step (yet), no step yet, or a request the server did not understand. Pure functions on bytes;
decoders raise ``Rejected``, encoders ``EncodeError``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from distronet.protocol.errors import RejectCode, Rejected, require_size
from distronet.protocol.framing import EncodeError
from distronet.protocol.limits import DEFAULT_LIMITS, DEFAULT_STREAM_LIMITS, Limits, StreamLimits

__all__ = [
    "ASK_ANSWER_HEADER_BYTES",
    "ASK_KIND_MEANING",
    "ASK_REQUEST_BYTES",
    "GONE",
    "MANIFEST_ASK_PROTOCOL",
    "MANIFEST_ASK_VERSION",
    "AskKind",
    "AskRequest",
    "decode_answer_length",
    "decode_ask",
    "decode_newest",
    "encode_answer",
    "encode_ask",
    "encode_newest",
]

MANIFEST_ASK_VERSION = 1
MANIFEST_ASK_PROTOCOL = f"/distronet/manifest/{MANIFEST_ASK_VERSION}"
ASK_REQUEST_BYTES = 12
ASK_ANSWER_HEADER_BYTES = 4
GONE = b"G"
"""A ``DECIDED`` answer's body when the step is older than the server's retention window."""
_REQUEST = struct.Struct(">4sQ")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class AskKind(enum.Enum):
    """The request's tag. Values are on the wire: never change them."""

    SEALED = b"DNM?"
    NEWEST = b"DNN?"
    DECIDED = b"DNR?"


ASK_KIND_MEANING: dict[AskKind, str] = {
    AskKind.SEALED: "the manifest the server sealed as leader of step; n = 0: none",
    AskKind.NEWEST: "the newest step the server has opened (step field 0); n = 0: none yet",
    AskKind.DECIDED: "the manifest the server adopted for step; n = 0: not decided (yet); GONE: too old",
}


@dataclass(frozen=True)
class AskRequest:
    kind: AskKind
    step: int


def encode_ask(kind: AskKind, step: int = 0, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The 12 request bytes. Raises EncodeError for a step outside 0..max_step, or a NEWEST
    request with a step."""
    if not 0 <= step <= limits.max_step or (kind is AskKind.NEWEST and step):
        raise EncodeError(f"a {kind.name} ask cannot carry step {step}")
    return _REQUEST.pack(kind.value, step)


def decode_ask(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> AskRequest:
    """Parse a request. Raises Rejected: TRUNCATED (short), MALFORMED (long, unknown tag, a step
    over ``max_step``, a NEWEST request with a step)."""
    require_size(data, ASK_REQUEST_BYTES, "manifest ask")
    tag, step = _REQUEST.unpack(data)
    try:
        kind = AskKind(tag)
    except ValueError:
        raise Rejected(RejectCode.MALFORMED, f"manifest ask tag {tag!r}") from None
    if step > limits.max_step or (kind is AskKind.NEWEST and step):
        raise Rejected(RejectCode.MALFORMED, f"manifest ask {kind.name} with step {step}", step=step)
    return AskRequest(kind, step)


def encode_answer(body: bytes, *, limits: StreamLimits = DEFAULT_STREAM_LIMITS) -> bytes:
    """``u32 n | body``. Raises EncodeError for a body over ``max_manifest_answer_bytes``."""
    if len(body) > limits.max_manifest_answer_bytes:
        raise EncodeError(f"a manifest-ask answer of {len(body)} bytes is over its limit")
    return _U32.pack(len(body)) + body


def decode_answer_length(head: bytes, *, limits: StreamLimits = DEFAULT_STREAM_LIMITS) -> int:
    """n from the 4 answer-header bytes, checked before the body is read. Raises Rejected:
    TRUNCATED/MALFORMED (not 4 bytes), TOO_LARGE (over ``max_manifest_answer_bytes``)."""
    if len(head) != ASK_ANSWER_HEADER_BYTES:
        code = RejectCode.TRUNCATED if len(head) < ASK_ANSWER_HEADER_BYTES else RejectCode.MALFORMED
        raise Rejected(code, f"manifest-ask answer header of {len(head)} bytes")
    (n,) = _U32.unpack(head)
    if n > limits.max_manifest_answer_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"manifest-ask answer of {n} bytes")
    return int(n)


def encode_newest(step: int, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """A NEWEST answer's body: 8 bytes, or empty for a step < 0 (none yet) or over ``max_step``."""
    return _U64.pack(step) if 0 <= step <= limits.max_step else b""


def decode_newest(body: bytes, *, limits: Limits = DEFAULT_LIMITS) -> int:
    """The step in a NEWEST answer's body; -1 for an empty one (none yet). Raises Rejected
    MALFORMED for a body neither 0 nor 8 bytes, or a step over ``max_step``."""
    if not body:
        return -1
    if len(body) != 8:
        raise Rejected(RejectCode.MALFORMED, f"a newest-step answer of {len(body)} bytes")
    (step,) = _U64.unpack(body)
    if step > limits.max_step:
        raise Rejected(RejectCode.MALFORMED, f"newest step {step}", step=step)
    return int(step)
