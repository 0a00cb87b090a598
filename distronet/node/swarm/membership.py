"""Run membership as expiring, signed DHT records (hivemind's Kademlia over the node's p2pd).

Each node stores, under the run's key ``distronet/<run_id>/members``, one sub-record keyed by its
base58 peer id, expiring ``ttl_s`` after it was written, and rewrites it every ``renew_every_s``.
A peer whose record lapses is gone. A graceful leave writes a "left" tombstone (hivemind keeps
the record with the latest expiry, so a record cannot be shortened, only superseded).

Records are signed with the node's Ed25519 identity — the same key p2pd uses, so the DHT
record, the libp2p connection and our packets all name one peer id. The validator checks every
record it is asked to store or is handed: the sub-key must be an Ed25519 peer id and the
signature must verify against it (over key, sub-key, value and expiry), so nobody can write or
extend another peer's record. The record's bytes are ``distronet.protocol.membership``
(docs/protocol.md section 15).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from hivemind.dht.crypto import DHTRecord, RecordValidatorBase
from hivemind.dht.node import DHTNode
from hivemind.p2p import PeerID
from hivemind.utils.timed_storage import get_dht_time

from distronet.node.swarm.errors import MembershipError
from distronet.node.swarm.p2p import SwarmHost, with_deadline
from distronet.protocol.errors import ConfigError, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.limits import DEFAULT_LIMITS
from distronet.protocol.membership import (
    RECORD_MAGIC,
    member_credential,
    member_maddrs,
    member_value,
    open_record_value,
    seal_record_value,
)

__all__ = ["Member", "Membership", "MembershipConfig", "SignedRecordValidator", "members_key"]

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = DEFAULT_LIMITS.max_member_record_bytes
MAX_MADDRS = DEFAULT_LIMITS.max_member_maddrs
_HEAD = len(RECORD_MAGIC) + 64  # magic and signature, before the stored map
FIRST_ANNOUNCE_TRIES = 3  # a DHT just joined may not reach a peer that stores our record at once
FIRST_ANNOUNCE_GAP_S = 0.5


def members_key(run_id: str) -> str:
    return f"distronet/{run_id}/members"


@dataclass(frozen=True)
class MembershipConfig:
    """``ttl_s``: a record's lifetime; ``renew_every_s``: rewrite period (default ttl/3)."""

    run_id: str
    ttl_s: float = 30.0
    renew_every_s: float | None = None
    dht_wait_timeout_s: float = 3.0
    bootstrap_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.run_id or len(self.run_id) > 64:
            raise ConfigError(f"run id must be 1..64 characters, got {self.run_id!r}")
        if self.ttl_s <= 0 or (self.renew_every_s is not None and not 0 < self.renew_every_s < self.ttl_s):
            raise ConfigError("membership needs ttl_s > 0 and 0 < renew_every_s < ttl_s")

    @property
    def renew_s(self) -> float:
        return self.renew_every_s if self.renew_every_s is not None else self.ttl_s / 3


@dataclass(frozen=True)
class Member:
    """A live member: its peer id, dialable multiaddrs and DHT expiry (wall-clock DHT time)."""

    peer_id: PeerID
    maddrs: tuple[str, ...]
    expires_at: float
    credential: bytes | None = None  # as its record carries it, unverified (``admission``)

    @property
    def peer_id_b58(self) -> str:
        return str(self.peer_id.to_base58())


