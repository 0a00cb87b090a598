"""Who the swarm admits: peers that show a valid membership credential of the run's coordinator.

``Admission`` is fed credentials (from announcements, membership records, our own coordinator
client) and answers ``admits(peer_id)``. Each distinct credential is verified once (cached by
its SHA-256); the newest valid one per peer is kept, and a peer stops being admitted when that
one expires. With no coordinator key (``coordinator_key=None``: local runs, tests, a coordinator
that issues no credentials) the registry is *open*: it admits every peer, and ``enforced`` is
False — the daemon chooses that explicitly (node config ``require_admission``), never silently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from distronet.protocol.credential import Credential, open_credential
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from distronet.node.swarm.membership import Member

__all__ = ["Admission"]

log = logging.getLogger(__name__)


class Admission:
    """The admitted peers of one run (module doc). Not thread-safe: one event loop owns it."""

    def __init__(
        self,
        run_id: str,
        coordinator_key: bytes | None,
        *,
        clock: Callable[[], float] = time.time,
        max_peers: int = 16_384,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.run_id, self.coordinator_key, self.clock = run_id, coordinator_key, clock
        self.max_peers, self.limits = max_peers, limits
        self._by_peer: dict[bytes, Credential] = {}
        self._seen: dict[bytes, Credential] = {}  # sha256(raw) -> verified credential
        self.verified = 0  # Ed25519 verifications done (the cache's misses)

    @property
    def enforced(self) -> bool:
        return self.coordinator_key is not None

    def admits(self, peer_id: bytes) -> bool:
        """Whether ``peer_id`` holds an unexpired credential (always True when not enforced)."""
        if self.coordinator_key is None:
            return True
        cred = self._by_peer.get(peer_id)
        return cred is not None and cred.valid_at(self.clock())

    def ticket(self, peer_id: bytes) -> bytes | None:
        """The coordinator's ticket of ``peer_id`` (leader ranking), None when unknown or open."""
        cred = self._by_peer.get(peer_id)
        return cred.ticket if cred is not None and self.coordinator_key is not None else None

    def offer(self, raw: bytes, peer_id: bytes | None = None) -> Credential | None:
        """Verify ``raw`` (naming ``peer_id`` when given) and keep it if it is the peer's newest.
        None when not enforced. Raises Rejected (``open_credential``'s codes; LIMIT_EXCEEDED
        when the registry is full of unexpired credentials)."""
        if self.coordinator_key is None:
            return None
        now = self.clock()
        digest = Credential.digest_of(raw)
        cred = self._seen.get(digest)
        if cred is None:
            cred = open_credential(raw, run_id=self.run_id, coordinator_key=self.coordinator_key, now=now,
                                   limits=self.limits)  # fmt: skip
            self.verified += 1
            self._room(now)
            self._seen[digest] = cred
        if peer_id is not None and cred.peer_id != peer_id:
            raise Rejected(RejectCode.WRONG_PEER, "credential names another peer")
        if not cred.valid_at(now):
            raise Rejected(RejectCode.NOT_ADMITTED, "credential expired")
        held = self._by_peer.get(cred.peer_id)
        if held is None or held.not_after < cred.not_after:
            self._by_peer[cred.peer_id] = cred
        return cred

    def learn_members(self, members: Mapping[str, Member]) -> int:
        """Offer the credentials the run's membership records carry (``Membership.on_members``),
        so donors and leaders are known before they announce. Returns how many verify; a bad
        one is skipped (logged at debug)."""
        ok = 0
        for member in members.values():
            if member.credential is None or self.coordinator_key is None:
                continue
            try:
                self.offer(member.credential, member.peer_id.to_bytes())
                ok += 1
            except Rejected as e:
                log.debug("membership record of %s: %s", member.peer_id_b58, e)
        return ok

    def _room(self, now: float) -> None:
        if len(self._seen) < 2 * self.max_peers and len(self._by_peer) < self.max_peers:
            return
        self._seen = {d: c for d, c in self._seen.items() if c.valid_at(now)}
        self._by_peer = {p: c for p, c in self._by_peer.items() if c.valid_at(now)}
        if len(self._seen) >= 2 * self.max_peers:
            self._seen.clear()  # only a cache: newest-per-peer is kept
        if len(self._by_peer) >= self.max_peers:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {self.max_peers} admitted peers")

    def admitted(self) -> list[bytes]:
        """Peers admitted now."""
        now = self.clock()
        return [p for p, c in self._by_peer.items() if c.valid_at(now)]
