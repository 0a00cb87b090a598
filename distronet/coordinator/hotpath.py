"""A hand-written HTTP/1.1 way in for the four hot node routes, aiohttp for everything else.

Heartbeat, lease, renew and complete are nearly all of a coordinator's traffic, and aiohttp's
per-request machinery (llhttp with a Python callback per header, a request object, a task per
request, a response object, header preparation, a stream writer) cost more than the call's own
work. :class:`HotSite` listens like aiohttp's ``TCPSite`` but starts every connection on
:class:`HotProtocol`, which parses a request head itself and, when it is a plain hot call,
runs the route's pipeline steps (the very methods aiohttp's way runs:
:meth:`CoordinatorApp.admit`, ``node_headers``, ``verify_node``, the schema, the operation),
waits for durability with a done-callback on the group commit (no task), and writes one
prebuilt answer.

Anything else hands the connection, with every byte buffered so far, to an aiohttp request
handler of the same server (``transport.set_protocol``), which then keeps it and serves
everything on it through the app's router (hot routes included, with the same pipeline): every
other route, the dashboard, the OpenAPI document, and anything unusual about a request (HTTP/1.0, a
query, percent-escapes, ``Transfer-Encoding``, ``Expect``, ``Upgrade``, a repeated
``Content-Length``, non-ASCII bytes, a malformed or over-long head) take aiohttp's path
unchanged. A declared body over the route's limit is answered 413 at once and the
connection closed without reading it. A request head must arrive whole within the
configured ``head_timeout_s`` of its first byte and its body within ``body_timeout_s`` of the
head: absolute deadlines that new bytes do not extend (a byte every few seconds cannot hold a
connection), checked by the idle sweep. One IP address may hold ``max_conns_per_ip``
connections at once, handed-over ones included; a further one is closed as it opens.
Requests on one connection are answered in order, one at a time (pipelined ones wait in the
buffer; reading pauses when it grows).

Cost: about 40 µs of parsing and writing per hot call in place of aiohttp's ~150 µs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from multidict import CIMultiDict

from distronet.coordinator import handlers
from distronet.coordinator.routes import HOT, JSON, ROUTES, Ctx, Route, encode_json, parse_json
from distronet.coordinator.trace import TRACE
from distronet.protocol.coordinator_api import API_PREFIX, ApiError, ApiErrorCode

if TYPE_CHECKING:
    from distronet.coordinator.app import CoordinatorApp

__all__ = ["HotProtocol", "HotSite", "match_hot", "parse_head"]

log = logging.getLogger(__name__)

MAX_HEAD = 8190  # aiohttp's own line limit: a head we take is never one aiohttp would refuse
IDLE_TIMEOUT_S = 75.0  # aiohttp's keep-alive timeout: a connection silent this long is closed
SWEEP_EVERY_S = 5.0
_HEAD_END = b"\r\n\r\n"
_TARGET = re.compile(r"/[!-~]*")
# Header lines: a token, a colon, visible ASCII, space or tab (no obs-fold, no control bytes).
_HEADERS = re.compile(r"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t -~]*\r\n)*")
_HANDED_OVER = ("transfer-encoding", "expect", "upgrade")


_PREFIX = [*API_PREFIX.split("/"), "runs"]  # "", "api", "v1", "runs"
_N = len(_PREFIX)
_ONE = {"heartbeat": "heartbeat", "leases": "lease"}  # .../runs/{run_id}/<this>
_TWO = {"renew": "renew", "complete": "complete"}  # .../runs/{run_id}/leases/{unit}/<this>


def _segment_ok(seg: str) -> bool:
    # What the router's ``{name}`` matches: one non-empty segment without braces; never a dot
    # segment (URL normalisation would remove it before routing).
    return bool(seg) and "{" not in seg and "}" not in seg and seg not in (".", "..")


def match_hot(method: str, raw_path: str) -> tuple[str, dict[str, str]] | None:
    """``(route name, path parameters)`` when ``method raw_path`` is a hot route, else None.

    Only plain paths qualify (no ``%`` escapes, no query), so the parameters are exactly what
    aiohttp's router would extract from the same request.
    """
    if method != "POST" or "%" in raw_path or "?" in raw_path:
        return None
    parts = raw_path.split("/")
    n = len(parts)
    if n == _N + 2:
        name = _ONE.get(parts[-1])
    elif n == _N + 4 and parts[_N + 1] == "leases":
        name = _TWO.get(parts[-1])
    else:
        return None
    if name is None or parts[:_N] != _PREFIX or not _segment_ok(parts[_N]):
        return None
    if n == _N + 2:
        return name, {"run_id": parts[_N]}
    if not _segment_ok(parts[_N + 2]):
        return None
    return name, {"run_id": parts[_N], "unit": parts[_N + 2]}


def _status_line(status: int) -> bytes:
    return f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode()


_STATUS = {s.value: _status_line(s.value) for s in HTTPStatus if 200 <= s.value < 600}
_date_cache: list[Any] = [0, b""]


def _date_line() -> bytes:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
    return cast(bytes, _date_cache[1])


def _answer(status: int, payload: bytes, extra: bytes) -> bytes:
    return b"%sContent-Type: application/json\r\nContent-Length: %d\r\n%s%s\r\n%s" % (
        _STATUS.get(status) or _status_line(status),
        len(payload),
        _date_line(),
        extra,
        payload,
    )


_HEARTBEAT_KEYS = frozenset(("renewed", "peers_live", "step"))
_HEARTBEAT_CRED_KEYS = _HEARTBEAT_KEYS | {"credential"}  # with a membership credential (base64)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_COMPLETE_KEYS = frozenset(("unit", "credited", "tokens"))


def _encode_answer(obj: Any) -> bytes:
    """``obj`` as compact JSON, like :func:`encode_json`; the heartbeat and completion answers
    (most hot calls; ints and a bool only) by one %-format instead of the JSON encoder."""
    if type(obj) is dict and len(obj) == 3:
        keys = obj.keys()
        if keys == _HEARTBEAT_KEYS:
            r, p, s = obj["renewed"], obj["peers_live"], obj["step"]
            if type(r) is int and type(p) is int and type(s) is int:
                return b'{"renewed":%d,"peers_live":%d,"step":%d}' % (r, p, s)
        elif keys == _COMPLETE_KEYS:
            u, c, t = obj["unit"], obj["credited"], obj["tokens"]
            if type(u) is int and type(c) is bool and type(t) is int:
                return b'{"unit":%d,"credited":%s,"tokens":%d}' % (u, b"true" if c else b"false", t)
    elif type(obj) is dict and obj.keys() == _HEARTBEAT_CRED_KEYS:
        r, p, s, c = obj["renewed"], obj["peers_live"], obj["step"], obj["credential"]
        if type(r) is int and type(p) is int and type(s) is int and type(c) is str and _BASE64.fullmatch(c):
            return b'{"renewed":%d,"peers_live":%d,"step":%d,"credential":"%s"}' % (r, p, s, c.encode())
    return encode_json(obj).encode()


class _Head:
    """A parsed hot request head."""

    __slots__ = ("close", "headers", "length", "name", "params", "path", "trace")

    def __init__(
        self,
        name: str,
        params: dict[str, str],
        path: str,
        headers: CIMultiDict[str],
        length: int,
        close: bool,
    ) -> None:
        self.name, self.params, self.path = name, params, path
        self.headers, self.length, self.close = headers, length, close
        self.trace: list[Any] | None = None


def parse_head(head: bytes) -> _Head | None:
    """The hot call in ``head`` (the bytes before the blank line), or None for anything aiohttp
    should handle. Cost: a few µs (one regex over the header block, one split)."""
    if len(head) > MAX_HEAD or not head.isascii():
        return None
    text = head.decode("ascii")
    first, sep, rest = text.partition("\r\n")
    parts = first.split(" ")
    if len(parts) != 3 or parts[2] != "HTTP/1.1" or not _TARGET.fullmatch(parts[1]):
        return None
    hit = match_hot(parts[0], parts[1])
    if hit is None:
        return None
    block = rest + "\r\n" if sep else ""
    if not _HEADERS.fullmatch(block):
        return None
    headers: CIMultiDict[str] = CIMultiDict()
    for line in block.split("\r\n")[:-1]:
        k, _, v = line.partition(":")
        headers.add(k, v.strip(" \t"))
    for k in _HANDED_OVER:
        if k in headers:
            return None
    lengths = headers.getall("Content-Length", ())
    if len(lengths) > 1 or (lengths and not (0 < len(lengths[0]) <= 18 and lengths[0].isdigit())):
        return None
    conn = headers.get("Connection", "").lower()
    if "upgrade" in conn:
        return None
    length = int(lengths[0]) if lengths else 0
    return _Head(hit[0], hit[1], parts[1], headers, length, "close" in conn)


class _Shared:
    """What every connection of one site shares: the app, aiohttp's server, the live
    connections (for shutdown), the hot routes' steps."""

    def __init__(self, app: CoordinatorApp, runner: web.BaseRunner) -> None:
        self.app = app
        self.runner = runner
        self.conns: set[HotProtocol] = set()
        self.per_ip: dict[str | None, int] = {}  # open connections per remote address
        cfg = app.cfg
        self.head_timeout, self.body_timeout = cfg.head_timeout_s, cfg.body_timeout_s
        self.max_per_ip = cfg.max_conns_per_ip
        self.refused = 0  # connections closed at once: their IP was at max_conns_per_ip
        self.stopping = False
        self.drained = asyncio.Event()
        self.hot_calls = 0  # requests answered on the hot path
        self.handed_over = 0  # connections given to aiohttp
        self.routes: dict[str, tuple[Route, Any, int]] = {
            r.name: (r, getattr(handlers, r.name), app.route_limit(r)) for r in ROUTES if r.name in HOT
        }

    def gone(self, conn: HotProtocol) -> None:
        self.conns.discard(conn)
        if self.stopping and not self.conns:
            self.drained.set()

    def admit_ip(self, ip: str | None) -> bool:
        """Count one more connection from ``ip``; False (not counted) when it is at the cap."""
        n = self.per_ip.get(ip, 0)
        if n >= self.max_per_ip:
            self.refused += 1
            return False
        self.per_ip[ip] = n + 1
        return True

    def release_ip(self, ip: str | None) -> None:
        n = self.per_ip.get(ip, 0) - 1
        if n > 0:
            self.per_ip[ip] = n
        else:
            self.per_ip.pop(ip, None)


