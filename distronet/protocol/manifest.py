"""The signed round manifest, version 1: which (peer, frame hash) pairs count for one step
(docs/protocol.md section 13).

A round's leader (see ``leader_rank``) gossips the manifest once the round deadline has passed;
every replica adopts the best-ranked valid manifest it receives, so all apply the same accepted
set. Wire form: a msgpack map, at most ``max_entries`` entries::

    "v" 1 | "run" str | "step" int | "leader" bin(38) | "entries" [[peer bin(38), sha bin(32), size int], ...]
    | "sig" bin(64)   (Ed25519 by the leader over ``manifest_signing_bytes``)

Entries are sorted by peer id, unique and at least one. They usually include the leader itself,
but need not: a leader that is late for its round seals the entries of the manifest it already
holds unchanged (``exchange.AsyncSwarmExchange._lead``), so that every replica applies one set.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import msgpack

from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import (
    PEER_ID_BYTES,
    SIGNATURE_BYTES,
    Identity,
    is_ed25519_peer_id,
    peer_id_to_b58,
    verify,
)

__all__ = ["RoundManifest", "encode_manifest", "leader_rank", "may_lead", "open_manifest", "seal_manifest"]

MANIFEST_VERSION = 1
_DOMAIN = b"distronet/manifest/v1\x00"
_KEYS = frozenset({"v", "run", "step", "leader", "entries", "sig"})

Entry = tuple[bytes, bytes, int]  # producer peer id, sha256 of its frame, frame size


def leader_rank(step: int, peer_id: bytes, ticket: bytes | None = None) -> bytes:
    """Sort key of ``peer_id`` for leading ``step`` (lowest leads); rotates leaders per step.

    ``ticket`` is the peer's coordinator-issued ticket (``protocol.credential``) in a run that
    admits by credential: the rank then depends on a value the peer cannot choose, so it cannot
    grind a key that outranks honest leaders (docs/decisions/leader-rank.md). Without one
    (runs without a coordinator key) the rank is the first version's."""
    if ticket is None:
        return hashlib.sha256(b"distronet/leader\x00" + struct.pack(">Q", step) + peer_id).digest()
    return hashlib.sha256(b"distronet/leader/v2\x00" + ticket + struct.pack(">Q", step) + peer_id).digest()


def may_lead(producers: set[bytes], warm: set[bytes], unheard: set[bytes]) -> set[bytes]:
    """The producers heard this round that may lead it: those not warming up; when every one
    heard is warming up, all of them (their packets are then taken as they are) — but only while
    no recent producer is unheard: a replica just back from a pause hears its peers late, and
    would otherwise lead a round of its own warm-up packet alone (seen in chaos 3)."""
    return (producers - warm) or (set() if unheard else set(producers))


@dataclass(frozen=True)
class RoundManifest:
    run_id: str
    step: int
    leader: bytes
    entries: tuple[Entry, ...]
    signature: bytes

    @property
    def rank(self) -> bytes:
        """The leader's rank in a run without admission (the exchange ranks with its ticket)."""
        return leader_rank(self.step, self.leader)


def manifest_signing_bytes(run_id: str, step: int, leader: bytes, entries: tuple[Entry, ...]) -> bytes:
    run = run_id.encode()
    parts = [
        _DOMAIN,
        struct.pack(">B", len(run)),
        run,
        struct.pack(">Q", step),
        leader,
        struct.pack(">I", len(entries)),
    ]
    for peer, sha, size in entries:
        parts += [peer, sha, struct.pack(">Q", size)]
    return b"".join(parts)


def seal_manifest(identity: Identity, run_id: str, step: int, entries: list[Entry]) -> bytes:
    """Sign the accepted set ``entries`` as leader of ``step``; returns the gossip bytes."""
    ordered = tuple(sorted(entries))
    sig = identity.sign(manifest_signing_bytes(run_id, step, identity.peer_id, ordered))
    return encode_manifest(RoundManifest(run_id, step, identity.peer_id, ordered, sig))


def encode_manifest(man: RoundManifest) -> bytes:
    """The gossip bytes of a manifest already opened (a replica serves the one it adopted)."""
    body = {
        "v": MANIFEST_VERSION,
        "run": man.run_id,
        "step": man.step,
        "leader": man.leader,
        "entries": [list(e) for e in man.entries],
        "sig": man.signature,
    }
    out: bytes = msgpack.packb(body, use_bin_type=True)
    return out


def open_manifest(data: bytes, *, run_id: str, max_entries: int, max_size: int) -> RoundManifest:
    """Decode and verify a manifest. Raises ``Rejected`` (MALFORMED, LIMIT_EXCEEDED, WRONG_RUN,
    BAD_SIGNATURE); every count and size is checked before use."""
    try:
        m = msgpack.unpackb(
            data, raw=False, max_array_len=max_entries * 3 + 3, max_map_len=8, max_str_len=128, max_bin_len=64
        )
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise Rejected(RejectCode.MALFORMED, f"manifest: {e}") from None
    if not isinstance(m, dict) or m.keys() != _KEYS or m["v"] != MANIFEST_VERSION:
        raise Rejected(RejectCode.MALFORMED, "manifest fields or version")
    run, step, leader, raw, sig = m["run"], m["step"], m["leader"], m["entries"], m["sig"]
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2**63:
        raise Rejected(RejectCode.MALFORMED, "manifest step")
    if not isinstance(leader, bytes) or not is_ed25519_peer_id(leader) or not isinstance(sig, bytes):
        raise Rejected(RejectCode.MALFORMED, "manifest leader or signature", step=step)
    who = peer_id_to_b58(leader)
    if not isinstance(raw, list):
        raise Rejected(RejectCode.MALFORMED, "manifest entries are not an array", peer_id=who, step=step)
    if len(raw) > max_entries:
        raise Rejected(
            RejectCode.LIMIT_EXCEEDED, f"over {max_entries} manifest entries", peer_id=who, step=step
        )
    entries: list[Entry] = []
    for item in raw:
        ok = (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], bytes)
            and isinstance(item[1], bytes)
        )
        if not ok or len(item[0]) != PEER_ID_BYTES or len(item[1]) != 32 or not isinstance(item[2], int):
            raise Rejected(RejectCode.MALFORMED, "manifest entry", peer_id=who, step=step)
        if not 1 <= item[2] <= max_size:
            raise Rejected(RejectCode.TOO_LARGE, f"manifest entry of {item[2]} bytes", peer_id=who, step=step)
        entries.append((item[0], item[1], item[2]))
    ordered = tuple(entries)
    peers = [p for p, _, _ in ordered]
    if not peers or peers != sorted(set(peers)):
        raise Rejected(RejectCode.MALFORMED, "manifest entries empty, unsorted or duplicated")
    if run != run_id:
        raise Rejected(RejectCode.WRONG_RUN, f"manifest of run {run!r}", peer_id=who, step=step)
    if len(sig) != SIGNATURE_BYTES or not verify(
        leader, manifest_signing_bytes(run, step, leader, ordered), sig
    ):
        raise Rejected(RejectCode.BAD_SIGNATURE, "manifest", peer_id=who, step=step)
    return RoundManifest(run, step, leader, ordered, sig)
