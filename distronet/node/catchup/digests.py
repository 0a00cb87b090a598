"""Parameter digests of recent steps, served to peers: the drift check without building any state.

Every node records the BLAKE3 digest of its parameters after each step (the ``digests`` of its status
file) in a :class:`DigestBoard`, which answers peers on ``DIGEST_PROTOCOL``. A drift check asks
each peer for its digest of one step (:func:`ask_digest`) and compares it with its own: one
small request per peer, where comparing state manifests meant serialising and hashing the whole
state (parameters + replicated optimizer state, ~7 MB for the default model) on every peer.

The answer is signed by the answering peer over (run, step, digest) and verified by the asker
(an answer that does not verify is no vote). The verdict (:func:`state_to_adopt`) counts one
vote per peer id, only peers ``admitted`` accepts when the node has an admission check, and
adopts another group's state only when at least a quorum of voters back it
(docs/decisions/state-quorum.md): fresh identities cannot outvote admitted honest replicas.

Wire: ``distronet.protocol.digest`` (docs/protocol.md §14.4): a 12-byte request naming the step,
an answer of a status byte and (found) the 32-byte digest and its 64-byte signature; served
through the swarm's servicer.

A peer asked for the step it is computing right now waits (at most ``wait_s``) for it to finish
instead of answering "unknown", so checks between replicas a little out of step still compare.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

from distronet.node.swarm.errors import StreamError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.p2p import SwarmHost
from distronet.node.swarm.servicer import StreamCall, StreamRoute, StreamServicer, ask
from distronet.protocol.digest import (
    DIGEST_ANSWER_BYTES,
    DIGEST_PROTOCOL,
    DIGEST_REQUEST_BYTES,
    DigestStatus,
    decode_digest_request,
    decode_digest_status,
    encode_digest_answer,
    encode_digest_request,
    open_digest_answer,
)
from distronet.protocol.errors import ProtocolError
from distronet.protocol.identity import Identity

__all__ = ["DIGEST_PROTOCOL", "DigestBoard", "ask_digest", "state_to_adopt"]

_SERVE_TIMEOUT_S = 10.0
K = TypeVar("K", bound=Hashable)


class DigestBoard:
    """The digests of this node's last ``keep`` steps, served to peers. Build with :meth:`create`.

    ``record`` and ``get`` run on the event loop's thread. ``wait_s``: how long a request for
    the step after the newest recorded one waits for it. Answers are signed with ``identity``
    for ``run_id``; a board without an identity answers every request "unknown".
    """

    def __init__(
        self,
        host: SwarmHost | None = None,
        identity: Identity | None = None,
        run_id: str = "",
        *,
        keep: int = 64,
        wait_s: float = 3.0,
    ) -> None:
        self.host, self.identity, self.run_id = host, identity, run_id
        self.keep, self.wait_s = max(1, keep), wait_s
        self._digests: OrderedDict[int, bytes] = OrderedDict()
        self._newest = -1
        self._recorded = asyncio.Event()
        self.served = 0
        self.servicer = StreamServicer(host)

    @classmethod
    async def create(
        cls, host: SwarmHost, identity: Identity, run_id: str, *, keep: int = 64, wait_s: float = 3.0
    ) -> DigestBoard:
        """A board that serves ``DIGEST_PROTOCOL`` on ``host``, signed by ``identity`` (the host's
        key) for ``run_id``. Raises DaemonError (p2pd)."""
        self = cls(host, identity, run_id, keep=keep, wait_s=wait_s)
        await self.servicer.add(self.route())
        return self

    def route(self) -> StreamRoute:
        """``DIGEST_PROTOCOL``: one request a stream; the answer may wait ``wait_s`` for the step."""
        deadline = _SERVE_TIMEOUT_S + self.wait_s
        return StreamRoute(DIGEST_PROTOCOL, DIGEST_REQUEST_BYTES, self._answer, _SERVE_TIMEOUT_S, deadline)

    def record(self, step: int, digest: bytes) -> None:
        """The BLAKE3 digest (32 bytes) of the parameters after ``step``. A step recorded again (after a
        resync) replaces the old digest; steps newer than ``step`` are forgotten."""
        if len(digest) != 32:
            raise ValueError(f"a digest is 32 bytes, got {len(digest)}")
        for newer in [s for s in self._digests if s >= step]:
            del self._digests[newer]
        self._digests[step] = digest
        while len(self._digests) > self.keep:
            self._digests.popitem(last=False)
        self._newest = step
        self._recorded.set()
        self._recorded = asyncio.Event()

    def get(self, step: int) -> bytes | None:
        return self._digests.get(step)

    async def wait_for(self, step: int, timeout: float) -> bytes | None:
        """The digest of ``step``; if it is the step after the newest recorded one, wait up to
        ``timeout`` seconds for it. None when unknown."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while step not in self._digests and step == self._newest + 1:
            left = end - loop.time()
            if left <= 0:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._recorded.wait(), left)
        return self._digests.get(step)

    async def _answer(self, call: StreamCall) -> bytes:
        """Found with the signed digest of the step asked for, or unknown. Raises Rejected (malformed)."""
        step = decode_digest_request(call.request)
        digest = await self.wait_for(step, self.wait_s)
        self.served += 1
        return encode_digest_answer(digest, identity=self.identity, run=self.run_id, step=step)

    async def close(self) -> None:
        await self.servicer.close()


async def ask_digest(
    host: SwarmHost, peer: PeerID, step: int, timeout: float, *, run_id: str
) -> bytes | None:
    """``peer``'s parameter digest after ``step`` in run ``run_id``; None when it has none, does
    not answer within ``timeout`` seconds, or answers malformed or unsigned by ``peer``."""

    async def read(reader: asyncio.StreamReader) -> bytes | None:
        if decode_digest_status(await reader.readexactly(1)) is not DigestStatus.FOUND:
            return None
        body = await reader.readexactly(DIGEST_ANSWER_BYTES)
        return open_digest_answer(body, sender=peer.to_bytes(), run=run_id, step=step)

    try:
        request = encode_digest_request(step)
        return await ask(host.control_path, peer, DIGEST_PROTOCOL, request, read, timeout)
    except (StreamError, ProtocolError):  # dead, unreachable, no handler or malformed: no digest
        return None


def state_to_adopt(
    mine: bytes,
    theirs: Mapping[K, bytes | None],
    *,
    quorum: int = 1,
    admitted: Callable[[K], bool] | None = None,
) -> list[K] | None:
    """The drift check's verdict: the peers whose state this node should adopt, or None to keep its own.

    ``mine`` is our digest of one step, ``theirs`` each asked peer's (verified) digest of that
    step (None: no answer). Only the peers ``admitted`` accepts vote (all, without it); the
    digests that answered, ours included, are grouped; the group ranked first is the largest,
    ties broken by the smallest digest. Every node that heard the same answers computes the
    same winner, so a swarm whose replicas drifted apart converges on one state instead of each
    replica adopting another's: a node in the winning group keeps its state (returns None),
    every other node gets the winning group's peers (in ``theirs``' order), from which alone it
    should fetch the state, if there are at least ``min(quorum, voters)`` of them (else None:
    a lone voter never moves a replica while others answered). None when no peer answered.
    Cost: O(peers).
    """
    known = {k: d for k, d in theirs.items() if d is not None and (admitted is None or admitted(k))}
    if not known:
        return None
    counts = Counter(known.values())
    counts[mine] += 1
    winner = min(counts, key=lambda d: (-counts[d], d))
    if winner == mine or counts[winner] < min(max(1, quorum), len(known)):
        return None
    return [k for k, d in known.items() if d == winner]
