"""Gossipsub over p2pd's control socket (hivemind's client has no pubsub calls).

A request is one varint-length-delimited ``Request{type=PUBSUB, pubsub=PSRequest{...}}`` on a
connection to the daemon's control socket; the daemon answers with one delimited ``Response``.
For ``SUBSCRIBE`` the connection then stays open and carries one delimited ``PSMessage`` per
gossip message until either side closes it (closing it unsubscribes). Other requests (publish,
list peers, topics) share one kept-open connection, one request at a time (p2pd answers
requests on a connection in turn): a node publishes twice a step, and a new connection cost both
sides ~0.3 ms of CPU each time. A kept connection that fails is dropped and the request is sent
once more on a new one.

gossipsub drops messages over 1 MiB silently; we carry only small signed announcements and cap
them at ``max_message_bytes`` (1 KiB) on publish and on receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from hivemind.p2p import PeerID
from hivemind.proto import p2pd_pb2 as pb

from distronet.node.swarm.control import peer_id, read_delimited, write_delimited
from distronet.node.swarm.errors import DaemonError, GossipError
from distronet.node.swarm.p2p import SwarmHost, with_deadline

__all__ = ["MAX_GOSSIP_BYTES", "Gossip", "GossipMessage", "Subscription"]

MAX_GOSSIP_BYTES = 1024


@dataclass(frozen=True)
class GossipMessage:
    """One received gossip message. ``sender`` is the libp2p-authenticated origin (pubsub signing)."""

    topic: str
    data: bytes
    sender: PeerID
    seqno: bytes


class Subscription:
    """Messages on one topic, as an async iterator. Close it (or the ``Gossip``) to unsubscribe.

    A bounded queue sits between the daemon and the consumer: when the consumer falls behind,
    the oldest message is dropped (``dropped`` counts them); messages over the size cap are
    dropped too (``oversize`` counts them).
    """

    def __init__(
        self,
        topic: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        self_id: PeerID,
        include_own: bool,
        max_message_bytes: int,
        queue_size: int,
    ) -> None:
        self.topic = topic
        self._reader, self._writer = reader, writer
        self._self_id, self._include_own, self._max = self_id, include_own, max_message_bytes
        self._queue: asyncio.Queue[GossipMessage | None] = asyncio.Queue(queue_size)
        self.dropped = 0
        self.oversize = 0
        self._task = asyncio.create_task(self._pump(), name=f"gossip:{topic}")

    async def _pump(self) -> None:
        try:
            while True:
                raw = pb.PSMessage()
                await read_delimited(self._reader, raw)
                data = bytes(raw.data)
                if len(data) > self._max:
                    self.oversize += 1
                    continue
                sender = peer_id(bytes(getattr(raw, "from")))
                if sender == self._self_id and not self._include_own:
                    continue
                self._put(GossipMessage(self.topic, data, sender, bytes(raw.seqno)))
        except (asyncio.IncompleteReadError, ConnectionError, DaemonError):
            pass
        finally:
            self._put(None)

    def _put(self, item: GossipMessage | None) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            self.dropped += 1
        self._queue.put_nowait(item)

    async def get(self, timeout: float | None = None) -> GossipMessage:
        """Next message. Raises GossipError when the subscription ended, TimeoutError when late."""
        item = await asyncio.wait_for(self._queue.get(), timeout)
        if item is None:
            self._queue.put_nowait(None)  # stay ended for later callers
            raise GossipError(f"subscription to {self.topic!r} ended")
        return item

    def __aiter__(self) -> AsyncIterator[GossipMessage]:
        return self

    async def __anext__(self) -> GossipMessage:
        try:
            return await self.get()
        except GossipError:
            raise StopAsyncIteration from None

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 2.0)


class Gossip:
    """Gossipsub client of one node's p2pd. Every control call has a deadline."""

    def __init__(self, host: SwarmHost, *, max_message_bytes: int = MAX_GOSSIP_BYTES) -> None:
        self._host = host
        self._timeout = host.config.call_timeout_s
        self.max_message_bytes = max_message_bytes
        self._subs: set[Subscription] = set()
        self._kept: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._kept_lock = asyncio.Lock()
        self._closed = False  # close() ran: calls raise GossipError and open nothing

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new control connection. Raises GossipError when this client is closed, before or while
        it opens (a connection opened after ``close`` would be left to the collector)."""
        self._check_open()
        reader, writer = await self._connect()
        self._close_if_closed(writer)
        return reader, writer

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        path = self._host.control_path
        return await with_deadline(asyncio.open_unix_connection(path), self._timeout, "p2pd control connect")

    def _check_open(self) -> None:
        if self._closed:
            raise GossipError("the gossip client is closed")

    def _close_if_closed(self, writer: asyncio.StreamWriter) -> None:
        """Close ``writer`` and raise GossipError when ``close`` ran while it was being opened."""
        if self._closed:
            writer.close()
            self._check_open()

    async def _ask(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ps: pb.PSRequest
    ) -> pb.Response:
        """Send one pubsub request on a control connection and read its response, each within
        the call timeout. Raises DaemonError (p2pd silent) or what the connection raises."""
        await with_deadline(
            write_delimited(writer, pb.Request(type=pb.Request.PUBSUB, pubsub=ps)), self._timeout, "pubsub"
        )
        resp = pb.Response()
        await with_deadline(read_delimited(reader, resp), self._timeout, "pubsub response")
        return resp

    async def _request(
        self, ps: pb.PSRequest, *, keep_open: bool = False
    ) -> tuple[pb.Response, asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self._open()
        try:
            resp = await self._ask(reader, writer, ps)
        except BaseException:
            writer.close()
            raise
        if not keep_open:
            writer.close()
        if resp.type == pb.Response.ERROR:
            writer.close()
            raise GossipError(f"p2pd refused pubsub request: {resp.error.msg}")
        return resp, reader, writer

    async def _call(self, ps: pb.PSRequest) -> pb.Response:
        """One request/response on the kept-open control connection (opened on first use; on a
        failure it is closed and the request sent once more on a new one). Raises GossipError
        (refused), DaemonError (p2pd unreachable or silent)."""
        async with self._kept_lock:
            for attempt in (0, 1):
                fresh = self._kept is None
                if self._kept is None:
                    self._kept = await self._open()
                try:
                    resp = await self._ask(*self._kept, ps)
                except BaseException as e:
                    self._drop_kept()
                    if fresh or attempt or not isinstance(e, (ConnectionError, asyncio.IncompleteReadError)):
                        raise
                    continue
                if resp.type == pb.Response.ERROR:
                    raise GossipError(f"p2pd refused pubsub request: {resp.error.msg}")
                return resp
        raise AssertionError("unreachable")  # pragma: no cover

    def _drop_kept(self) -> None:
        if self._kept is not None:
            self._kept[1].close()
            self._kept = None

    async def publish(self, topic: str, data: bytes) -> None:
        """Publish ``data`` (at most ``max_message_bytes``) to ``topic``. Raises GossipError."""
        if len(data) > self.max_message_bytes:
            raise GossipError(
                f"gossip message of {len(data)} bytes is over the {self.max_message_bytes}-byte cap; "
                "announce the payload's hash and pull it over a stream"
            )
        await self._call(pb.PSRequest(type=pb.PSRequest.PUBLISH, topic=topic, data=data))

    async def subscribe(
        self, topic: str, *, include_own: bool = False, queue_size: int = 1024
    ) -> Subscription:
        """Subscribe to ``topic``; our own messages are skipped unless ``include_own``."""
        _, reader, writer = await self._request(
            pb.PSRequest(type=pb.PSRequest.SUBSCRIBE, topic=topic), keep_open=True
        )
        self._close_if_closed(writer)  # closed while p2pd answered: close() never saw this subscription
        sub = Subscription(
            topic,
            reader,
            writer,
            self_id=self._host.peer_id,
            include_own=include_own,
            max_message_bytes=self.max_message_bytes,
            queue_size=queue_size,
        )
        self._subs.add(sub)
        return sub

    async def topics(self) -> list[str]:
        """Topics this node is subscribed to (as the daemon sees it)."""
        resp = await self._call(pb.PSRequest(type=pb.PSRequest.GET_TOPICS))
        return list(resp.pubsub.topics)

    async def topic_peers(self, topic: str) -> list[PeerID]:
        """Peers the daemon knows to be subscribed to ``topic``."""
        resp = await self._call(pb.PSRequest(type=pb.PSRequest.LIST_PEERS, topic=topic))
        return [peer_id(bytes(p)) for p in resp.pubsub.peerIDs]

    async def close(self) -> None:
        """Close every subscription opened through this client, and the kept connection. Calls
        from now on, and those still opening a connection, raise GossipError."""
        self._closed = True
        self._drop_kept()
        subs, self._subs = self._subs, set()
        for sub in subs:
            await sub.close()