class _Counted(asyncio.Protocol):
    """aiohttp's handler of a handed-over connection, which still counts against its IP's cap
    until it closes (aiohttp's handler has slots: it is wrapped, not patched)."""

    def __init__(self, inner: asyncio.Protocol, shared: _Shared, ip: str | None) -> None:
        self.inner, self.shared, self.ip = inner, shared, ip

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.shared.release_ip(self.ip)
        self.inner.connection_lost(exc)


class HotProtocol(asyncio.Protocol):
    """One client connection, on the hot path until a request needs aiohttp (see the module)."""

    def __init__(self, shared: _Shared) -> None:
        self.shared = shared
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.buf = bytearray()
        self.busy = False  # a call is waiting for its commit
        self.paused = False
        self.heard = time.monotonic()  # last bytes received (idle connections are closed)
        self.deadline = 0.0  # the request in the buffer must be whole by then (0: none pending)
        self.in_body = False  # its head is parsed; the deadline is the body's
        self.counted = False  # counted in shared.per_ip
        self.recv = 0.0  # perf_counter when the buffer's first bytes arrived (trace only)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, (tuple, list)) and peer else None
        if not self.shared.admit_ip(self.remote):
            self.transport = None
            transport.close()
            return
        self.counted = True
        self.shared.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.shared.gone(self)
        if self.counted:
            self.counted = False
            self.shared.release_ip(self.remote)

    def data_received(self, data: bytes) -> None:
        self.heard = time.monotonic()
        if not self.deadline:
            self.deadline = self.heard + self.shared.head_timeout
        if TRACE.on and not self.buf:
            self.recv = time.perf_counter()
        self.buf += data
        if self.busy:
            if len(self.buf) > 2 * MAX_HEAD and not self.paused and self.transport is not None:
                self.paused = True
                self.transport.pause_reading()
            return
        self._next()

    # ---------------------------------------------------------------- requests

    def _next(self) -> None:
        """Take the next complete request off the buffer (one at a time)."""
        buf = self.buf
        while not self.busy and self.transport is not None and buf:
            end = buf.find(_HEAD_END)
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._hand_over()
                return
            head = parse_head(bytes(buf[:end]))
            if head is None:
                self._hand_over()
                return
            route, op, limit = self.shared.routes[head.name]
            if head.length > limit or self.shared.app.closing:
                self._refuse(head, limit)
                return
            total = end + 4 + head.length
            if len(buf) < total:
                if not self.in_body:  # the body is still coming: its own deadline, set once
                    self.in_body = True
                    self.deadline = time.monotonic() + self.shared.body_timeout
                return
            body = bytes(buf[end + 4 : total])
            del buf[:total]
            self.in_body = False
            self.deadline = time.monotonic() + self.shared.head_timeout if buf else 0.0
            self._call(head, route, op, limit, body)
        if not self.busy and self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def _refuse(self, head: _Head, limit: int) -> None:
        """503 while shutting down, 413 for a body over the limit; then close (body unread)."""
        t0 = time.perf_counter()
        head.close = True
        try:
            self.shared.app.admit(head.length, limit)
            e = ApiError(ApiErrorCode.UNAVAILABLE, "the coordinator is shutting down; retry shortly")
        except ApiError as err:
            e = err
        self._error(head, t0, e)

    def _call(self, head: _Head, route: Route, op: Any, limit: int, body: bytes) -> None:
        app = self.shared.app
        t0 = time.perf_counter()
        self.shared.hot_calls += 1
        hdrs = head.headers
        status, payload = 500, b""

        def committed(err: BaseException | None) -> None:
            """The commit holding this call's writes ended: answer (called by the committer)."""
            self.busy = False
            if err is not None:
                e = err if isinstance(err, ApiError) else None
                self._error(head, t0, e or ApiError(ApiErrorCode.UNAVAILABLE, f"storage failed: {err}"))
            else:
                self._write(head.name, t0, status, payload, head.close)
                self._traced(head, status)
            self._next()

        try:
            app.admit(head.length, limit)
            now = app.clock()
            h = app.node_headers(route, hdrs, head.params, now)
            peer = app.verify_node(h, "POST", head.path, body, self.remote, now)
            if body:
                ct = hdrs.get("Content-Type")
                if ct != JSON and (ct is None or ct.partition(";")[0].strip().lower() != JSON):
                    raise ApiError(ApiErrorCode.UNSUPPORTED_MEDIA, "send the body as application/json")
            parsed = route.schema.validate(parse_json(body))  # type: ignore[union-attr]
            status, obj = op(app, Ctx(None, head.params, parsed, peer))
            payload = _encode_answer(obj)
            if TRACE.on:
                head.trace = [self.recv, t0, time.perf_counter(), app.committer.batch_of_waiter()]
            waits = app.committer.when_durable(committed)
        except ApiError as e:
            self._error(head, t0, e)
            return
        except Exception:
            log.exception("unexpected error in POST %s", head.path)
            self._error(head, t0, ApiError(ApiErrorCode.INTERNAL, "internal error; see the coordinator log"))
            return
        if waits:
            self.busy = True
        else:
            self._write(head.name, t0, status, payload, head.close)
            self._traced(head, status)

    @staticmethod
    def _traced(head: _Head, status: int) -> None:
        if head.trace is not None and TRACE.on:
            h = head.headers
            TRACE.call(
                head.name,
                *head.trace,
                time.perf_counter(),
                status,
                h.get("X-Distro-Peer"),
                h.get("X-Distro-Nonce"),
            )

    def _error(self, head: _Head, t0: float, e: ApiError) -> None:
        payload = encode_json(e.body()).encode()
        extra = b"Retry-After: 1\r\n" if e.code is ApiErrorCode.RATE_LIMITED else b""
        self._write(head.name, t0, e.code.http_status, payload, head.close, extra)

    def _write(
        self, route: str, t0: float, status: int, payload: bytes, close: bool, extra: bytes = b""
    ) -> None:
        self.shared.app.metrics.observe(route, status, time.perf_counter() - t0)
        t = self.transport
        if t is None:
            return
        close = close or self.shared.stopping
        t.write(_answer(status, payload, extra + b"Connection: close\r\n" if close else extra))
        if close:
            t.close()
            self.transport = None
            self.shared.gone(self)

    # ---------------------------------------------------------------- aiohttp

    def _hand_over(self) -> None:
        """Give this connection and its buffered bytes to aiohttp (for good)."""
        t = self.transport
        assert t is not None and not self.busy
        server = self.shared.runner.server
        assert server is not None
        handler = server()
        self.transport = None
        self.shared.handed_over += 1
        self.shared.gone(self)
        if self.counted:  # the count moves to the wrapper, released when aiohttp's side closes
            self.counted = False
            wrapped: asyncio.Protocol = _Counted(handler, self.shared, self.remote)
        else:
            wrapped = handler
        t.set_protocol(wrapped)
        wrapped.connection_made(t)
        if self.paused:
            self.paused = False
            t.resume_reading()
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            handler.data_received(data)

    def close_if_idle(self) -> None:
        if not self.busy and self.transport is not None:
            t, self.transport = self.transport, None
            t.close()
            self.shared.gone(self)


