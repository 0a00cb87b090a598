"""Node sessions: HMAC keys agreed by an Ed25519-signed X25519 exchange, kept in memory only.

See :mod:`distronet.protocol.coordinator_session` for the scheme. A session belongs to one
(run, peer), lives ``ttl_s`` seconds from its creation, and a peer holds at most
``per_peer`` sessions (opening one more drops its oldest), so an admitted node cannot grow
the table without bound; the whole table is capped at ``max_sessions`` (oldest dropped
first). Keys are never written to the store: after a restart every session is unknown and
clients open new ones (one signed call each).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections import deque

from distronet.protocol.coordinator_api import ApiError, ApiErrorCode
from distronet.protocol.coordinator_session import derive_session_key, new_ephemeral

__all__ = ["Session", "SessionTable"]


class Session:
    """One open session."""

    __slots__ = ("expires_at", "keyed", "peer", "run_id", "sid")

    def __init__(self, sid: str, run_id: str, peer: str, key: bytes, expires_at: float) -> None:
        self.sid, self.run_id, self.peer, self.expires_at = sid, run_id, peer, expires_at
        self.keyed = hmac.new(key, digestmod=hashlib.sha256)  # copied per request: cheaper than re-keying

    def mac(self, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message`` under this session's key."""
        h = self.keyed.copy()
        h.update(message)
        return h.digest()


class SessionTable:
    """Open sessions by id. Sessions expire in creation order (one ttl for all), so pruning
    walks the front of an insertion-ordered dict: O(expired) per :meth:`prune`."""

    def __init__(self, ttl_s: float, *, per_peer: int = 4, max_sessions: int = 200_000) -> None:
        self.ttl_s = ttl_s
        self.per_peer = per_peer
        self.max_sessions = max_sessions
        self._by_id: dict[str, Session] = {}
        self._by_peer: dict[tuple[str, str], deque[str]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, run_id: str, peer: str, client_public_b64: str, now: float) -> tuple[Session, str]:
        """A new session for ``peer`` in ``run_id``: (session, the coordinator's public key, base64).

        Raises ApiError(INVALID_FIELD) when the node's X25519 key is unusable. Cost: one X25519
        key generation and exchange plus HKDF (~100-200 µs), once per session.
        """
        priv, server_pub = new_ephemeral()
        sid = secrets.token_urlsafe(16)
        try:
            key = derive_session_key(
                priv,
                client_public_b64,
                run_id=run_id,
                peer_id_b58=peer,
                session_id=sid,
                client_public_b64=client_public_b64,
                server_public_b64=server_pub,
            )
        except ValueError as e:
            raise ApiError(ApiErrorCode.INVALID_FIELD, f"body.x25519 {e}", field="body.x25519") from None
        self.prune(now)
        while len(self._by_id) >= self.max_sessions:
            self._drop(next(iter(self._by_id)))
        mine = self._by_peer.setdefault((run_id, peer), deque())
        while len(mine) >= self.per_peer:
            self._drop(mine[0])
        s = Session(sid, run_id, peer, key, now + self.ttl_s)
        self._by_id[sid] = s
        mine.append(sid)
        return s, server_pub

    def get(self, sid: str, now: float) -> Session | None:
        """The live session with this id, or None (unknown or expired)."""
        s = self._by_id.get(sid)
        if s is None or s.expires_at <= now:
            return None
        return s

    def prune(self, now: float) -> None:
        """Forget expired sessions."""
        by_id = self._by_id
        while by_id:
            first = next(iter(by_id.values()))
            if first.expires_at > now:
                return
            self._drop(first.sid)

    def _drop(self, sid: str) -> None:
        s = self._by_id.pop(sid, None)
        if s is None:
            return
        key = (s.run_id, s.peer)
        mine = self._by_peer.get(key)
        if mine is not None:
            with contextlib.suppress(ValueError):
                mine.remove(sid)
            if not mine:
                del self._by_peer[key]
