"""The step packet: one peer's coded update for one step of one run, signed by its libp2p key.

Body (a msgpack map inside a ``MessageKind.STEP_PACKET`` frame, see framing.py)::

    "v"        int   schema version, 1
    "run"      str   run id, 1..64 of [A-Za-z0-9._-], first a letter or digit
    "step"     int   0 <= step <= 2**63 - 1
    "peer"     bin   38-byte Ed25519 libp2p peer id of the signer
    "layout"   bin   32-byte layout digest (layout.py)
    "payload"  bin   coded tensors (docs/protocol-payload.md); opaque here, size-checked
    "sig"      bin   64-byte Ed25519 signature of packet_signing_bytes(...) by "peer"

The signature binds every field and the payload through its SHA-256; the frame bytes around it
(compression, header) are not signed, so a relay may re-frame a packet without breaking it.

``open_packet`` checks, in this order, stopping at the first failure: frame and msgpack
structure (TOO_LARGE, TRUNCATED, DECOMPRESSION_BOMB, MALFORMED), ``v`` (UNSUPPORTED_VERSION),
every field's type and range (MALFORMED), payload size (TOO_LARGE), run id (WRONG_RUN), layout
digest (LAYOUT_MISMATCH), step window when ``current_step`` is given (STALE_STEP), sender when
``expected_peer`` is given (WRONG_PEER), then the signature (BAD_SIGNATURE). Context (run, peer,
step) on a Rejected raised before the signature check is what the packet claims, unverified.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import (
    EncodeError,
    MessageKind,
    decode_frame,
    encode_frame,
    take_bin,
    take_int,
)
from distronet.protocol.identity import (
    PEER_ID_BYTES,
    SIGNATURE_BYTES,
    Identity,
    is_ed25519_peer_id,
    verify,
)
from distronet.protocol.identity import peer_id_to_b58 as _b58
from distronet.protocol.layout import LAYOUT_DIGEST_BYTES
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "PACKET_DOMAIN",
    "PACKET_VERSION",
    "StepPacket",
    "check_run_id",
    "open_packet",
    "packet_signing_bytes",
    "seal_packet",
]

PACKET_VERSION = 1
PACKET_DOMAIN = b"distronet/step-packet/v1\x00"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_KEYS = frozenset({"v", "run", "step", "peer", "layout", "payload", "sig"})


@dataclass(frozen=True)
class StepPacket:
    """An opened (verified) step packet. ``payload`` is the coded tensors, still encoded."""

    version: int
    run_id: str
    step: int
    peer_id: bytes
    layout_digest: bytes
    payload: bytes
    signature: bytes

    @property
    def peer_id_b58(self) -> str:
        """The sender's peer id as libp2p prints it."""
        return _b58(self.peer_id)

    @property
    def payload_sha256(self) -> bytes:
        """SHA-256 of the payload (what the signature binds)."""
        return hashlib.sha256(self.payload).digest()


_verify = verify  # by libsodium (``identity.verify``); a module-level name so a benchmark can swap it


def check_run_id(run_id: object, limits: Limits = DEFAULT_LIMITS) -> bool:
    """True when ``run_id`` is a valid run id: 1..max_run_id_len of ``[A-Za-z0-9._-]``, first alnum."""
    return (
        isinstance(run_id, str)
        and 0 < len(run_id) <= limits.max_run_id_len
        and _RUN_ID.fullmatch(run_id) is not None
    )


def take_signed_header(
    m: dict, *, version: int, keys: frozenset[str], what: str, limits: Limits
) -> tuple[str, int, bytes]:
    """Check the fields every signed message starts with; return ``(run, step, peer)``.

    ``m`` is a decoded frame body. Checks, in order: ``v`` is an int equal to ``version``
    (UNSUPPORTED_VERSION otherwise), the key set is exactly ``keys``, ``run`` is a valid run id,
    ``step`` is in range, ``peer`` is an Ed25519 libp2p peer id. Raises ``Rejected`` (MALFORMED
    unless said otherwise). ``what`` names the message in errors ("step packet", "announcement").
    """
    v = m.get("v")
    if isinstance(v, bool) or not isinstance(v, int):
        raise Rejected(RejectCode.MALFORMED, "field 'v' must be an int")
    if v != version:
        raise Rejected(RejectCode.UNSUPPORTED_VERSION, f"{what} version {v}; this node speaks {version}")
    if m.keys() != keys:
        raise Rejected(RejectCode.MALFORMED, f"fields {sorted(m)}; expected {sorted(keys)}")
    run = m["run"]
    if not check_run_id(run, limits):
        raise Rejected(RejectCode.MALFORMED, "field 'run' is not a valid run id")
    step = take_int(m, "step", 0, limits.max_step)
    peer = take_bin(m, "peer", PEER_ID_BYTES, PEER_ID_BYTES)
    if not is_ed25519_peer_id(peer):
        raise Rejected(RejectCode.MALFORMED, "field 'peer' is not an Ed25519 libp2p peer id", step=step)
    return run, step, peer