class HotSite(web.BaseSite):
    """aiohttp's TCP site, with connections starting on :class:`HotProtocol` for ``app``.

    Start after ``await runner.setup()``; ``runner.cleanup()`` stops it: the listener closes,
    idle connections close, busy ones close once answered (within ``shutdown_timeout``).
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        app: CoordinatorApp,
        host: str,
        port: int,
        *,
        backlog: int = 128,
        reuse_address: bool | None = None,
        shutdown_timeout: float = 60.0,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._hot = _Shared(app, runner)
        self._host, self._port, self._reuse = host, port, reuse_address
        self._timeout = shutdown_timeout
        self._bound: int | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def hot_calls(self) -> int:
        """Requests answered on the hand-written path so far."""
        return self._hot.hot_calls

    @property
    def handed_over(self) -> int:
        """Connections handed to aiohttp so far."""
        return self._hot.handed_over

    @property
    def port(self) -> int:
        """The bound port (the requested one before start)."""
        return self._bound if self._bound is not None else self._port

    async def start(self) -> None:
        await super().start()
        shared = self._hot
        server = await asyncio.get_running_loop().create_server(
            lambda: HotProtocol(shared),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse,
        )
        self._server = server
        self._bound = server.sockets[0].getsockname()[1] if server.sockets else self._port
        self._sweeper = asyncio.create_task(self._sweep(), name="hot-idle-sweep")

    async def _sweep(self) -> None:
        """Close connections silent for IDLE_TIMEOUT_S, or past their request's head or body
        deadline, with no call in flight (every SWEEP_EVERY_S, or a quarter of the shorter
        deadline when that is less)."""
        shared = self._hot
        every = min(SWEEP_EVERY_S, shared.head_timeout / 4, shared.body_timeout / 4)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            old = now - IDLE_TIMEOUT_S
            for conn in [c for c in shared.conns if c.heard < old or 0 < c.deadline < now]:
                conn.close_if_idle()

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await super().stop()
        shared = self._hot
        shared.stopping = True
        for conn in list(shared.conns):
            conn.close_if_idle()
        if shared.conns:
            try:
                await asyncio.wait_for(shared.drained.wait(), self._timeout)
            except asyncio.TimeoutError:
                for conn in list(shared.conns):
                    if conn.transport is not None:
                        conn.transport.close()
