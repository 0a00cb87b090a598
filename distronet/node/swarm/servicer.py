"""The one seam through which the node serves and asks its direct-stream protocols.

A module that serves a protocol describes it once, as a :class:`StreamRoute`: the protocol id,
the fixed size of its requests, a typed async handler, how long a request may take to arrive
and to be answered, and whether more requests may follow on the same stream. It registers the
route with a :class:`StreamServicer` (one per owner; ``close`` unregisters what it added).
The servicer owns the framing and the error mapping for every route:

- it reads exactly ``request_bytes`` (within ``read_s``; ``idle_s`` between requests of a
  reused stream); a stream that ends cleanly between requests is done, one that ends inside a
  request is ``TRUNCATED``;
- it calls ``handler(call)``; the handler decodes ``call.request`` with its ``protocol/`` codec
  and returns the answer's bytes (written and drained by the servicer) or None when it wrote
  the answer itself (a large body through an upload budget: ``call.write``/``call.drain``);
  handling and answering one request take at most ``deadline_s``;
- ``Rejected`` from a handler closes the stream, counted in ``rejected`` by code; a late or
  vanished asker (timeout, incomplete read, ``ConnectionError``) closes it quietly; any other
  error is a bug in this node, logged with its traceback, and closes the stream — nothing
  escapes into p2pd's stream dispatch. The stream is closed on every path;
- every peer is held to its :class:`PeerQuota` (``StreamLimits.serve_*``): requests per window
  and streams at once, per protocol, and bytes answered per window (a share of the upload
  budget, when the owner passes one). A peer past any of them is refused ``LIMIT_EXCEEDED``
  (the stream closes, nothing more is sent) while other peers are still served.

The asking side: :func:`ask` opens a stream, sends one request and reads one answer with a
reader coroutine built of ``protocol/`` decoders, within one deadline, mapping failures to
``StreamError`` (and decoders' ``Rejected``); :func:`open_stream` is the raw open for a client
that keeps streams (``pull``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from distronet.node.swarm import control
from distronet.node.swarm.errors import DaemonError, StreamError
from distronet.node.swarm.hivemind_shim import PeerID, StreamInfo
from distronet.node.swarm.p2p import SwarmHost, with_deadline
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.limits import DEFAULT_STREAM_LIMITS, StreamLimits

__all__ = [
    "PeerQuota",
    "StreamCall",
    "StreamHandler",
    "StreamRoute",
    "StreamServicer",
    "ask",
    "open_stream",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
_MAX_TRACKED = 4096  # peers remembered per quota; past it, windows that ended are forgotten


class _Window:
    __slots__ = ("bytes", "requests", "start")

    def __init__(self, start: float) -> None:
        self.start, self.requests, self.bytes = start, 0, 0


class PeerQuota:
    """What one peer may ask of one servicer (module doc). ``upload_rate``/``upload_burst``:
    the upload budget that bytes are a share of (None or inf: bytes are not capped). O(1)."""

    def __init__(
        self,
        limits: StreamLimits = DEFAULT_STREAM_LIMITS,
        *,
        upload_rate: float | None = None,
        upload_burst: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits, self._clock = limits, clock
        budget = math.inf if upload_rate is None else upload_rate * limits.serve_window_s + upload_burst
        self.max_bytes = budget * limits.serve_upload_share_pct / 100
        self._windows: dict[bytes, _Window] = {}
        self._active: Counter[bytes] = Counter()

    def _window(self, peer: bytes) -> _Window:
        now = self._clock()
        w = self._windows.get(peer)
        if w is None or now - w.start >= self.limits.serve_window_s:
            if len(self._windows) >= _MAX_TRACKED:
                span = self.limits.serve_window_s
                self._windows = {p: v for p, v in self._windows.items() if now - v.start < span}
                if len(self._windows) >= _MAX_TRACKED:
                    raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {_MAX_TRACKED} peers served this window")
            w = self._windows[peer] = _Window(now)
        return w

    @contextlib.contextmanager
    def stream(self, peer: bytes) -> Iterator[None]:
        """Hold one of ``peer``'s concurrent streams. Raises Rejected(LIMIT_EXCEEDED)."""
        if self._active[peer] >= self.limits.serve_concurrent_per_peer:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {self.limits.serve_concurrent_per_peer} streams")
        self._active[peer] += 1
        try:
            yield
        finally:
            self._active[peer] -= 1
            if not self._active[peer]:
                del self._active[peer]

    def request(self, peer: bytes) -> None:
        """Count one request of ``peer``. Raises Rejected(LIMIT_EXCEEDED) past the window's."""
        w = self._window(peer)
        if w.requests >= self.limits.serve_requests_per_window:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over {w.requests} requests this window")
        w.requests += 1

    def spend(self, peer: bytes, nbytes: int) -> None:
        """Count ``nbytes`` answered to ``peer``. Raises Rejected(LIMIT_EXCEEDED), counting
        nothing, when they would take it past its share of the upload budget this window."""
        w = self._window(peer)
        if w.bytes + nbytes > self.max_bytes:
            raise Rejected(RejectCode.LIMIT_EXCEEDED, f"over its upload share ({self.max_bytes:.0f} bytes)")
        w.bytes += nbytes


