"""The gossip announcement: "peer P has its step-S packet for run R; it is N bytes, hash H".

Gossip carries only these (gossipsub drops messages over 1 MiB; we keep to 1 KiB); the packet
itself is pulled over a stream, from the producer or from any peer that already has it, and the
puller checks the received frame's length and SHA-256 against the announcement before opening it.

Body (a msgpack map inside a raw ``MessageKind.ANNOUNCEMENT`` frame)::

    "v"      int        schema version, 1
    "run"    str        run id (as in a step packet)
    "step"   int        0 <= step <= 2**63 - 1
    "peer"   bin        38-byte Ed25519 peer id of the producer, who signs
    "sha"    bin        32-byte SHA-256 of the sealed step-packet frame (the exact bytes pulled)
    "size"   int        length of that frame in bytes, 1..max_frame_bytes
    "addrs"  array      0..4 multiaddr hints (str, "/"-prefixed printable ASCII, <= 256 bytes
                        each, <= 512 bytes together) where the frame can be pulled
    "sig"    bin        64-byte Ed25519 signature of announcement_signing_bytes(...)
    "warm"   true       OPTIONAL, present only when set: the producer is warming up (it adopted
                        the swarm's state a few steps ago); replicas leave its packet out of the
                        accepted set (the packet is masked) but count the producer as live
    "cred"   bin        OPTIONAL: the producer's membership credential (protocol/credential.py,
                        docs/protocol.md section 16), 141..204 bytes. Not covered by "sig": the
                        credential is signed by the coordinator and names the producer itself.
                        Replicas of a run whose coordinator has a key drop announcements
                        without a valid one (NOT_ADMITTED).

With these bounds the whole frame is at most ~820 bytes, under ``max_announcement_bytes`` (1024)
by construction (a credential adds up to ~200: with one, the address hints must leave room, or
sealing raises EncodeError); a frame over that limit is refused (TOO_LARGE) before it is parsed.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from distronet.protocol.credential import MAX_CREDENTIAL_BYTES, MIN_CREDENTIAL_BYTES
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.framing import (
    EncodeError,
    MessageKind,
    decode_frame,
    encode_frame,
    take_bin,
    take_int,
)
from distronet.protocol.identity import SIGNATURE_BYTES, Identity, verify
from distronet.protocol.identity import peer_id_to_b58 as _b58
from distronet.protocol.limits import DEFAULT_LIMITS, Limits
from distronet.protocol.packet import check_run_id, take_signed_header

__all__ = [
    "ANNOUNCE_DOMAIN",
    "ANNOUNCE_VERSION",
    "MAX_ADDRS",
    "MAX_ADDR_BYTES_TOTAL",
    "Announcement",
    "announcement_signing_bytes",
    "open_announcement",
    "seal_announcement",
]

ANNOUNCE_VERSION = 1
ANNOUNCE_DOMAIN = b"distronet/announce/v1\x00"
MAX_ADDRS = 4
MAX_ADDR_BYTES_TOTAL = 512
_ADDR = re.compile(r"/[\x21-\x7e]*")
_KEYS = frozenset({"v", "run", "step", "peer", "sha", "size", "addrs", "sig"})
_OPTIONAL = frozenset({"warm", "cred"})
WARMUP_FLAG = 0x01


@dataclass(frozen=True)
class Announcement:
    """An opened (verified) announcement of a step packet frame."""

    version: int
    run_id: str
    step: int
    peer_id: bytes
    packet_sha256: bytes
    packet_size: int
    addrs: tuple[str, ...]
    signature: bytes
    warmup: bool = False
    """The producer marks this packet as a warm-up packet: masked, never aggregated."""
    credential: bytes | None = None
    """The producer's membership credential as carried (unverified here: ``node.swarm.admission``)."""

    @property
    def peer_id_b58(self) -> str:
        """The producer's peer id as libp2p prints it."""
        return _b58(self.peer_id)

    def matches(self, frame: bytes) -> bool:
        """True when ``frame`` is the announced packet frame (same length and SHA-256)."""
        return len(frame) == self.packet_size and hashlib.sha256(frame).digest() == self.packet_sha256


def announcement_signing_bytes(
    version: int,
    run_id: str,
    step: int,
    peer_id: bytes,
    sha: bytes,
    size: int,
    addrs: Sequence[str],
    warmup: bool = False,
) -> bytes:
    """The exact bytes an announcement's signature covers (integers big-endian)::

    ANNOUNCE_DOMAIN | u16 version | u8 len(run) | run | u64 step | u8 len(peer) | peer
                    | sha (32) | u64 size | u8 n_addrs | n x (u16 len(addr) | addr ASCII)
                    [| u8 flags = 0x01]      (only for a warm-up announcement)

    Without the warm-up mark the bytes are exactly those of the first version of this schema,
    so announcements (and their signatures) made before the mark existed stay valid.
    """
    run = run_id.encode("ascii")
    parts = [
        ANNOUNCE_DOMAIN,
        struct.pack(">HB", version, len(run)),
        run,
        struct.pack(">QB", step, len(peer_id)),
        peer_id,
        sha,
        struct.pack(">QB", size, len(addrs)),
    ]
    for a in addrs:
        raw = a.encode("ascii")
        parts += [struct.pack(">H", len(raw)), raw]
    if warmup:
        parts.append(struct.pack(">B", WARMUP_FLAG))
    return b"".join(parts)


