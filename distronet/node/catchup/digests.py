"""Parameter digests of recent steps, served to peers: the drift check without building any state.

Every node records the BLAKE3 digest of its parameters after each step (the ``digests`` of its status
file) in a :class:`DigestBoard`, which answers peers on ``DIGEST_PROTOCOL``. A drift check asks
each peer for its digest of one step (:func:`ask_digest`) and compares it with its own: one
small request per peer, where comparing state manifests meant serialising and hashing the whole
state (parameters + replicated optimizer state, ~7 MB for the default model) on every peer.

The answer is not signed: the stream's peer is authenticated by libp2p (Noise), and a digest only
decides whether *we* resync, which a lying peer could cause with a signed manifest just as well.

Wire: ``distronet.protocol.digest`` (docs/protocol.md §14.4): a 12-byte request naming the step,
an answer of a status byte and (found) the 32-byte digest; served through the swarm's servicer.

A peer asked for the step it is computing right now waits (at most ``wait_s``) for it to finish
instead of answering "unknown", so checks between replicas a little out of step still compare.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping
from typing import TypeVar

from distronet.node.swarm.errors import StreamError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.p2p import SwarmHost
from distronet.node.swarm.servicer import StreamCall, StreamRoute, StreamServicer, ask
from distronet.protocol.digest import (
    DIGEST_BYTES,
    DIGEST_PROTOCOL,
    DIGEST_REQUEST_BYTES,
    DigestStatus,
    decode_digest_request,
    decode_digest_status,
    encode_digest_answer,
    encode_digest_request,
)
from distronet.protocol.errors import ProtocolError

__all__ = ["DIGEST_PROTOCOL", "DigestBoard", "ask_digest", "state_to_adopt"]

_SERVE_TIMEOUT_S = 10.0
K = TypeVar("K", bound=Hashable)


class DigestBoard:
    """The digests of this node's last ``keep`` steps, served to peers. Build with :meth:`create`.

    ``record`` and ``get`` run on the event loop's thread. ``wait_s``: how long a request for
    the step after the newest recorded one waits for it.
    """

    def __init__(self, host: SwarmHost | None = None, *, keep: int = 64, wait_s: float = 3.0) -> None:
        self.host, self.keep, self.wait_s = host, max(1, keep), wait_s
        self._digests: OrderedDict[int, bytes] = OrderedDict()
        self._newest = -1
        self._recorded = asyncio.Event()
        self.served = 0
        self.servicer = StreamServicer(host)

    @classmethod
    async def create(cls, host: SwarmHost, *, keep: int = 64, wait_s: float = 3.0) -> DigestBoard:
        """A board that serves ``DIGEST_PROTOCOL`` on ``host``. Raises DaemonError (p2pd)."""
        self = cls(host, keep=keep, wait_s=wait_s)
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
        """Found with the digest of the step asked for, or unknown. Raises Rejected (malformed)."""
        digest = await self.wait_for(decode_digest_request(call.request), self.wait_s)
        self.served += 1
        return encode_digest_answer(digest)

    async def close(self) -> None:
        await self.servicer.close()


async def _read_digest(reader: asyncio.StreamReader) -> bytes | None:
    if decode_digest_status(await reader.readexactly(1)) is DigestStatus.FOUND:
        return await reader.readexactly(DIGEST_BYTES)
    return None


async def ask_digest(host: SwarmHost, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """``peer``'s parameter digest after ``step``; None when it has none, does not answer within
    ``timeout`` seconds, or answers malformed."""
    try:
        request = encode_digest_request(step)
        return await ask(host.control_path, peer, DIGEST_PROTOCOL, request, _read_digest, timeout)
    except (StreamError, ProtocolError):  # dead, unreachable, no handler or malformed: no digest
        return None


def state_to_adopt(mine: bytes, theirs: Mapping[K, bytes | None]) -> list[K] | None:
    """The drift check's verdict: the peers whose state this node should adopt, or None to keep its own.

    ``mine`` is our digest of one step, ``theirs`` each asked peer's digest of that step (None:
    no answer). The digests that answered, ours included, are grouped; the group ranked first is
    the largest, ties broken by the smallest digest. Every node that heard the same answers
    computes the same winner, so a swarm whose replicas drifted apart converges on one state
    instead of each replica adopting another's: a node in the winning group keeps its state
    (returns None), every other node gets the winning group's peers (in ``theirs``' order), from which
    alone it should fetch the state. None when no peer answered. Cost: O(peers).
    """
    known = {k: d for k, d in theirs.items() if d is not None}
    if not known:
        return None
    counts = Counter(known.values())
    counts[mine] += 1
    winner = min(counts, key=lambda d: (-counts[d], d))
    if winner == mine:
        return None
    return [k for k, d in known.items() if d == winner]