class SignedRecordValidator(RecordValidatorBase):  # type: ignore[misc]
    """Signs our own records with ``identity``; accepts only records signed by their sub-key's peer."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self._own_subkey = msgpack.packb(identity.peer_id_b58)

    def validate(self, record: DHTRecord) -> bool:
        try:
            open_record_value(record.key, record.subkey, record.expiration_time, bytes(record.value))
        except Rejected:
            return False
        return True

    def sign_value(self, record: DHTRecord) -> bytes:
        if record.subkey != self._own_subkey:
            return bytes(record.value)  # not ours to sign: peers will refuse it
        return seal_record_value(
            self.identity, record.key, record.subkey, record.expiration_time, bytes(record.value)
        )

    def strip_value(self, record: DHTRecord) -> bytes:
        return bytes(record.value[_HEAD:])


class Membership:
    """This node's presence in the run's DHT, and the view of who else is live. Use :meth:`create`."""

    def __init__(self, host: SwarmHost, identity: Identity, dht: DHTNode, config: MembershipConfig) -> None:
        self.host, self.identity, self.dht, self.config = host, identity, dht, config
        self.key = members_key(config.run_id)
        self._renew_task: asyncio.Task[None] | None = None
        self._timeout = host.config.call_timeout_s
        self.credential: bytes | None = None  # ours, written into our record (docs/protocol.md §15)
        self.on_members: Callable[[dict[str, Member]], object] | None = None  # sees every lookup's result

    @classmethod
    async def create(
        cls, host: SwarmHost, identity: Identity, config: MembershipConfig, *, bootstrap: tuple[str, ...] = ()
    ) -> Membership:
        """Join the DHT over ``host`` (bootstrapping from ``bootstrap`` multiaddrs), announce, renew.

        Raises:
            ConfigError: ``identity`` is not the key p2pd runs with.
            MembershipError: no bootstrap peer answered, or the first record could not be stored.
        """
        if host.peer_id.to_bytes() != identity.peer_id:
            raise ConfigError(
                "membership identity differs from the p2pd identity; start p2pd with the same key file"
            )
        create = DHTNode.create(
            p2p=host.p2p,
            initial_peers=list(bootstrap) or None,
            record_validator=SignedRecordValidator(identity),
            wait_timeout=config.dht_wait_timeout_s,
            bootstrap_timeout=config.bootstrap_timeout_s,
            ensure_bootstrap_success=bool(bootstrap),
            num_workers=4,
        )
        try:
            dht = await with_deadline(
                create, config.bootstrap_timeout_s + host.config.call_timeout_s, "DHT join"
            )
        except RuntimeError as e:
            raise MembershipError(f"cannot join the run's DHT: {e}") from e
        self = cls(host, identity, dht, config)
        try:
            await self.first_announce()
        except BaseException:
            await dht.shutdown()
            raise
        self._renew_task = asyncio.create_task(self._renew(), name="membership-renew")
        return self

    async def _store(self, value: dict[str, Any]) -> bool:
        expiry = get_dht_time() + self.config.ttl_s
        ok: bool = await with_deadline(
            self.dht.store(self.key, value, expiry, subkey=self.identity.peer_id_b58),
            self._timeout,
            "DHT store",
        )
        return ok

    async def announce(self) -> None:
        """Write (or renew) our record. Raises MembershipError when no DHT node accepted it."""
        maddrs = (await self.host.maddrs())[:MAX_MADDRS]
        if not await self._store(member_value(maddrs, self.credential)):
            raise MembershipError(f"no DHT node stored the membership record of {self.identity.peer_id_b58}")

    async def first_announce(self, tries: int = FIRST_ANNOUNCE_TRIES) -> None:
        """Write our first record, trying ``tries`` times ``FIRST_ANNOUNCE_GAP_S`` apart: right
        after the DHT join its routing table may not reach a peer that stores it yet, and giving
        up costs the node a second p2pd start without bootstrap peers. Raises MembershipError
        after the last try."""
        for attempt in range(tries):
            try:
                await self.announce()
                return
            except MembershipError as e:
                if attempt + 1 >= tries:
                    raise
                log.info("membership: first announce not stored (%s); trying again", e)
                await asyncio.sleep(FIRST_ANNOUNCE_GAP_S)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.config.renew_s)
            try:
                await self.announce()
            except (MembershipError, Exception) as e:  # keep trying: the next renewal may succeed
                log.warning("membership renewal failed: %s", e)

    async def members(self) -> dict[str, Member]:
        """Live members by base58 peer id (ourselves included), from a fresh DHT lookup."""
        found = await with_deadline(self.dht.get(self.key, latest=True), self._timeout, "DHT get")
        now = get_dht_time()
        out: dict[str, Member] = {}
        if found is None or not isinstance(found.value, dict):
            return out
        for subkey, item in found.value.items():
            member = _parse_member(subkey, item.value, item.expiration_time, now)
            if member is not None:
                out[member.peer_id_b58] = member
        if self.on_members is not None:
            self.on_members(out)
        return out

    async def close(self, *, leave: bool = True) -> None:
        """Stop renewing; with ``leave``, write a tombstone so peers drop us before the ttl."""
        if self._renew_task is not None:
            self._renew_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renew_task
        if not self.host.alive:  # p2pd is gone: nothing remote to undo, and every call would time out
            self.dht.is_alive = False
            return
        if leave:
            with contextlib.suppress(Exception):
                await self._store(member_value(None))
        with contextlib.suppress(Exception):
            await with_deadline(self.dht.shutdown(), self._timeout, "DHT shutdown")


def _parse_member(subkey: object, value: object, expires_at: float, now: float) -> Member | None:
    maddrs = member_maddrs(value)
    if not isinstance(subkey, str) or maddrs is None or expires_at <= now:
        return None
    try:
        peer = PeerID.from_base58(subkey)
    except Exception:
        return None
    return Member(peer, maddrs, expires_at, member_credential(value))
