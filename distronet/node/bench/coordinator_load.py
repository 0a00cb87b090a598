"""The load generator of `distro-node bench coordinator`: lean, open-loop, honest.

It stands in for thousands of remote nodes, so it must cost the (shared) CPU far less than the
coordinator it measures. Each keep-alive connection is a bare :class:`asyncio.Protocol` that
writes one whole HTTP/1.1 request and parses the answer's status line, ``Content-Length`` and
``Connection`` header itself; no client library, no task per request. Every request is still a
real, authenticated node call over TCP: heartbeat (renews the node's leases), lease, or
complete (of a lease the node holds), with fresh time and nonce headers and a session MAC
(``auth="session"``: HMAC-SHA256 under the node's session key, :mod:`coordinator_session`) or
an Ed25519 signature (``auth="signature"``: heartbeats and leases pre-signed before the phase,
completions signed when sent). Every answer is checked: status 200 and a JSON body of the
expected shape (a completion must be credited), else it counts as an error.

Requests are *scheduled* at ``rate`` per second from the phase's start. A due request takes
the first idle connection, or waits in line for one; its latency runs from the scheduled time
to the last byte of the answer, so neither a slow server nor a busy generator can hide delay
(no coordinated omission). ``send_lag`` records how late each request actually left.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import hmac
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from distronet.protocol.coordinator_api import request_message, sign_request

__all__ = ["LoadStats", "Peer", "run_load"]

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 16 * 1024
_TICK_S = 0.001  # the scheduler's period (libuv timers have 1 ms resolution: no shorter sleeps)


@dataclass
class Peer:
    """One simulated node: its identity, the leases it holds, its session (if any)."""

    ident: Any
    held: list[dict[str, Any]] = field(default_factory=list)
    session: Any = None  # protocol.coordinator_session.SessionKey under auth="session"
    nonces: int = 0  # nonces are a per-peer counter: unique, and cheaper than random ones
    prefix: str = ""  # the peer's constant header lines
    keyed: Any = None  # hmac.HMAC keyed with the session key

    def next_nonce(self) -> str:
        self.nonces += 1
        return f"b{self.nonces:015d}"


@dataclass
class LoadStats:
    """What one phase measured (seconds)."""

    lat: list[float] = field(default_factory=list)
    send_lag: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    codes: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    started: float = 0.0  # perf_counter of the schedule's start (connections already open)
    finished: float = 0.0  # perf_counter of the last answer (or of giving up on the rest)
    trace: list[tuple[Any, ...]] | None = None  # (peer, nonce, kind, scheduled, sent, answered, status)

    def error(self, code: str) -> None:
        self.errors += 1
        self.codes[code] = self.codes.get(code, 0) + 1


@dataclass(slots=True)
class _Call:
    i: int  # index in the phase
    kind: str
    peer: Peer
    scheduled: float
    sent: float = 0.0
    nonce: str = ""


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request in flight at a time."""

    def __init__(self, gen: _Generator) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.call: _Call | None = None
        self.failure = "ConnectionLost"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def send(self, call: _Call, data: bytes) -> None:
        assert self.transport is not None
        self.call = call
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(_HEAD_END)
        if end < 0:
            if len(self.buf) > _MAX_HEAD:
                self._fail("BadResponse")
            return
        head = bytes(self.buf[:end]).lower()
        try:
            status, length = int(head[9:12]), _content_length(head)
        except ValueError:
            self._fail("BadResponse")
            return
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        call, self.call = self.call, None
        close = b"\r\nconnection: close" in head
        if close and self.transport is not None:
            self.transport.close()
        if call is not None:
            self.gen.answered(self, call, status, body, close)

    def _fail(self, code: str) -> None:
        self.failure = code
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        call, self.call = self.call, None
        self.gen.lost(self, call, self.failure)


