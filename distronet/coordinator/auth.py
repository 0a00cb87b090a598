"""Who may call what: the operator's bearer token, node requests (signed, or MAC'd under a
session), replay and rate limits.

A signed request is accepted when its peer id parses, its time is within ``skew_s`` of ours
(and not before this process started: nonces are remembered in memory only, so a restart
refuses anything signed before it), the Ed25519 signature over :func:`request_message`
verifies, and its nonce is new. A session request is accepted on the same terms, with an
HMAC-SHA256 under the session's key (:mod:`distronet.coordinator.sessions`) in place of the
signature; an unknown or expired session id is answered 401 ``unknown_session``. The
signature or MAC is checked before the nonce is recorded, so a forger cannot burn a peer's
nonces.
"""

from __future__ import annotations

import binascii
import hmac
import re
import time
from collections import deque

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from distronet.coordinator.sessions import Session, SessionTable
from distronet.protocol import identity
from distronet.protocol.coordinator_api import (
    HDR_NONCE,
    HDR_PEER,
    HDR_SIGNATURE,
    HDR_TIME,
    PEER_RE,
    ApiError,
    ApiErrorCode,
    b64decode_sig,
    request_message,
)
from distronet.protocol.coordinator_session import HDR_MAC, HDR_SESSION, MAC_B64_LEN

__all__ = [
    "MacHeaders",
    "NonceCache",
    "RateLimiter",
    "SignedHeaders",
    "check_bearer",
    "parse_mac",
    "parse_signed",
    "verify_mac",
    "verify_signed",
]

# peer id string -> public key: parsing base58 costs more than the rest of the check.
_KEYS: dict[str, Ed25519PublicKey] = {}
_MAX_KEYS = 200_000
_NONCE_RE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_PEER_RE = re.compile(PEER_RE)


def check_bearer(header: str | None, token: str | None) -> None:
    """Raise ApiError(401) without a bearer token, (403) with a wrong one (constant-time compare)."""
    if not header or not header.startswith("Bearer "):
        raise ApiError(
            ApiErrorCode.UNAUTHENTICATED, "this call needs the operator token: Authorization: Bearer …"
        )
    if token is None or not hmac.compare_digest(header[7:].encode(), token.encode()):
        raise ApiError(ApiErrorCode.BAD_TOKEN, "wrong operator token")


class SignedHeaders:
    """The parsed signature headers of one request."""

    __slots__ = ("key", "nonce", "peer", "signature", "ts_ms")

    def __init__(self, peer: str, key: Ed25519PublicKey, ts_ms: int, nonce: str, signature: bytes) -> None:
        self.peer = peer
        self.key = key
        self.ts_ms = ts_ms
        self.nonce = nonce
        self.signature = signature


def parse_signed(headers: object, *, skew_s: float, not_before_ms: int, now: float) -> SignedHeaders:
    """Check the four headers' presence, form and time window. Raises ApiError (401/403)."""
    get = headers.get  # type: ignore[attr-defined]
    peer, ts, nonce, sig = get(HDR_PEER), get(HDR_TIME), get(HDR_NONCE), get(HDR_SIGNATURE)
    if peer is None or ts is None or nonce is None or sig is None:
        raise ApiError(
            ApiErrorCode.UNAUTHENTICATED, f"this call must be signed ({HDR_PEER}, {HDR_SIGNATURE}, …)"
        )
    if len(peer) > 64 or not _PEER_RE.fullmatch(peer):
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_PEER} is not a peer id")
    key = _KEYS.get(peer)
    if key is None:
        try:
            key = identity.public_key_from_peer_id(identity.peer_id_from_b58(peer))
        except ValueError:
            raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_PEER} is not an Ed25519 peer id") from None
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        _KEYS[peer] = key
    ts_ms = _check_time_nonce(ts, nonce, skew_s, not_before_ms, now)
    return SignedHeaders(peer, key, ts_ms, nonce, b64decode_sig(sig))


def _check_time_nonce(ts: str, nonce: str, skew_s: float, not_before_ms: int, now: float) -> int:
    """The request time in ms, after checking its form and window and the nonce's form."""
    if not (0 < len(ts) <= 16 and ts.isdigit()):
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_TIME} must be milliseconds since the epoch")
    ts_ms = int(ts)
    if abs(ts_ms / 1000.0 - now) > skew_s or ts_ms < not_before_ms:
        raise ApiError(
            ApiErrorCode.STALE_REQUEST, "signed time outside the accepted window: check the clock, re-sign"
        )
    if not _NONCE_RE.fullmatch(nonce):
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_NONCE} must be 16-64 characters of [A-Za-z0-9_-]")
    return ts_ms