class StreamCall:
    """One request on a served stream: who asked, what, and the stream to answer on."""

    def __init__(
        self,
        peer: PeerID | None,
        request: bytes,
        writer: asyncio.StreamWriter,
        quota: PeerQuota | None = None,
    ) -> None:
        self.peer, self.request, self._writer, self._quota = peer, request, writer, quota
        self._prepaid = 0

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` of answer against the asker's upload share before writing them (the
        writes that follow are not counted again). Raises Rejected(LIMIT_EXCEEDED)."""
        if self._quota is not None and self.peer is not None:
            self._quota.spend(self.peer.to_bytes(), nbytes)
        self._prepaid += nbytes

    def write(self, data: bytes | memoryview) -> None:
        """Queue answer bytes, counted against the asker's upload share unless charged already.
        Raises ConnectionResetError when the asker has closed the stream, Rejected(LIMIT_EXCEEDED)
        when the bytes would take it past its share (nothing is written)."""
        paid = min(self._prepaid, len(data))
        if len(data) > paid:
            self.charge(len(data) - paid)
        self._prepaid -= len(data)
        control.write_stream(self._writer, data)

    async def drain(self) -> None:
        """Wait until the queued bytes are handed to p2pd (flow control)."""
        await self._writer.drain()


StreamHandler = Callable[[StreamCall], Awaitable[bytes | None]]
"""``await handler(call)``: the answer's bytes, or None when the handler wrote it itself."""


@dataclass(frozen=True)
class StreamRoute:
    """How one protocol is served (module doc)."""

    protocol: str
    request_bytes: int
    handler: StreamHandler
    read_s: float = 10.0
    """How long the first request may take to arrive."""
    deadline_s: float = 10.0
    """How long handling one request and writing its answer may take."""
    idle_s: float | None = None
    """None: one request per stream. Else more may follow, each within this many seconds."""


class StreamServicer:
    """The routes one owner serves on one host. ``host`` None: routes can be served on any
    stream pair (:meth:`handle`, tests) but not registered with p2pd."""

    def __init__(self, host: SwarmHost | None, quota: PeerQuota | None = None) -> None:
        self.host = host
        self.quota = PeerQuota() if quota is None else quota
        self.routes: dict[str, StreamRoute] = {}
        self.served: Counter[str] = Counter()  # requests answered, by protocol
        self.rejected: Counter[RejectCode] = Counter()  # requests refused, by code
        self.failed = 0  # handler bugs (logged)

    async def add(self, route: StreamRoute) -> None:
        """Serve ``route`` on the host's p2pd from now on. Raises DaemonError (p2pd refused or
        ran past ``call_timeout_s``) or ValueError (this servicer already serves that protocol)."""
        if self.host is None:
            raise ValueError("a servicer without a host cannot register routes")
        if route.protocol in self.routes:
            raise ValueError(f"{route.protocol} is already served here")

        async def on_stream(
            info: StreamInfo, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await self.handle(self.routes.get(route.protocol, route), info.peer_id, reader, writer)

        await with_deadline(
            self.host.p2p.add_binary_stream_handler(route.protocol, on_stream),
            self.host.config.call_timeout_s,
            f"register {route.protocol}",
        )
        self.routes[route.protocol] = route

    def update(self, route: StreamRoute) -> None:
        """Serve streams opened from now on by ``route``, which replaces the one of its protocol
        added here (new timeouts; streams already open keep the old). Raises KeyError when
        that protocol was not added."""
        if route.protocol not in self.routes:
            raise KeyError(route.protocol)
        self.routes[route.protocol] = route

    async def close(self) -> None:
        """Stop serving every route added here (nothing to do with p2pd once it is gone)."""
        routes, self.routes = self.routes, {}
        if self.host is None or not self.host.alive:
            return
        for protocol in routes:
            with contextlib.suppress(Exception):
                await with_deadline(
                    self.host.p2p.remove_binary_stream_handler(protocol),
                    self.host.config.close_timeout_s,
                    f"unregister {protocol}",
                )

    async def handle(
        self,
        route: StreamRoute,
        peer: PeerID | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Serve ``route`` on one stream until it is done (module doc); closes the stream."""
        try:
            with self._held(peer):
                await self._serve(route, peer, reader, writer)
        except Rejected as e:
            self.rejected[e.code] += 1
            log.debug("%s from %s refused: %s", route.protocol, peer, e)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            log.debug("%s from %s not served: %r", route.protocol, peer, e)
        except Exception:
            self.failed += 1
            log.exception("%s handler failed on a request from %s", route.protocol, peer)
        finally:
            writer.close()

    def _held(self, peer: PeerID | None) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if peer is None else self.quota.stream(peer.to_bytes())

    async def _serve(
        self,
        route: StreamRoute,
        peer: PeerID | None,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        wait = route.read_s
        while True:
            try:
                request = await asyncio.wait_for(reader.readexactly(route.request_bytes), wait)
            except asyncio.IncompleteReadError as e:
                if e.partial:
                    raise Rejected(RejectCode.TRUNCATED, f"{route.protocol} request ends early") from None
                return  # the asker is done with this stream
            if peer is not None:
                self.quota.request(peer.to_bytes())
            call = StreamCall(peer, request, writer, self.quota)
            await asyncio.wait_for(self._answer(route, call), route.deadline_s)
            self.served[route.protocol] += 1
            if route.idle_s is None:
                return
            wait = route.idle_s

    @staticmethod
    async def _answer(route: StreamRoute, call: StreamCall) -> None:
        answer = await route.handler(call)
        if answer is not None:
            call.write(answer)
        await call.drain()


async def open_stream(
    host: SwarmHost, peer: PeerID, protocol: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new stream to ``peer`` speaking ``protocol`` (within ``call_timeout_s``). Raises
    DaemonError (refused: unreachable peer, no handler; or late)."""
    return await control.open_stream(host.control_path, peer, protocol, host.config.call_timeout_s)


async def ask(
    control_path: str,
    peer: PeerID,
    protocol: str,
    request: bytes,
    read: Callable[[asyncio.StreamReader], Awaitable[T]],
    timeout: float,
) -> T:
    """Send ``request`` to ``peer`` on a new ``protocol`` stream (through the p2pd whose control
    socket is ``control_path``: ``SwarmHost.control_path``) and return ``await read(reader)``,
    all within ``timeout`` seconds; the stream is closed on every path.

    Raises:
        Rejected: the answer broke the protocol (``read``'s decoders), or the stream ended inside
            it (TRUNCATED).
        StreamError: no stream could be opened, ``timeout`` passed, or the stream broke.
    """

    async def exchange() -> T:
        reader, writer = await control.open_stream(control_path, peer, protocol, timeout)
        try:
            writer.write(request)
            await writer.drain()
            return await read(reader)
        finally:
            writer.close()

    who = peer.to_base58()
    try:
        return await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        raise StreamError(f"{protocol} ask to {who} took over {timeout:.1f} s") from None
    except asyncio.IncompleteReadError:
        raise Rejected(RejectCode.TRUNCATED, f"{protocol} answer ends early", peer_id=who) from None
    except (DaemonError, OSError) as e:  # ConnectionError is an OSError
        raise StreamError(f"{protocol} ask to {who} failed: {e}") from e