def _addrs_ok(addrs: object, limits: Limits) -> bool:
    if not isinstance(addrs, list | tuple) or len(addrs) > MAX_ADDRS:
        return False
    total = 0
    for a in addrs:
        if not isinstance(a, str) or not 1 <= len(a) <= limits.max_multiaddr_len or not _ADDR.fullmatch(a):
            return False
        total += len(a)
    return total <= MAX_ADDR_BYTES_TOTAL


def seal_announcement(
    identity: Identity,
    run_id: str,
    step: int,
    frame: bytes,
    *,
    addrs: Sequence[str] = (),
    limits: Limits = DEFAULT_LIMITS,
    warmup: bool = False,
    credential: bytes | None = None,
) -> bytes:
    """Sign an announcement of the sealed step-packet ``frame``; returns <= 1 KiB of frame bytes.

    ``warmup`` marks the packet as a warm-up packet (the ``"warm"`` key; see the module doc);
    ``credential`` is attached as ``"cred"`` (its size is checked, its signature is not).

    Raises EncodeError on an invalid run id, step, empty or oversize frame, or address hints
    beyond the bounds in the module docstring.
    """
    if not check_run_id(run_id, limits):
        raise EncodeError(f"invalid run id {run_id!r}")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= limits.max_step:
        raise EncodeError(f"step must be an int in [0, {limits.max_step}], got {step!r}")
    if not 1 <= len(frame) <= limits.max_frame_bytes:
        raise EncodeError(f"announced frame of {len(frame)} bytes is empty or over max_frame_bytes")
    addr_list = list(addrs)
    if not _addrs_ok(addr_list, limits):
        raise EncodeError(
            f"address hints: at most {MAX_ADDRS} '/'-prefixed ASCII multiaddrs, 512 bytes total"
        )
    sha = hashlib.sha256(frame).digest()
    msg = announcement_signing_bytes(
        ANNOUNCE_VERSION, run_id, step, identity.peer_id, sha, len(frame), addr_list, warmup
    )
    body: dict[str, object] = {
        "v": ANNOUNCE_VERSION,
        "run": run_id,
        "step": step,
        "peer": identity.peer_id,
        "sha": sha,
        "size": len(frame),
        "addrs": addr_list,
        "sig": identity.sign(msg),
    }
    if warmup:
        body["warm"] = True
    if credential is not None:
        if not MIN_CREDENTIAL_BYTES <= len(credential) <= MAX_CREDENTIAL_BYTES:
            raise EncodeError(f"credential of {len(credential)} bytes")
        body["cred"] = credential
    out = encode_frame(MessageKind.ANNOUNCEMENT, body, compress=False)
    if len(out) > limits.max_announcement_bytes:
        raise EncodeError(f"announcement of {len(out)} bytes over {limits.max_announcement_bytes}")
    return out


def open_announcement(
    frame: bytes, *, run_id: str, limits: Limits = DEFAULT_LIMITS, current_step: int | None = None
) -> Announcement:
    """Decode, validate and verify an announcement. Raises Rejected.

    Order of checks: size (TOO_LARGE, before parsing), frame and msgpack structure, ``v``
    (UNSUPPORTED_VERSION), field types and ranges (MALFORMED), run (WRONG_RUN), step window when
    ``current_step`` is given (STALE_STEP), signature (BAD_SIGNATURE). Cost: one Ed25519 verify.
    """
    cap = limits.max_announcement_bytes
    m = decode_frame(
        frame,
        MessageKind.ANNOUNCEMENT,
        limits=limits,
        max_frame_bytes=cap,
        max_decompressed_bytes=cap,
        max_array_len=MAX_ADDRS,
    )
    version = ANNOUNCE_VERSION
    warm = "warm" in m
    keys = _KEYS | (_OPTIONAL & m.keys())
    run, step, peer = take_signed_header(m, version=version, keys=keys, what="announcement", limits=limits)

    def reject(code: RejectCode, detail: str = "") -> Rejected:
        return Rejected(code, detail, run_id=run, peer_id=_b58(peer), step=step)

    sha = take_bin(m, "sha", 32, 32)
    size = take_int(m, "size", 1, limits.max_frame_bytes)
    sig = take_bin(m, "sig", SIGNATURE_BYTES, SIGNATURE_BYTES)
    cred = take_bin(m, "cred", MIN_CREDENTIAL_BYTES, MAX_CREDENTIAL_BYTES) if "cred" in m else None
    addrs = m["addrs"]
    if warm and m["warm"] is not True:
        raise reject(RejectCode.MALFORMED, "field 'warm' must be true when present")
    if not _addrs_ok(addrs, limits):
        raise reject(RejectCode.MALFORMED, "field 'addrs' must be up to 4 multiaddr strings")
    if run != run_id:
        raise reject(RejectCode.WRONG_RUN, f"expected run {run_id!r}")
    if current_step is not None and not limits.step_in_window(step, current_step):
        raise reject(RejectCode.STALE_STEP, f"current step {current_step}")
    msg = announcement_signing_bytes(version, run, step, peer, sha, size, addrs, warm)
    if not verify(peer, msg, sig):
        raise reject(RejectCode.BAD_SIGNATURE)
    return Announcement(version, run, step, peer, sha, size, tuple(addrs), sig, warm, cred)
