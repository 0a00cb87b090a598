"""The state protocols: a donor's signed state manifest and its chunks (docs/protocol.md §14.5).

``/distronet/state-manifest/2`` — one request per stream, one answer, then the server closes::

    request   b"DNS2" | u64 at                                      12 bytes
    answer    u8 status | u32 n | n bytes of msgpack manifest       n = 0 unless OFFERED

``at`` names the step of the state wanted (0: the one held now): donors that step apart meet
at one step, so a quorum of them can agree on one state (``catchup/statesync.py``).

``/distronet/state/1`` — the chunks, by sha256, on the pull wire (``pull``).

The manifest is a msgpack map ``v, run, step, size, sha, chunk, chunks, peer, sig``: the blob's
step, size and sha256, the chunk size, the sha256 of each chunk in order, and the donor's
Ed25519 signature over :func:`state_signing_bytes`. Pure functions on bytes; decoders raise
``Rejected``, encoders ``EncodeError``.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import EncodeError
from distronet.protocol.identity import (
    SIGNATURE_BYTES,
    Identity,
    is_ed25519_peer_id,
    peer_id_to_b58,
    verify,
)
from distronet.protocol.limits import DEFAULT_LIMITS, DEFAULT_STREAM_LIMITS, Limits, StreamLimits

__all__ = [
    "STATE_ANSWER_HEADER_BYTES",
    "STATE_ASK",
    "STATE_ASK_BYTES",
    "STATE_MANIFEST_PROTOCOL",
    "STATE_MANIFEST_VERSION",
    "STATE_PULL_PROTOCOL",
    "STATE_STATUS_MEANING",
    "STATE_VERSION",
    "StateManifest",
    "StateStatus",
    "decode_state_answer_length",
    "decode_state_ask",
    "encode_state_answer",
    "encode_state_ask",
    "open_state_manifest",
    "seal_state_manifest",
    "state_signing_bytes",
]

STATE_VERSION = 1
STATE_MANIFEST_VERSION = 2  # 2: the ask names the step wanted (a rendezvous); 1 asked for "now"
STATE_MANIFEST_PROTOCOL = f"/distronet/state-manifest/{STATE_MANIFEST_VERSION}"
STATE_PULL_PROTOCOL = f"/distronet/state/{STATE_VERSION}"
STATE_ASK = b"DNS2"  # the ask's magic; a u64 step follows (``encode_state_ask``)
STATE_ASK_BYTES = len(STATE_ASK) + 8
MAX_ASK_STEP = 2**63 - 1
STATE_ANSWER_HEADER_BYTES = 5
_DOMAIN = b"distronet/state/v1\x00"
_KEYS = frozenset({"v", "run", "step", "size", "sha", "chunk", "chunks", "peer", "sig"})
_HEADER = struct.Struct(">BI")


class StateStatus(enum.IntEnum):
    """The answer's first byte. Values are on the wire: never renumber."""

    OFFERED = 0
    NONE = 1


STATE_STATUS_MEANING: dict[StateStatus, str] = {
    StateStatus.OFFERED: "a signed state manifest of n bytes follows",
    StateStatus.NONE: "the server offers no state now; n is 0",
}


@dataclass(frozen=True)
class StateManifest:
    run_id: str
    step: int
    size: int
    sha256: bytes
    chunk_bytes: int
    chunks: tuple[bytes, ...]
    peer_id: bytes
    signature: bytes

    @property
    def root(self) -> tuple[int, bytes]:
        """What donors must agree on: (step, sha256 of the blob)."""
        return self.step, self.sha256

    def chunk_size(self, i: int) -> int:
        return min(self.chunk_bytes, self.size - i * self.chunk_bytes)


def state_signing_bytes(
    run: str, step: int, size: int, sha: bytes, chunk: int, chunks: Sequence[bytes]
) -> bytes:
    """``"distronet/state/v1" 00 | u8 len(run) | run | u64 step | u64 size | sha (32) |
    u64 chunk | u32 len(chunks) | chunks (32 each)``."""
    r = run.encode()
    return b"".join((_DOMAIN, struct.pack(">B", len(r)), r, struct.pack(">QQ", step, size), sha,
                     struct.pack(">QI", chunk, len(chunks)), *chunks))  # fmt: skip


