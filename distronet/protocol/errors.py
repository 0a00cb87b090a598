"""The project's error tree, rooted in one error, and the enumerated rejection codes.

    DistroError                      every error this project raises on purpose
    ├── ProtocolError                a message broke the wire protocol
    │   └── Rejected                 a peer's message refused; carries a RejectCode
    ├── KernelError                  bad arguments to a numeric kernel (shapes, k, chunk)
    ├── ConfigError                  a configuration value a user gave is invalid
    └── (each package adds its own subtree: CoordinatorError, NodeError, ...)

Errors carry context (run id, peer id, step) where they have it, and the message says what
to do next when a user can act on it.
"""

from __future__ import annotations

import enum

__all__ = [
    "REJECT_MEANING",
    "ConfigError",
    "DistroError",
    "KernelError",
    "ProtocolError",
    "RejectCode",
    "Rejected",
    "require_size",
]


class DistroError(Exception):
    """Root of every error distro-node raises on purpose."""


class ProtocolError(DistroError):
    """A message broke the wire protocol."""


class KernelError(DistroError, ValueError):
    """Bad arguments to a numeric kernel: a shape, chunk size, k or coding it cannot handle."""


class ConfigError(DistroError, ValueError):
    """A configuration value given by a user or an operator is invalid."""


class RejectCode(enum.IntEnum):
    """Why a peer's message was refused. Values are on the wire and in metrics: never renumber."""

    MALFORMED = 1
    TRUNCATED = 2
    TOO_LARGE = 3
    DECOMPRESSION_BOMB = 4
    UNSUPPORTED_VERSION = 5
    BAD_SIGNATURE = 6
    WRONG_RUN = 7
    LAYOUT_MISMATCH = 8
    INDEX_OUT_OF_RANGE = 9
    DUPLICATE_INDEX = 10
    NON_FINITE_VALUE = 11
    LIMIT_EXCEEDED = 12
    STALE_STEP = 13
    UNKNOWN_PEER = 14
    WRONG_PEER = 15
    NOT_ADMITTED = 16
    OFF_PLAN = 17


REJECT_MEANING: dict[RejectCode, str] = {
    RejectCode.MALFORMED: "not a well-formed message: bad encoding, missing field or wrong field type",
    RejectCode.TRUNCATED: "the frame ends before the lengths it declares",
    RejectCode.TOO_LARGE: "a byte size, actual or declared, is over its limit",
    RejectCode.DECOMPRESSION_BOMB: "the compressed body expands past the decompressed-size limit",
    RejectCode.UNSUPPORTED_VERSION: "a schema version this node does not speak",
    RejectCode.BAD_SIGNATURE: "the signature does not verify against the sender's peer id",
    RejectCode.WRONG_RUN: "the message belongs to another run",
    RejectCode.LAYOUT_MISMATCH: "the tensor layout digest or a tensor's shape differs from the run's",
    RejectCode.INDEX_OUT_OF_RANGE: "a coefficient index is outside its chunk",
    RejectCode.DUPLICATE_INDEX: "a coefficient index appears twice in one chunk",
    RejectCode.NON_FINITE_VALUE: "a value or scale is NaN or infinite",
    RejectCode.LIMIT_EXCEEDED: "a count (tensors, chunks, k, dimensions) is over its limit",
    RejectCode.STALE_STEP: "the step is outside the window this node accepts",
    RejectCode.UNKNOWN_PEER: "the sender is not a member of the run",
    RejectCode.WRONG_PEER: "the peer id in the message differs from the connection's peer",
    RejectCode.NOT_ADMITTED: "the sender shows no valid, unexpired credential of the run's coordinator",
    RejectCode.OFF_PLAN: "the packet's tensor set, k or value/index coding differs from the run's plan",
}


class Rejected(ProtocolError):
    """A peer's message refused. ``code`` says why; ``detail`` says where (field, value, limit)."""

    def __init__(
        self,
        code: RejectCode,
        detail: str = "",
        *,
        run_id: str | None = None,
        peer_id: str | None = None,
        step: int | None = None,
    ) -> None:
        self.code = code
        self.detail = detail
        self.run_id = run_id
        self.peer_id = peer_id
        self.step = step
        ctx = ", ".join(
            f"{k}={v}" for k, v in (("run", run_id), ("peer", peer_id), ("step", step)) if v is not None
        )
        msg = f"rejected ({code.name}): {REJECT_MEANING[code]}"
        if detail:
            msg += f" — {detail}"
        if ctx:
            msg += f" [{ctx}]"
        super().__init__(msg)


def require_size(data: bytes, size: int, what: str) -> None:
    """Refuse a fixed-size message of any other length: TRUNCATED when short, MALFORMED when long."""
    if len(data) != size:
        code = RejectCode.TRUNCATED if len(data) < size else RejectCode.MALFORMED
        raise Rejected(code, f"{what} of {len(data)} bytes; it is {size}")