def verify_signed(h: SignedHeaders, method: str, path: str, body: bytes) -> None:
    """Raise ApiError(BAD_SIGNATURE) unless the signature covers this exact request."""
    try:
        h.key.verify(h.signature, request_message(method, path, h.ts_ms, h.nonce, body))
    except InvalidSignature:
        raise ApiError(
            ApiErrorCode.BAD_SIGNATURE, "request signature does not verify for this peer id"
        ) from None


class MacHeaders:
    """The parsed headers of one session request (``mac``: the header's base64, as bytes)."""

    __slots__ = ("mac", "nonce", "peer", "session", "ts_ms")

    def __init__(self, peer: str, session: Session, ts_ms: int, nonce: str, mac: bytes) -> None:
        self.peer = peer
        self.session = session
        self.ts_ms = ts_ms
        self.nonce = nonce
        self.mac = mac


def parse_mac(
    headers: object,
    sessions: SessionTable,
    *,
    run_id: str | None,
    skew_s: float,
    not_before_ms: int,
    now: float,
) -> MacHeaders:
    """Check a session request's headers, session and time window. Raises ApiError (401/403).

    401 ``unauthenticated`` when a header is missing, 401 ``unknown_session`` for a session
    id that is unknown or expired, 403 ``bad_signature`` for a session of another peer or run.
    """
    get = headers.get  # type: ignore[attr-defined]
    peer, ts, nonce, sid, mac = get(HDR_PEER), get(HDR_TIME), get(HDR_NONCE), get(HDR_SESSION), get(HDR_MAC)
    if peer is None or ts is None or nonce is None or sid is None or mac is None:
        raise ApiError(
            ApiErrorCode.UNAUTHENTICATED,
            f"a session call needs {HDR_PEER}, {HDR_TIME}, {HDR_NONCE}, {HDR_SESSION} and {HDR_MAC}",
        )
    session = sessions.get(sid, now)
    if session is None:
        raise ApiError(
            ApiErrorCode.UNKNOWN_SESSION, "unknown or expired session: open a new one (POST …/session)"
        )
    if session.peer != peer or session.run_id != run_id:
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, "this session belongs to another peer or run")
    ts_ms = _check_time_nonce(ts, nonce, skew_s, not_before_ms, now)
    if len(mac) != MAC_B64_LEN or not mac.isascii():
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, f"{HDR_MAC} must be 44 characters of base64")
    return MacHeaders(peer, session, ts_ms, nonce, mac.encode())


def verify_mac(h: MacHeaders, method: str, path: str, body: bytes) -> None:
    """Raise ApiError(BAD_SIGNATURE) unless the MAC covers this exact request (constant time).

    Compared in base64 (canonical: one encoding per MAC), which saves decoding the header.
    """
    good = binascii.b2a_base64(
        h.session.mac(request_message(method, path, h.ts_ms, h.nonce, body)), newline=False
    )
    if not hmac.compare_digest(good, h.mac):
        raise ApiError(ApiErrorCode.BAD_SIGNATURE, "request MAC does not verify for this session")


class NonceCache:
    """Nonces seen within the last ``ttl_s`` seconds, per peer. O(1) per check, pruned in order."""

    def __init__(self, ttl_s: float, max_entries: int = 2_000_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._seen: set[str] = set()
        self._order: deque[tuple[float, str]] = deque()

    def check_and_add(self, peer: str, nonce: str, now: float) -> None:
        """Raise ApiError(REPLAYED) for a nonce seen before; else remember it."""
        order = self._order
        while order and (order[0][0] <= now or len(order) > self.max_entries):
            self._seen.discard(order.popleft()[1])
        key = peer + nonce
        if key in self._seen:
            raise ApiError(ApiErrorCode.REPLAYED, "this nonce was already used: sign each request afresh")
        self._seen.add(key)
        order.append((now + self.ttl_s, key))


class RateLimiter:
    """Token buckets per client key: ``rate`` requests/s, bursts of ``burst``."""

    def __init__(self, rate: float, burst: float, max_keys: int = 200_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._b: dict[str, list[float]] = {}

    def retry_after(self, key: str, now: float | None = None) -> float:
        """0.0 when the request may pass (and is counted); else seconds until it could."""
        now = time.monotonic() if now is None else now
        b = self._b.get(key)
        if b is None:
            if len(self._b) >= self.max_keys:
                self._prune(now)
            b = self._b[key] = [self.burst, now]
        tokens = min(self.burst, b[0] + (now - b[1]) * self.rate)
        b[1] = now
        if tokens >= 1.0:
            b[0] = tokens - 1.0
            return 0.0
        b[0] = tokens
        return (1.0 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        full = self.burst / self.rate
        self._b = {k: v for k, v in self._b.items() if now - v[1] < full}
        if len(self._b) >= self.max_keys:  # all busy: forget the oldest half
            keep = sorted(self._b.items(), key=lambda kv: kv[1][1])[len(self._b) // 2 :]
            self._b = dict(keep)