def seal_state_manifest(
    identity: Identity,
    run_id: str,
    step: int,
    blob: bytes | memoryview,
    chunk_bytes: int,
    chunks: Sequence[bytes],
    *,
    limits: StreamLimits = DEFAULT_STREAM_LIMITS,
) -> tuple[StateManifest, bytes]:
    """Sign a state of ``blob`` (``chunks``: the sha256 of each ``chunk_bytes`` slice, in order);
    returns the manifest and its wire bytes. Raises EncodeError when it breaks a limit.
    Cost: one sha256 pass over ``blob``."""
    n = -(-len(blob) // chunk_bytes) if chunk_bytes > 0 else 0
    ok = len(blob) > 0 and 0 < chunk_bytes <= limits.max_state_chunk_bytes and n == len(chunks)
    if not ok or n > limits.max_state_chunks:
        raise EncodeError(
            f"a state of {len(blob)} bytes in {len(chunks)} chunks of {chunk_bytes} breaks the state limits"
        )
    sha = hashlib.sha256(blob).digest()
    tchunks = tuple(chunks)
    sig = identity.sign(state_signing_bytes(run_id, step, len(blob), sha, chunk_bytes, tchunks))
    body = {"v": STATE_VERSION, "run": run_id, "step": step, "size": len(blob), "sha": sha,
            "chunk": chunk_bytes, "chunks": list(tchunks), "peer": identity.peer_id, "sig": sig}  # fmt: skip
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    if len(packed) > limits.max_state_manifest_bytes:
        raise EncodeError(f"a state manifest of {len(packed)} bytes is over its limit")
    return StateManifest(run_id, step, len(blob), sha, chunk_bytes, tchunks, identity.peer_id, sig), packed


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a map key repeats")
    return out


def _is_int(x: object, hi: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= hi


def open_state_manifest(
    data: bytes,
    *,
    run_id: str,
    sender: bytes,
    limits: StreamLimits = DEFAULT_STREAM_LIMITS,
    wire_limits: Limits = DEFAULT_LIMITS,
) -> StateManifest:
    """Decode and verify a state manifest that the peer ``sender`` (38-byte id) sent.

    Raises Rejected: TOO_LARGE (over ``max_state_manifest_bytes``, or a chunk size over
    ``max_state_chunk_bytes``), MALFORMED (msgpack, fields, types, a chunk count that does not
    match size and chunk), UNSUPPORTED_VERSION, LIMIT_EXCEEDED (over ``max_state_chunks``),
    WRONG_RUN, WRONG_PEER, BAD_SIGNATURE — in that order, so no signature work is spent on a
    manifest that breaks a cheaper rule.
    """
    who = peer_id_to_b58(sender) if is_ed25519_peer_id(sender) else None
    if len(data) > limits.max_state_manifest_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"state manifest of {len(data)} bytes", peer_id=who)
    try:
        m = msgpack.unpackb(
            data, raw=False, strict_map_key=True, max_array_len=limits.max_state_chunks, max_map_len=16,
            max_bin_len=64, max_str_len=4 * wire_limits.max_run_id_len, max_ext_len=0,
            object_pairs_hook=_unique_keys,
        )  # fmt: skip
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        code = RejectCode.LIMIT_EXCEEDED if "max_array_len" in str(e) else RejectCode.MALFORMED
        raise Rejected(code, f"state manifest: {str(e)[:120]}", peer_id=who) from None
    if not isinstance(m, dict) or m.keys() != _KEYS:
        raise Rejected(RejectCode.MALFORMED, "state manifest fields", peer_id=who)
    if not _is_int(m["v"], 255):
        raise Rejected(RejectCode.MALFORMED, "state manifest version", peer_id=who)
    if m["v"] != STATE_VERSION:
        raise Rejected(RejectCode.UNSUPPORTED_VERSION, f"state manifest v{m['v']}", peer_id=who)
    step, size, chunk, chunks = m["step"], m["size"], m["chunk"], m["chunks"]
    if not all(_is_int(x, wire_limits.max_step) for x in (step, size, chunk)) or not size or not chunk:
        raise Rejected(RejectCode.MALFORMED, "state manifest numbers", peer_id=who)
    if chunk > limits.max_state_chunk_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"state chunks of {chunk} bytes", peer_id=who, step=step)
    n = -(-size // chunk)
    if n > limits.max_state_chunks:
        raise Rejected(RejectCode.LIMIT_EXCEEDED, f"a state of {n} chunks", peer_id=who, step=step)
    if not isinstance(chunks, list) or len(chunks) != n:
        raise Rejected(RejectCode.MALFORMED, "state manifest chunk count", peer_id=who, step=step)
    if not all(isinstance(c, bytes) and len(c) == 32 for c in [*chunks, m["sha"]]):
        raise Rejected(RejectCode.MALFORMED, "state manifest hashes", peer_id=who, step=step)
    peer, sig, run = m["peer"], m["sig"], m["run"]
    if not isinstance(run, str) or not is_ed25519_peer_id(peer) or not isinstance(sig, bytes):
        raise Rejected(RejectCode.MALFORMED, "state manifest run, peer or signature", peer_id=who, step=step)
    if run != run_id:
        raise Rejected(RejectCode.WRONG_RUN, f"state of run {run!r}", peer_id=who, step=step)
    if peer != sender:
        raise Rejected(
            RejectCode.WRONG_PEER, "state manifest signed for another peer", peer_id=who, step=step
        )
    signed = state_signing_bytes(run_id, step, size, m["sha"], chunk, chunks)
    if len(sig) != SIGNATURE_BYTES or not verify(peer, signed, sig):
        raise Rejected(RejectCode.BAD_SIGNATURE, "state manifest", peer_id=who, step=step)
    return StateManifest(run_id, step, size, m["sha"], chunk, tuple(chunks), peer, sig)


def encode_state_ask(at: int = 0) -> bytes:
    """The ask for the state at step ``at`` (0: the state the donor holds now). Raises
    EncodeError for a step outside 0 … 2^63 − 1."""
    if not 0 <= at <= MAX_ASK_STEP:
        raise EncodeError(f"state ask for step {at}")
    return STATE_ASK + struct.pack(">Q", at)


def decode_state_ask(data: bytes) -> int:
    """The step a request asks for (0: now). Raises Rejected: TRUNCATED (short), MALFORMED
    (long, not ``STATE_ASK``, or a step over 2^63 − 1)."""
    if len(data) < STATE_ASK_BYTES:
        raise Rejected(RejectCode.TRUNCATED, f"state ask of {len(data)} bytes")
    if len(data) != STATE_ASK_BYTES or data[: len(STATE_ASK)] != STATE_ASK:
        raise Rejected(RejectCode.MALFORMED, "not a state ask")
    (at,) = struct.unpack(">Q", data[len(STATE_ASK) :])
    if at > MAX_ASK_STEP:
        raise Rejected(RejectCode.MALFORMED, f"state ask for step {at}")
    return int(at)


def encode_state_answer(packed: bytes | None, *, limits: StreamLimits = DEFAULT_STREAM_LIMITS) -> bytes:
    """OFFERED with the manifest's bytes, or NONE for None. Raises EncodeError over the limit."""
    if packed is None:
        return _HEADER.pack(StateStatus.NONE, 0)
    if len(packed) > limits.max_state_manifest_bytes:
        raise EncodeError(f"a state manifest of {len(packed)} bytes is over its limit")
    return _HEADER.pack(StateStatus.OFFERED, len(packed)) + packed


def decode_state_answer_length(head: bytes, *, limits: StreamLimits = DEFAULT_STREAM_LIMITS) -> int | None:
    """n from the 5 answer-header bytes (None for NONE), checked before the body is read.
    Raises Rejected: TRUNCATED/MALFORMED (not 5 bytes), MALFORMED (unknown status, NONE with
    n != 0, OFFERED with n = 0), TOO_LARGE (n over ``max_state_manifest_bytes``)."""
    if len(head) != STATE_ANSWER_HEADER_BYTES:
        code = RejectCode.TRUNCATED if len(head) < STATE_ANSWER_HEADER_BYTES else RejectCode.MALFORMED
        raise Rejected(code, f"state answer header of {len(head)} bytes")
    raw_status, n = _HEADER.unpack(head)
    if raw_status not in (StateStatus.OFFERED, StateStatus.NONE):
        raise Rejected(RejectCode.MALFORMED, f"state answer status {raw_status}")
    if raw_status == StateStatus.NONE:
        if n:
            raise Rejected(RejectCode.MALFORMED, f"state answer NONE with n = {n}")
        return None
    if n > limits.max_state_manifest_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"state manifest of {n} bytes")
    if not n:
        raise Rejected(RejectCode.MALFORMED, "state answer OFFERED with n = 0")
    return int(n)