def _content_length(head: bytes) -> int:
    """The Content-Length of a lower-cased response head (0 when absent). Raises ValueError."""
    i = head.find(b"\r\ncontent-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i + 2)
    n = int(head[i + 17 : j if j >= 0 else len(head)])
    if not 0 <= n <= 1 << 20:
        raise ValueError(n)
    return n


class _Generator:
    def __init__(
        self, host: str, port: int, run_id: str, peers: list[Peer], rate: float, conns: int, auth: str
    ) -> None:
        self.host, self.port, self.rate, self.n_conns = host, port, rate, conns
        self.peers = peers
        self.base = f"/api/v1/runs/{run_id}"
        self.idle: deque[_Conn] = deque()
        self.waiting: deque[_Call] = deque()
        self.stats = LoadStats()
        self.counter = 0
        self.last_answer = 0.0
        self.inflight = 0
        self.connecting = 0
        self.auth = auth
        self.signed: dict[int, dict[str, str]] = {}  # call index -> pre-signed headers
        for p in peers:
            p.prefix = (
                f"Host: {host}\r\nContent-Type: application/json\r\nX-Distro-Peer: {p.ident.peer_id_b58}\r\n"
            )
            if p.session is not None:
                p.prefix += f"X-Distro-Session: {p.session.session_id}\r\n"
                p.keyed = hmac.new(p.session.key, digestmod=hashlib.sha256)

    # ------------------------------------------------------------ requests

    def _plan(self, i: int) -> tuple[str, Peer]:
        """Call ``i`` of the phase: its peer (round robin) and kind (heartbeat and lease rounds
        alternate; a lease round completes a held lease instead where the peer has one)."""
        peers = self.peers
        p = peers[i % len(peers)]
        return ("lease" if (i // len(peers)) % 2 else "heartbeat"), p

    def presign(self, n: int) -> None:
        """Sign the first ``n`` heartbeats and leases of the phase ahead (auth="signature")."""
        for i in range(n):
            kind, p = self._plan(i)
            path, body = self._path_body(kind, p, i)
            self.signed[i] = sign_request(p.ident, "POST", path, body)

    def _path_body(self, kind: str, p: Peer, i: int) -> tuple[str, bytes]:
        if kind == "heartbeat":
            return f"{self.base}/heartbeat", b'{"step":%d,"loss":2.0}' % i
        return f"{self.base}/leases", b'{"want":1}'

    def _request(self, call: _Call) -> bytes:
        p, i = call.peer, call.i
        if call.kind == "lease" and p.held:
            lease = p.held.pop(0)
            call.kind = "complete"
            path = f"{self.base}/leases/{lease['unit']}/complete"
            body = b'{"lease_token":"%s"}' % lease["lease_token"].encode()
        else:
            path, body = self._path_body(call.kind, p, i)
        if p.session is not None:
            ts, nonce = int(time.time() * 1000), p.next_nonce()
            call.nonce = nonce
            h = p.keyed.copy()  # a keyed HMAC copied: cheaper than hmac.digest's key set-up
            h.update(request_message("POST", path, ts, nonce, body))
            mac = h.digest()
            auth = (
                f"X-Distro-Time: {ts}\r\nX-Distro-Nonce: {nonce}\r\n"
                f"X-Distro-Mac: {binascii.b2a_base64(mac, newline=False).decode()}\r\n"
            )
        else:
            pre = self.signed.pop(i, None)
            h = (
                pre
                if pre is not None and call.kind != "complete"
                else sign_request(p.ident, "POST", path, body)
            )
            auth = "".join(f"{k}: {v}\r\n" for k, v in h.items() if k != "X-Distro-Peer")
        head = f"POST {path} HTTP/1.1\r\n{p.prefix}{auth}Content-Length: {len(body)}\r\n\r\n"
        return head.encode() + body

    # ------------------------------------------------------------ flow

    def due(self, scheduled: float) -> None:
        i = self.counter
        self.counter += 1
        kind, p = self._plan(i)
        call = _Call(i, kind, p, scheduled)
        if self.idle:
            self._send(self.idle.popleft(), call)
        else:
            self.waiting.append(call)
            self._grow()

    def _send(self, conn: _Conn, call: _Call) -> None:
        self.inflight += 1
        data = self._request(call)
        call.sent = time.perf_counter()
        self.stats.send_lag.append(call.sent - call.scheduled)
        conn.send(call, data)

    def _grow(self) -> None:
        open_ = self.inflight + len(self.idle) + self.connecting
        if open_ < self.n_conns:
            self.connecting += 1
            asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError as e:
            self.connecting -= 1
            self.stats.error(type(e).__name__)
            if self.waiting:
                self.waiting.popleft()
            return
        self.connecting -= 1
        self._idle(conn)

    def _idle(self, conn: _Conn) -> None:
        if self.waiting:
            self._send(conn, self.waiting.popleft())
        else:
            self.idle.append(conn)

    def answered(self, conn: _Conn, call: _Call, status: int, body: bytes, closed: bool) -> None:
        st = self.stats
        self.inflight -= 1
        now = self.last_answer = time.perf_counter()
        st.lat.append(now - call.scheduled)
        if st.trace is not None:
            st.trace.append(
                (call.peer.ident.peer_id_b58, call.nonce, call.kind, call.scheduled, call.sent, now, status)
            )
        st.kinds[call.kind] = st.kinds.get(call.kind, 0) + 1
        if status != 200:
            st.error(str(status))
        else:
            self._check(call, body)
        if not closed:
            self._idle(conn)
        elif self.waiting:
            self._grow()

    def _check(self, call: _Call, body: bytes) -> None:
        """Count the answer ok only when its body has the shape the call expects."""
        try:
            obj = json.loads(body)
            if call.kind == "lease":
                call.peer.held.extend(obj["leases"])
                good = isinstance(obj["leases"], list)
            elif call.kind == "complete":
                good = obj["credited"] is True
            else:
                good = isinstance(obj["renewed"], int)
        except (ValueError, KeyError, TypeError):
            good = False
        if good:
            self.stats.ok += 1
        else:
            self.stats.error(f"bad_{call.kind}_answer")

    def lost(self, conn: _Conn, call: _Call | None, why: str) -> None:
        if call is not None:
            self.inflight -= 1
            self.stats.error(why)
        if conn in self.idle:
            self.idle.remove(conn)
        if self.waiting:
            self._grow()

    async def run(self, seconds: float) -> LoadStats:
        for _ in range(self.n_conns):
            self.connecting += 1
            await self._connect()
        clock = time.perf_counter
        rate, total = self.rate, int(seconds * self.rate)
        t0 = self.stats.started = clock()
        sent = 0
        while sent < total:
            due = min(int((clock() - t0) * rate) + 1, total)
            while sent < due:
                self.due(t0 + sent / rate)
                sent += 1
            await asyncio.sleep(_TICK_S)  # sends are late by up to a tick, and that counts
        deadline = clock() + 30
        while (self.inflight or self.waiting) and clock() < deadline:
            await asyncio.sleep(0.005)
        self.stats.finished = clock() if self.inflight or self.waiting else self.last_answer
        if self.inflight or self.waiting:
            self.stats.error("Unanswered")
        for c in list(self.idle):
            if c.transport is not None:
                c.transport.close()
        return self.stats


async def run_load(
    url: str,
    run_id: str,
    peers: list[Peer],
    *,
    rate: float,
    seconds: float,
    concurrency: int,
    auth: str,
    trace: bool = False,
) -> LoadStats:
    """Schedule ``rate`` node calls per second for ``seconds`` against ``url``; every answer checked.

    ``auth="signature"`` pre-signs the phase's heartbeats and leases first (untimed). ``trace``
    keeps one record per answered call in ``LoadStats.trace``.
    """
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    gen = _Generator(host, int(port), run_id, peers, rate, concurrency, auth)
    if trace:
        gen.stats.trace = []
    if auth == "signature":
        gen.presign(int(rate * seconds) + 1)
    return await gen.run(seconds)