def packet_signing_bytes(
    version: int,
    run_id: str,
    step: int,
    peer_id: bytes,
    layout_digest: bytes,
    payload_sha256: bytes,
    size: int,
) -> bytes:
    """The exact bytes a step packet's signature covers (integers big-endian)::

    PACKET_DOMAIN | u16 version | u8 len(run) | run (ASCII) | u64 step | u8 len(peer) | peer
                  | layout digest (32) | sha256(payload) (32) | u64 len(payload)
    """
    run = run_id.encode("ascii")
    return b"".join(
        (
            PACKET_DOMAIN,
            struct.pack(">HB", version, len(run)),
            run,
            struct.pack(">QB", step, len(peer_id)),
            peer_id,
            layout_digest,
            payload_sha256,
            struct.pack(">Q", size),
        )
    )


def seal_packet(
    identity: Identity,
    run_id: str,
    step: int,
    layout_digest: bytes,
    payload: bytes,
    *,
    limits: Limits = DEFAULT_LIMITS,
    level: int = 3,
) -> bytes:
    """Sign and frame a step packet; returns the frame bytes to send.

    Raises EncodeError when a field is invalid or the result would break ``limits`` (payload or
    frame size), so a node never sends what its peers must refuse. Cost: SHA-256 of the payload,
    one Ed25519 signature (~30 µs), msgpack + zstd level ``level`` of the payload.
    """
    if not check_run_id(run_id, limits):
        raise EncodeError(f"invalid run id {run_id!r}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= limits.max_step:
        raise EncodeError(f"step must be an int in [0, {limits.max_step}], got {step!r}")
    if not isinstance(layout_digest, bytes) or len(layout_digest) != LAYOUT_DIGEST_BYTES:
        raise EncodeError("layout digest must be 32 bytes")
    payload = bytes(payload)
    if len(payload) > limits.max_payload_bytes:
        raise EncodeError(
            f"payload of {len(payload)} bytes over max_payload_bytes {limits.max_payload_bytes}"
        )
    sha = hashlib.sha256(payload).digest()
    msg = packet_signing_bytes(
        PACKET_VERSION, run_id, step, identity.peer_id, layout_digest, sha, len(payload)
    )
    body = {
        "v": PACKET_VERSION,
        "run": run_id,
        "step": step,
        "peer": identity.peer_id,
        "layout": layout_digest,
        "payload": payload,
        "sig": identity.sign(msg),
    }
    frame = encode_frame(MessageKind.STEP_PACKET, body, compress=True, level=level)
    if len(frame) > limits.max_frame_bytes:
        raise EncodeError(f"frame of {len(frame)} bytes over max_frame_bytes {limits.max_frame_bytes}")
    return frame


def open_packet(
    frame: bytes,
    *,
    run_id: str,
    layout_digest: bytes,
    limits: Limits = DEFAULT_LIMITS,
    current_step: int | None = None,
    expected_peer: bytes | None = None,
) -> StepPacket:
    """Decode, validate and verify a step packet frame. Raises Rejected (see the module docstring).

    ``current_step``: when given, steps outside ``limits.step_in_window`` are STALE_STEP.
    ``expected_peer``: when given (e.g. the stream's remote peer), another signer is WRONG_PEER.
    The payload is returned still coded; decode it with ``distronet.kernels.coding``.
    Cost: bounded decompression (<= ``max_decompressed_bytes``), SHA-256 of the payload and one
    Ed25519 verification (~60 µs).
    """
    m = decode_frame(frame, MessageKind.STEP_PACKET, limits=limits)
    version = PACKET_VERSION
    run, step, peer = take_signed_header(m, version=version, keys=_KEYS, what="step packet", limits=limits)

    def reject(code: RejectCode, detail: str = "") -> Rejected:
        return Rejected(code, detail, run_id=run, peer_id=_b58(peer), step=step)

    digest = take_bin(m, "layout", LAYOUT_DIGEST_BYTES, LAYOUT_DIGEST_BYTES)
    sig = take_bin(m, "sig", SIGNATURE_BYTES, SIGNATURE_BYTES)
    payload = m["payload"]
    if not isinstance(payload, bytes):
        raise reject(RejectCode.MALFORMED, "field 'payload' must be bin")
    if len(payload) > limits.max_payload_bytes:
        raise reject(
            RejectCode.TOO_LARGE, f"payload of {len(payload)} bytes; limit {limits.max_payload_bytes}"
        )
    if run != run_id:
        raise reject(RejectCode.WRONG_RUN, f"expected run {run_id!r}")
    if digest != layout_digest:
        raise reject(RejectCode.LAYOUT_MISMATCH, "layout digest differs from this node's")
    if current_step is not None and not limits.step_in_window(step, current_step):
        window = f"-{limits.max_step_lag}/+{limits.max_step_lead}"
        raise reject(RejectCode.STALE_STEP, f"current step {current_step}, window {window}")
    if expected_peer is not None and peer != expected_peer:
        raise reject(RejectCode.WRONG_PEER, f"expected {_b58(expected_peer)}")
    msg = packet_signing_bytes(
        version, run, step, peer, digest, hashlib.sha256(payload).digest(), len(payload)
    )
    if not _verify(peer, msg, sig):
        raise reject(RejectCode.BAD_SIGNATURE)
    return StepPacket(version, run, step, peer, digest, payload, sig)
