"""Session keys for node calls: one Ed25519-signed key exchange, then an HMAC per request.

Why: verifying an Ed25519 signature costs the coordinator 60-250 µs of CPU, more than the rest
of a heartbeat. A node therefore signs *one* call with its libp2p key — ``POST
/runs/{id}/session`` carrying a fresh X25519 public key — and the coordinator answers with its
own fresh X25519 public key and a session id. Both sides derive the same 32-byte key::

    shared = X25519(own ephemeral private key, other side's ephemeral public key)
    key    = HKDF-SHA256(shared, length=32, salt="DISTRO-SESSION-V1",
                         info="DISTRO-SESSION-V1\\n{run}\\n{peer}\\n{session id}\\n"
                              + client public key (32 bytes) + server public key (32 bytes))

Every later node call carries ``X-Distro-Session`` and ``X-Distro-Mac`` = base64 of
HMAC-SHA256(key, :func:`~distronet.protocol.coordinator_api.request_message`) — the same bytes
(method, path, time, nonce, body hash) a signature covers, with the same time window and the
same single-use nonces. Properties:

- Only the node can make a MAC the coordinator accepts: the coordinator's key needs the node's
  X25519 private key (never sent) or the coordinator's (never sent), and the node's X25519
  public key is covered by its Ed25519 signature, so nobody can substitute their own.
- A passive eavesdropper sees both public keys only; an active man in the middle who swaps the
  coordinator's answer learns a key the coordinator does not hold (the node's calls then fail
  with ``bad_signature``: denial of service, which such an attacker has anyway).
- Keys are ephemeral and kept in the coordinator's memory only: a restart forgets them, the
  node's next call is answered ``401 unknown_session`` and the client opens a new session.

Cost: one HMAC (~2 µs idle) per call instead of one Ed25519 verify.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from distronet.protocol.coordinator_api import (
    HDR_NONCE,
    HDR_PEER,
    HDR_TIME,
    ApiError,
    ApiErrorCode,
    Field,
    Schema,
    request_message,
)

__all__ = [
    "HDR_MAC",
    "HDR_SESSION",
    "MAC_B64_LEN",
    "SESSION",
    "SESSION_ID_RE",
    "X25519_RE",
    "SessionKey",
    "b64decode_mac",
    "derive_session_key",
    "mac_headers",
    "new_ephemeral",
    "public_b64",
    "request_mac",
]

HDR_SESSION = "X-Distro-Session"
HDR_MAC = "X-Distro-Mac"
SESSION_ID_RE = r"[A-Za-z0-9_-]{22}"  # secrets.token_urlsafe(16)
X25519_RE = r"[A-Za-z0-9+/]{43}="  # standard base64 of 32 bytes
MAC_B64_LEN = 44  # standard base64 of 32 bytes
_SALT = b"DISTRO-SESSION-V1"

SESSION = Schema(
    "SessionRequest",
    (Field("x25519", "str", pattern=X25519_RE, description="the node's ephemeral X25519 public key"),),
)


class SessionKey:
    """What a client holds for one session: its id and the derived HMAC key."""

    __slots__ = ("key", "peer", "session_id")

    def __init__(self, peer: str, session_id: str, key: bytes) -> None:
        self.peer, self.session_id, self.key = peer, session_id, key


def new_ephemeral() -> tuple[X25519PrivateKey, str]:
    """A fresh X25519 key pair: (private key, base64 of the public key)."""
    priv = X25519PrivateKey.generate()
    return priv, public_b64(priv)


def public_b64(priv: X25519PrivateKey) -> str:
    """Base64 (standard, padded) of ``priv``'s 32-byte public key."""
    return base64.b64encode(priv.public_key().public_bytes_raw()).decode()


def derive_session_key(
    priv: X25519PrivateKey,
    other_public_b64: str,
    *,
    run_id: str,
    peer_id_b58: str,
    session_id: str,
    client_public_b64: str,
    server_public_b64: str,
) -> bytes:
    """The 32-byte HMAC key of a session, from either side. Raises ValueError on a bad public key.

    A public key that is not 32 bytes of base64, or a low-order point (all-zero shared secret),
    raises ValueError.
    """
    try:
        raw = base64.b64decode(other_public_b64, validate=True)
    except binascii.Error:
        raise ValueError("X25519 public key is not base64") from None
    if len(raw) != 32:
        raise ValueError("X25519 public key must be 32 bytes")
    shared = priv.exchange(X25519PublicKey.from_public_bytes(raw))  # ValueError on a low-order point
    info = (
        f"DISTRO-SESSION-V1\n{run_id}\n{peer_id_b58}\n{session_id}\n".encode()
        + base64.b64decode(client_public_b64)
        + base64.b64decode(server_public_b64)
    )
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=info).derive(shared)


def request_mac(key: bytes, method: str, path: str, timestamp_ms: int, nonce: str, body: bytes) -> bytes:
    """HMAC-SHA256 of :func:`request_message` under a session key (32 bytes)."""
    return hmac.digest(key, request_message(method, path, timestamp_ms, nonce, body), "sha256")


def mac_headers(
    session: SessionKey,
    method: str,
    path: str,
    body: bytes,
    *,
    now_ms: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The five headers of a session-authenticated request (peer, time, nonce, session, MAC)."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    nonce = secrets.token_urlsafe(12) if nonce is None else nonce
    mac = request_mac(session.key, method, path, ts, nonce, body)
    return {
        HDR_PEER: session.peer,
        HDR_TIME: str(ts),
        HDR_NONCE: nonce,
        HDR_SESSION: session.session_id,
        HDR_MAC: base64.b64encode(mac).decode(),
    }


def b64decode_mac(text: str) -> bytes:
    """Decode a base64 MAC (32 bytes). Raises ApiError(BAD_SIGNATURE) on anything else."""
    if len(text) != MAC_B64_LEN:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_MAC} must be 44 characters of base64")
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_MAC} is not base64") from None
    if len(raw) != 32:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_MAC} must be 32 bytes")
    return raw
