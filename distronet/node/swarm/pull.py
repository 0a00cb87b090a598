"""Payloads pulled over direct libp2p streams by content hash (sha256), with a small store.

Wire (protocol ``/distronet/pull/1``): ``distronet.protocol.pull`` (docs/protocol.md §14.2);
requests one after another on a stream, each answered with a status, a size and (OK) the bytes.

``NOT_FOUND``: the server never held the content (as far as it remembers); ``PRUNED``: it held it
and dropped it (older than its retention; it remembers the last ``ContentStore.max_gone`` such
hashes). A puller tells them apart (``PullNotFound``, ``PullPruned``): "nobody holds this frame"
(:func:`nobody_holds`) may be concluded from the first, never from the second.

The server answers requests on one stream until the puller closes it (or it stays idle for
``idle_timeout_s``). A puller built with ``reuse_streams`` keeps a stream to each peer open after
a clean answer and sends its next request there: the swarm pulls three or more frames a step,
and each new stream costs both daemons and both event loops ~1.8 ms of CPU (a control-socket
connection, the libp2p stream negotiation, the daemon dialling our handler socket). A reused
stream the other side closed meanwhile is detected before any byte of the answer and the pull
is retried once on a new stream. A puller that sends one request per stream and closes it (the
old behaviour) is served as before.

The puller checks the declared size against its limit (and the announced size) *before* reading,
reads through the download budget, verifies the hash, and keeps the bytes in its own store so
that other peers can pull them from it. The server sends through the upload budget. Every byte
of both messages is counted (``Bandwidth.send``/``receive``/``sent``/``received``: the wire
estimate, and the acknowledgements each direction causes in the other). ``fetch(progress=...)``
is told each piece of body as it arrives (the exchange settles its download holds with it).

Serving is held to the servicer's per-peer quota (``servicer.PeerQuota``, ``StreamLimits``
``serve_*``): a whole answer is charged against the asker's share of the upload budget before
its first byte, so a peer past its share is refused (``LIMIT_EXCEEDED``, stream closed) without
a partial answer, while other peers are still served.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.errors import PullError, PullNotFound, PullPruned, PullTimeout, PullUnreachable
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.p2p import SwarmHost
from distronet.node.swarm.servicer import PeerQuota, StreamCall, StreamRoute, StreamServicer, open_stream
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_STREAM_LIMITS, StreamLimits
from distronet.protocol.pull import (
    PULL_HEADER_BYTES,
    PULL_PROTOCOL,
    PULL_REQUEST_BYTES,
    PullStatus,
    decode_pull_header,
    decode_pull_request,
    encode_pull_header,
    encode_pull_request,
)

__all__ = [
    "PULL_PROTOCOL",
    "ContentStore",
    "Puller",
    "all_unreachable",
    "encode_request",
    "encode_response_header",
    "nobody_holds",
]

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
Progress = Callable[[int], None]
_MAX_IDLE_PER_PEER = 4
_REUSE_FOR_S = 20.0  # an idle stream older than this is closed, not reused (servers time out at 60 s)


class _Stale(Exception):
    """A reused stream was closed by the other side before it answered: retry on a new one."""


def _observe(task: asyncio.Future[bytes]) -> None:
    """Mark a finished fetch's exception as seen. When the pull waiting on it is cancelled just
    as the fetch fails (a round's other frame failed first and ``gather`` cancels the rest),
    ``wait_for`` drops the fetch without reading its error, and asyncio would log "Task
    exception was never retrieved" for an error the round has already handled."""
    if not task.cancelled():
        task.exception()


encode_request = encode_pull_request  # the codecs live in distronet.protocol.pull
encode_response_header = encode_pull_header


class ContentStore:
    """In-memory payloads by sha256, tagged with a step; bounded by ``max_total_bytes``.

    When full, whole oldest steps are evicted first. ``evict_before(step)`` drops everything
    older than ``step`` (call it as the window of useful steps moves). The hashes of the last
    ``max_gone`` evicted payloads are remembered (``pruned``: 32 bytes each).
    """

    def __init__(self, max_total_bytes: int = 512 * 1024**2, max_gone: int = 4096) -> None:
        self.max_total_bytes, self.max_gone = max_total_bytes, max_gone
        self._items: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()
        self._gone: OrderedDict[bytes, None] = OrderedDict()
        self.total_bytes = 0

    def put(self, data: bytes, step: int, *, digest: bytes | None = None) -> bytes:
        """Store ``data`` for ``step``; return its sha256 (``digest``: already computed by the
        caller, trusted). Raises ValueError if it alone is over the cap."""
        if len(data) > self.max_total_bytes:
            raise ValueError(f"{len(data)} bytes exceed the store's {self.max_total_bytes}-byte cap")
        digest = digest or hashlib.sha256(data).digest()
        if digest in self._items:
            return digest
        while self.total_bytes + len(data) > self.max_total_bytes:
            oldest = min(s for s, _ in self._items.values())
            self.evict_before(oldest + 1)
        self._items[digest] = (step, data)
        self._gone.pop(digest, None)
        self.total_bytes += len(data)
        return digest

    def get(self, digest: bytes) -> bytes | None:
        item = self._items.get(digest)
        return None if item is None else item[1]

    def pruned(self, digest: bytes) -> bool:
        """Whether this store held ``digest`` and evicted it (among the last ``max_gone``)."""
        return digest in self._gone

    def __contains__(self, digest: object) -> bool:
        return digest in self._items

    def __len__(self) -> int:
        return len(self._items)

    def evict_before(self, step: int) -> int:
        """Drop payloads of steps < ``step``; return how many were dropped."""
        old = [d for d, (s, _) in self._items.items() if s < step]
        for d in old:
            self.total_bytes -= len(self._items.pop(d)[1])
            self._gone[d] = None
        while len(self._gone) > self.max_gone:
            self._gone.popitem(last=False)
        return len(old)


class Puller:
    """Serves this node's store over ``PULL_PROTOCOL`` and pulls from peers. Build with :meth:`create`."""

    def __init__(
        self,
        host: SwarmHost,
        store: ContentStore,
        bandwidth: Bandwidth,
        *,
        serve_timeout_s: float,
        protocol: str,
        reuse_streams: bool = False,
        idle_timeout_s: float = 60.0,
        limits: StreamLimits = DEFAULT_STREAM_LIMITS,
    ) -> None:
        self.host, self.store, self.bandwidth = host, store, bandwidth
        self.serve_timeout_s, self.protocol = serve_timeout_s, protocol
        self.reuse_streams, self._idle_timeout_s = reuse_streams, idle_timeout_s
        self.served = 0
        self.servicer = StreamServicer(host, quota=PeerQuota(
            limits, upload_rate=None if bandwidth.up.unlimited else bandwidth.up.metered_rate,
            upload_burst=bandwidth.up.burst,
        ))  # fmt: skip
        self.streams_opened = 0  # pull streams this puller opened (reused ones counted once)
        self._idle: dict[bytes, list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._closed = False  # close() ran: a stream a pull in flight hands back is closed, not kept

    @classmethod
    async def create(
        cls,
        host: SwarmHost,
        store: ContentStore | None = None,
        bandwidth: Bandwidth | None = None,
        *,
        serve_timeout_s: float = 30.0,
        protocol: str = PULL_PROTOCOL,
        reuse_streams: bool = False,
    ) -> Puller:
        """Register the pull handler on ``host`` (``protocol`` differs from the default only in
        tests). ``reuse_streams``: keep streams to peers open for the next pull (module doc);
        such a puller must be closed."""
        bw = bandwidth or Bandwidth.unlimited()
        self = cls(
            host, store or ContentStore(), bw, serve_timeout_s=serve_timeout_s, protocol=protocol,
            reuse_streams=reuse_streams,
        )  # fmt: skip
        await self.servicer.add(self.route())
        return self

    @property
    def idle_timeout_s(self) -> float:
        """How long a served stream may stay silent between requests before it is closed."""
        return self._idle_timeout_s

    @idle_timeout_s.setter
    def idle_timeout_s(self, seconds: float) -> None:
        self._idle_timeout_s = seconds
        if self.protocol in self.servicer.routes:  # streams opened from now on
            self.servicer.update(self.route())

    def route(self) -> StreamRoute:
        """How this puller serves its store: many requests a stream, the first within
        ``serve_timeout_s``, the next within ``idle_timeout_s``, each answered within
        ``serve_timeout_s``."""
        return StreamRoute(
            self.protocol, PULL_REQUEST_BYTES, self._serve_one, read_s=self.serve_timeout_s,
            deadline_s=self.serve_timeout_s, idle_s=self.idle_timeout_s,
        )  # fmt: skip

    async def close(self) -> None:
        """Close the idle pull streams and stop serving (nothing more when p2pd is already gone). A
        pull still in flight closes its stream when it ends."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for streams in idle.values():
            for _, _, writer in streams:
                writer.close()
        await self.servicer.close()

    async def _serve_one(self, call: StreamCall) -> None:
        """Answer one request (a malformed one is Rejected: the servicer closes the stream)."""
        self.bandwidth.received(len(call.request))
        req = decode_pull_request(call.request)
        data = self.store.get(req.digest)
        if data is None:
            status = PullStatus.PRUNED if self.store.pruned(req.digest) else PullStatus.NOT_FOUND
            call.write(encode_pull_header(status, 0))
        elif len(data) > req.max_bytes:
            call.write(encode_pull_header(PullStatus.TOO_LARGE, len(data)))
        else:
            head = encode_pull_header(PullStatus.OK, len(data))
            call.charge(len(head) + len(data))  # the asker's upload share, before any byte goes
            self.bandwidth.sent(len(head))
            call.write(head)
            view = memoryview(data)
            for off in range(0, len(data), _CHUNK):
                piece = view[off : off + _CHUNK]
                await self.bandwidth.send(len(piece))
                call.write(piece)
                await call.drain()
            self.served += 1
        return None

    async def fetch(
        self,
        peer: PeerID,
        digest: bytes,
        *,
        max_bytes: int,
        timeout: float,
        size: int | None = None,
        step: int = 0,
        progress: Progress | None = None,
    ) -> bytes:
        """Pull ``digest`` from one ``peer`` within ``timeout`` seconds; store and return it.

        ``progress`` is told the size of each piece of the body as it arrives.

        Raises:
            Rejected: TOO_LARGE (declared size over ``max_bytes``), MALFORMED (size differs from the
                announced ``size``, bad status, or sha256 mismatch), TRUNCATED (stream ended early).
            PullNotFound: the peer does not have it. PullPruned: it had it and dropped it.
            PullUnreachable: no stream to it could be
                opened. PullError: the stream failed mid-request.
            PullTimeout: ``timeout`` passed.
        """
        have = self.store.get(digest)
        if have is not None:
            return have
        fetch = asyncio.ensure_future(self._fetch(peer, digest, max_bytes, size, progress))
        fetch.add_done_callback(_observe)
        try:
            data = await asyncio.wait_for(fetch, timeout)
        except asyncio.TimeoutError:
            raise PullTimeout(f"pull of {digest.hex()[:16]} from {peer} took over {timeout:.2f} s") from None
        self.store.put(data, step)
        return data

    async def _fetch(
        self, peer: PeerID, digest: bytes, max_bytes: int, size: int | None, progress: Progress | None
    ) -> bytes:
        who = peer.to_base58()
        idle = self._take_idle(peer)
        if idle is not None:
            try:
                return await self._ask(
                    peer, who, idle, digest, max_bytes, size, reused=True, progress=progress
                )
            except _Stale:
                pass
        try:
            stream = await open_stream(self.host, peer, self.protocol)
        except Exception as e:
            raise PullUnreachable(f"cannot open a pull stream to {who}: {e}") from e
        self.streams_opened += 1
        return await self._ask(peer, who, stream, digest, max_bytes, size, reused=False, progress=progress)

    def _take_idle(self, peer: PeerID) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """An open idle stream to ``peer`` young enough to reuse (older or ended ones are closed)."""
        streams = self._idle.get(peer.to_bytes())
        now = time.monotonic()
        while streams:
            since, reader, writer = streams.pop()
            if now - since < _REUSE_FOR_S and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    def _put_idle(self, peer: PeerID, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        streams = self._idle.get(peer.to_bytes(), [])
        if self._closed or len(streams) >= _MAX_IDLE_PER_PEER:
            writer.close()
            return
        streams.append((time.monotonic(), reader, writer))
        self._idle[peer.to_bytes()] = streams

    async def _ask(
        self,
        peer: PeerID,
        who: str,
        stream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        digest: bytes,
        max_bytes: int,
        size: int | None,
        *,
        reused: bool,
        progress: Progress | None = None,
    ) -> bytes:
        """One request on ``stream``; it goes back to the idle pool after a clean answer (when
        ``reuse_streams``), else it is closed. Raises ``_Stale`` when a reused stream had ended."""
        reader, writer = stream
        clean = False
        try:
            request = encode_request(digest, max_bytes)
            self.bandwidth.sent(len(request))
            try:
                writer.write(request)
                await writer.drain()
                head = await reader.readexactly(PULL_HEADER_BYTES)
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                if reused and not (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                    raise _Stale from None
                if isinstance(e, ConnectionError):
                    raise PullError(f"pull stream to {who} failed: {e!r}") from None
                raise Rejected(RejectCode.TRUNCATED, "pull response header", peer_id=who) from None
            self.bandwidth.received(len(head))
            try:
                header = decode_pull_header(head, max_bytes=max_bytes, expected_size=size)
            except Rejected as e:
                raise Rejected(e.code, e.detail, peer_id=who) from None
            if header.status is PullStatus.NOT_FOUND:
                raise PullNotFound(f"{who} does not have {digest.hex()[:16]}")
            if header.status is PullStatus.PRUNED:
                raise PullPruned(f"{who} no longer has {digest.hex()[:16]} (pruned)")
            data = await self._read_body(reader, header.size, digest, who, progress)
            clean = True
            return data
        finally:
            if clean and self.reuse_streams:
                self._put_idle(peer, reader, writer)
            else:
                writer.close()

    async def _read_body(
        self, reader: asyncio.StreamReader, size: int, digest: bytes, who: str, progress: Progress | None
    ) -> bytes:
        buf, hasher = bytearray(), hashlib.sha256()
        while len(buf) < size:
            n = min(_CHUNK, size - len(buf))
            await self.bandwidth.receive(n)
            try:
                piece = await reader.readexactly(n)
            except asyncio.IncompleteReadError as e:
                raise Rejected(
                    RejectCode.TRUNCATED, f"{len(buf) + len(e.partial)} of {size} bytes", peer_id=who
                ) from None
            hasher.update(piece)
            buf += piece
            if progress is not None:
                progress(n)
        if hasher.digest() != digest:
            raise Rejected(
                RejectCode.MALFORMED, "payload sha256 differs from the announced hash", peer_id=who
            )
        return bytes(buf)

    async def pull(
        self,
        digest: bytes,
        sources: Sequence[PeerID],
        *,
        max_bytes: int,
        timeout: float,
        size: int | None = None,
        step: int = 0,
    ) -> bytes:
        """Pull ``digest`` from the first of ``sources`` that delivers, all within ``timeout`` seconds.

        Sources are tried in order (producer first, then peers that already have it); a source that
        fails, sends bad bytes or overruns its share of the time left (the time left divided by the
        sources not yet tried, so a stalled or SIGSTOPped producer cannot use up the whole deadline
        before the others are asked) is skipped. Raises PullTimeout when the deadline passes,
        PullError (with each source's failure in ``causes``) when every source failed.
        """
        have = self.store.get(digest)
        if have is not None:
            return have
        deadline = time.monotonic() + timeout
        causes: dict[str, BaseException] = {}
        others = [peer for peer in sources if peer != self.host.peer_id]
        for i, peer in enumerate(others):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            share = left / (len(others) - i)
            try:
                return await self.fetch(
                    peer, digest, max_bytes=max_bytes, timeout=share, size=size, step=step
                )
            except (PullError, Rejected) as e:
                causes[peer.to_base58()] = e
        what = f"pull of {digest.hex()[:16]} from {len(sources)} source(s)"
        if time.monotonic() >= deadline:
            raise PullTimeout(f"{what} ran past {timeout:.2f} s", causes)
        raise PullError(f"{what} failed", causes)


def nobody_holds(err: PullError, origins: Sequence[str]) -> bool:
    """Whether a failed :meth:`Puller.pull` shows that no live source holds the content: every
    peer in ``origins`` (base58; where the content came from — a frame's producer and the leader
    that listed it) could not be reached, every other source answered that it does not hold it,
    and at least one did. A timeout, bad bytes or a broken stream say nothing of the kind, and a
    source that pruned it (``PullPruned``) proves it was held: the swarm applied it."""
    causes = err.causes
    if isinstance(err, PullTimeout) or not causes:
        return False
    if any(not isinstance(causes.get(o), PullUnreachable) for o in origins):
        return False
    rest = [e for who, e in causes.items() if who not in origins]
    return (
        bool(rest)
        and all(isinstance(e, PullNotFound | PullUnreachable) for e in rest)
        and any(isinstance(e, PullNotFound) for e in rest)
    )


def all_unreachable(err: PullError) -> bool:
    """Whether a failed :meth:`Puller.pull` could reach none of its sources (no stream to any):
    with nobody left in the run's topic, no live peer holds the content (``exchange``)."""
    causes = err.causes.values()
    return (
        not isinstance(err, PullTimeout)
        and bool(causes)
        and all(isinstance(e, PullUnreachable) for e in causes)
    )
