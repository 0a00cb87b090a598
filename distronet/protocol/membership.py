"""The signed membership record, version 1 (docs/protocol.md section 15).

A node's presence in a run is one sub-record of hivemind's DHT under the key
``distronet/<run>/members``, its sub-key the node's base58 peer id. The value stored is::

    value   b"DNM1" | Ed25519 signature (64) | inner
    inner   msgpack map {"v": 1, "maddrs": [str, ...]}   or, leaving, {"v": 1, "left": true}
            (a live record may add "cred": bin, the node's membership credential, section 16)
    signed  b"DNM1" | u32 len(key) | key | u32 len(subkey) | subkey | f64 expiration | inner

where ``key`` is the DHT's id of the key string and ``subkey`` the msgpack str of the peer id,
both as hivemind's DHT hands them to its record validator, and ``expiration`` the record's
DHT expiry (seconds, wall clock) as a big-endian IEEE 754 double. So nobody can write, extend
or move another peer's record. Pure functions on bytes: ``open_record_value`` raises
``Rejected``; ``member_maddrs`` returns None for anything that is not a live member.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from distronet.protocol.credential import MAX_CREDENTIAL_BYTES, MIN_CREDENTIAL_BYTES
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import SIGNATURE_BYTES, Identity, peer_id_from_b58, verify
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = [
    "MEMBER_VERSION",
    "RECORD_MAGIC",
    "member_credential",
    "member_maddrs",
    "member_value",
    "open_record_value",
    "record_signing_bytes",
    "seal_record_value",
    "subkey_peer",
]

MEMBER_VERSION = 1
RECORD_MAGIC = b"DNM1"
_HEAD = len(RECORD_MAGIC) + SIGNATURE_BYTES


def record_signing_bytes(key: bytes, subkey: bytes, expiration: float, inner: bytes) -> bytes:
    """What a record's signature covers (module doc)."""
    return b"".join(
        (RECORD_MAGIC, struct.pack(">I", len(key)), key, struct.pack(">I", len(subkey)), subkey,
         struct.pack(">d", expiration), inner)
    )  # fmt: skip


def seal_record_value(
    identity: Identity, key: bytes, subkey: bytes, expiration: float, inner: bytes
) -> bytes:
    """The value to store: magic, ``identity``'s signature, ``inner``."""
    return RECORD_MAGIC + identity.sign(record_signing_bytes(key, subkey, expiration, inner)) + inner


def subkey_peer(subkey: bytes) -> bytes | None:
    """The 38-byte peer id a sub-key names (the msgpack str of its base58 form), or None."""
    try:
        text: object = msgpack.unpackb(subkey, max_str_len=128, max_bin_len=0, max_array_len=0, max_map_len=0)
        return peer_id_from_b58(text) if isinstance(text, str) else None
    except (ValueError, TypeError, msgpack.UnpackException):
        return None


def open_record_value(
    key: bytes, subkey: bytes, expiration: float, value: bytes, *, limits: Limits = DEFAULT_LIMITS
) -> bytes:
    """``inner`` of a record whose signature verifies against the peer its sub-key names.
    Raises Rejected: TOO_LARGE (over ``max_member_record_bytes``), MALFORMED (shorter than
    magic and signature, no magic, a sub-key that names no Ed25519 peer), BAD_SIGNATURE."""
    if len(value) > limits.max_member_record_bytes:
        raise Rejected(RejectCode.TOO_LARGE, f"membership record of {len(value)} bytes")
    if len(value) < _HEAD or not value.startswith(RECORD_MAGIC):
        raise Rejected(RejectCode.MALFORMED, "not a membership record")
    peer = subkey_peer(subkey)
    if peer is None:
        raise Rejected(RejectCode.MALFORMED, "membership sub-key names no Ed25519 peer")
    sig, inner = value[len(RECORD_MAGIC) : _HEAD], value[_HEAD:]
    if not verify(peer, record_signing_bytes(key, subkey, expiration, inner), sig):
        raise Rejected(RejectCode.BAD_SIGNATURE, "membership record")
    return inner


def member_value(maddrs: list[str] | None, credential: bytes | None = None) -> dict[str, Any]:
    """The map a node stores: its multiaddrs (and its credential, when it has one), or (None)
    the tombstone of a node leaving."""
    if maddrs is None:
        return {"v": MEMBER_VERSION, "left": True}
    out: dict[str, Any] = {"v": MEMBER_VERSION, "maddrs": maddrs}
    if credential is not None:
        out["cred"] = credential
    return out


def member_credential(value: object) -> bytes | None:
    """The credential bytes a live record's map carries (unverified: ``node.swarm.admission``),
    or None when it has none or one outside 141..204 bytes."""
    if not isinstance(value, dict) or value.get("left"):
        return None
    cred = value.get("cred")
    if not isinstance(cred, bytes) or not MIN_CREDENTIAL_BYTES <= len(cred) <= MAX_CREDENTIAL_BYTES:
        return None
    return cred


def member_maddrs(value: object, *, limits: Limits = DEFAULT_LIMITS) -> tuple[str, ...] | None:
    """The multiaddrs of a decoded record map, or None for a tombstone or a map that breaks the
    record's rules (not a map, no list of at most ``max_member_maddrs`` str of at most
    ``max_multiaddr_len`` bytes each)."""
    if not isinstance(value, dict) or value.get("left"):
        return None
    maddrs = value.get("maddrs")
    if not isinstance(maddrs, list) or len(maddrs) > limits.max_member_maddrs:
        return None
    if not all(isinstance(m, str) and len(m.encode()) <= limits.max_multiaddr_len for m in maddrs):
        return None
    return tuple(maddrs)
