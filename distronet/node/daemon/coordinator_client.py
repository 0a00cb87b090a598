"""The node's client of the coordinator: admission, leases, and reports that survive an outage.

The daemon's only view of the coordinator. Calls that need an answer now (``join``,
``lease``, ``renew``) raise :class:`CoordinatorUnreachable` when the coordinator is down.
*Reports* — ``complete``, ``heartbeat``, ``submit_receipts`` — never raise for an outage: they
are queued (in memory, and in ``buffer_path`` if given, so a restart of the daemon keeps them)
and replayed in order by a background task once the coordinator answers again. Every send is
signed afresh, so a replay is not refused as a replay; completion is idempotent on the
coordinator, so a report sent twice is credited once. Heartbeats coalesce: only the newest
queued one is kept.

Authentication (see :mod:`distronet.protocol.coordinator_session`): the first node call opens
a *session* — one call signed with the node's Ed25519 key that carries a fresh X25519 key —
and later calls carry an HMAC under the agreed session key instead of a signature, which
saves the coordinator an Ed25519 verify per call. The client re-opens the session by itself
when the coordinator forgets it (a restart answers ``401 unknown_session``) or before it
expires, and falls back to signing every call when the coordinator does not offer sessions
(an older coordinator), so callers see the same answers and errors either way.

Errors::

    DistroError
    └── CoordinatorClientError
        ├── CoordinatorUnreachable   no answer, a timeout, a 5xx or 429: try again later
        └── CoordinatorRefused       a 4xx with a typed code (``.code``): fix the request
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from distronet.protocol.coordinator_api import (
    API_PREFIX,
    ApiErrorCode,
    Signer,
    join_message,
    receipt_message,
    sign_request,
)
from distronet.protocol.coordinator_session import SessionKey, derive_session_key, mac_headers, new_ephemeral
from distronet.protocol.errors import DistroError

__all__ = [
    "CoordinatorClient",
    "CoordinatorClientError",
    "CoordinatorRefused",
    "CoordinatorUnreachable",
    "JoinResult",
    "Lease",
    "sign_receipt",
]

log = logging.getLogger(__name__)
_RETRIABLE_4XX = {ApiErrorCode.RATE_LIMITED.value, ApiErrorCode.STALE_REQUEST.value}
_SESSION_RETRY_S = 60.0  # after the coordinator refused to open a session, sign calls this long


class CoordinatorClientError(DistroError):
    """A call to the coordinator failed."""


class CoordinatorUnreachable(CoordinatorClientError):
    """No usable answer (connection refused, timeout, 5xx, rate limited): retry later."""


class CoordinatorRefused(CoordinatorClientError):
    """The coordinator refused the call; ``code`` is the ApiErrorCode value, ``status`` the HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"coordinator refused ({status} {code}): {message}")
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Lease:
    """A shard lease: train on ``url`` (``sha256``, ``tokens``) and complete before ``expires_at``."""

    unit: int
    epoch: int
    shard_id: str
    lease_token: str
    expires_at: float
    tokens: int
    bytes: int
    sha256: str
    url: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Lease:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class JoinResult:
    node: dict[str, Any]
    bootstrap_peers: list[dict[str, Any]]
    run: dict[str, Any]
    heartbeat_interval_s: float
    max_leases: int
    relays: tuple[str, ...] = ()


MAX_RELAYS = 8  # relays taken from one join answer (docs/protocol.md §11)


def relay_list(raw: object) -> tuple[str, ...]:
    """The join answer's ``relays``: full multiaddrs (``…/p2p/<id>``), at most ``MAX_RELAYS``;
    anything else is dropped (an older coordinator sends none)."""
    if not isinstance(raw, list):
        return ()
    ok = [m for m in raw if isinstance(m, str) and "/p2p/" in m and m.startswith("/") and len(m) <= 255]
    return tuple(ok[:MAX_RELAYS])


_HOT_SUFFIXES = ("/heartbeat", "/leases", "/renew", "/complete")


def _is_hot(method: str, full: str) -> bool:
    """Whether a call goes to one of the coordinator's four hot node routes."""
    return method == "POST" and full.endswith(_HOT_SUFFIXES)


def sign_receipt(
    signer: Signer, run_id: str, step: int, producer_b58: str, payload_sha256: str
) -> dict[str, Any]:
    """A receipt by ``signer`` (the acceptor) that ``producer``'s packet for ``step`` was accepted."""
    sig = signer.sign(receipt_message(run_id, step, producer_b58, payload_sha256))
    return {
        "step": step,
        "producer": producer_b58,
        "acceptor": signer.peer_id_b58,
        "payload_sha256": payload_sha256.lower(),
        "signature": base64.b64encode(sig).decode(),
    }


class CoordinatorClient:
    """Client of one run on one coordinator, signing with the node's identity.

    Use ``async with CoordinatorClient(...) as c:`` (or call :meth:`close`). Not thread-safe.
    ``sessions=False`` signs every node call with the peer key (no session MAC).
    """

    def __init__(
        self,
        base_url: str,
        run_id: str,
        identity: Signer,
        *,
        timeout_s: float = 10.0,
        max_buffer: int = 10_000,
        buffer_path: str | os.PathLike[str] | None = None,
        retry_min_s: float = 0.2,
        retry_max_s: float = 10.0,
        sessions: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.run_id = run_id
        self.identity = identity
        self.timeout_s = timeout_s
        self.max_buffer = max_buffer
        self.buffer_path = Path(buffer_path) if buffer_path is not None else None
        self.retry_min_s, self.retry_max_s = retry_min_s, retry_max_s
        self._session: aiohttp.ClientSession | None = None
        self._hot_session: aiohttp.ClientSession | None = None  # hot routes' own connections
        self._buffer: deque[dict[str, Any]] = deque()
        self._replayer: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self.dropped = 0  # reports dropped: buffer full, or refused on replay
        self.sessions = sessions
        self._skey: SessionKey | None = None
        self._skey_renew_at = 0.0  # monotonic time to open the next session
        self._sessions_off_until = 0.0  # monotonic; sign every call until then
        self._session_lock = asyncio.Lock()
        self.credential: bytes | None = None  # the newest membership credential (protocol/credential.py)
        self.on_credential: Callable[[bytes], None] | None = None  # called with each one received
        self._load_buffer()

    def _take_credential(self, answer: Any) -> None:
        """Keep the credential a join or heartbeat answer carries (it is verified where used)."""
        cred = answer.get("credential") if isinstance(answer, dict) else None
        if isinstance(cred, str) and len(cred) <= 512:
            with contextlib.suppress(ValueError):
                self.credential = base64.b64decode(cred, validate=True)
                if self.on_credential is not None:
                    self.on_credential(self.credential)

    async def __aenter__(self) -> CoordinatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop replaying (what is still queued stays in ``buffer_path``) and close the session."""
        if self._replayer is not None:
            self._replayer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replayer
            self._replayer = None
        for sess in (self._session, self._hot_session):
            if sess is not None:
                await sess.close()
        self._session = self._hot_session = None

    # ---------------------------------------------------------------- transport

    def _sess(self, hot: bool = False) -> aiohttp.ClientSession:
        """The HTTP session for a call. The four hot routes (heartbeat, lease, renew, complete)
        keep connections of their own: the coordinator serves them on a hand-written path
        (``coordinator/hotpath.py``) until a connection carries any other call, which hands it
        to aiohttp for good."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        if hot:
            if self._hot_session is None:
                self._hot_session = aiohttp.ClientSession(timeout=timeout)
            return self._hot_session
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def _call(
        self, method: str, path: str, body: Any = None, *, signed: bool = False, mac: bool = True
    ) -> Any:
        """One HTTP call; JSON answer. Raises CoordinatorUnreachable / CoordinatorRefused.

        ``signed`` calls carry a session MAC when a session is open (``mac`` and
        ``self.sessions``), else an Ed25519 signature. A MAC the coordinator does not know
        (``unknown_session``: it restarted) or does not accept is retried once: with a new
        session, or signed.
        """
        data = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        full = API_PREFIX + path
        for attempt in range(2):
            headers = {"Content-Type": "application/json"} if body is not None else {}
            skey = await self._session_key() if signed and mac and self.sessions else None
            if skey is not None:
                headers.update(mac_headers(skey, method, full, data))
            elif signed:
                headers.update(sign_request(self.identity, method, full, data))
            status, obj, raw = await self._send(method, full, data, headers)
            if status < 400:
                return obj
            err = obj.get("error", {}) if isinstance(obj, dict) else {}
            code, msg = str(err.get("code", "")), str(err.get("message", raw[:200]))
            if skey is not None and attempt == 0 and self._session_failed(skey, code):
                continue
            if status >= 500 or code in _RETRIABLE_4XX:
                raise CoordinatorUnreachable(f"coordinator answered {status} {code}: {msg}")
            raise CoordinatorRefused(status, code, msg)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(
        self, method: str, full: str, data: bytes, headers: dict[str, str]
    ) -> tuple[int, Any, bytes]:
        try:
            async with self._sess(_is_hot(method, full)).request(
                method, self.base_url + full, data=data or None, headers=headers
            ) as r:
                raw = await r.read()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise CoordinatorUnreachable(f"coordinator at {self.base_url} unreachable: {e!r}") from e
        try:
            obj = json.loads(raw) if raw else {}
        except ValueError:
            obj = {}
        return status, obj, raw

    # ---------------------------------------------------------------- sessions

    def _session_failed(self, skey: SessionKey, code: str) -> bool:
        """Forget a session the coordinator refused; True when the call should be retried."""
        if code == ApiErrorCode.UNKNOWN_SESSION.value:
            if self._skey is skey:
                self._skey = None
            return True
        if code == ApiErrorCode.BAD_SIGNATURE.value:  # a key mismatch (tampered exchange?): sign for a while
            if self._skey is skey:
                self._skey = None
            self._sessions_off_until = time.monotonic() + _SESSION_RETRY_S
            return True
        return False

    async def _session_key(self) -> SessionKey | None:
        """The open session, opening one when there is none or it is due; None: sign instead.

        Raises CoordinatorUnreachable when the coordinator cannot be reached.
        """
        now = time.monotonic()
        if self._skey is not None and now < self._skey_renew_at:
            return self._skey
        if now < self._sessions_off_until:
            return None
        async with self._session_lock:
            if self._skey is not None and time.monotonic() < self._skey_renew_at:
                return self._skey
            try:
                self._skey = await self._open_session()
            except CoordinatorRefused as e:  # an older coordinator, or not admitted: sign instead
                log.debug("no coordinator session (%s); signing calls", e)
                self._skey = None
                self._sessions_off_until = time.monotonic() + _SESSION_RETRY_S
            return self._skey

    async def _open_session(self) -> SessionKey:
        """One signed X25519 exchange (``POST /runs/{id}/session``). Raises CoordinatorClientError."""
        priv, pub = new_ephemeral()
        r = await self._call("POST", f"/runs/{self.run_id}/session", {"x25519": pub}, signed=True, mac=False)
        peer = self.identity.peer_id_b58
        try:
            sid, server_pub, ttl = str(r["session_id"]), str(r["x25519"]), float(r["expires_in_s"])
            key = derive_session_key(
                priv, server_pub, run_id=self.run_id, peer_id_b58=peer, session_id=sid,
                client_public_b64=pub, server_public_b64=server_pub,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise CoordinatorRefused(200, "bad_session_answer", f"unusable session answer: {e}") from None
        self._skey_renew_at = time.monotonic() + max(1.0, 0.9 * ttl - 5.0)
        return SessionKey(peer, sid, key)

    # ---------------------------------------------------------------- calls that answer now

    async def get_run(self) -> dict[str, Any]:
        """The run's definition and progress (``GET /runs/{id}``)."""
        return dict(await self._call("GET", f"/runs/{self.run_id}"))

    async def join(
        self, *, join_token: str | None = None, multiaddrs: Sequence[str] = (), agent: str = ""
    ) -> JoinResult:
        """Prove key ownership on a server challenge and join. Raises CoordinatorRefused if refused."""
        ch = await self._call(
            "POST", f"/runs/{self.run_id}/challenge", {"peer_id": self.identity.peer_id_b58}
        )
        sig = self.identity.sign(join_message(self.run_id, self.identity.peer_id_b58, ch["challenge"]))
        body: dict[str, Any] = {
            "peer_id": self.identity.peer_id_b58,
            "challenge": ch["challenge"],
            "signature": base64.b64encode(sig).decode(),
            "multiaddrs": list(multiaddrs),
            "agent": agent,
        }
        if join_token is not None:
            body["join_token"] = join_token
        r = await self._call("POST", f"/runs/{self.run_id}/join", body)
        self._take_credential(r)
        return JoinResult(
            r["node"],
            r["bootstrap_peers"],
            r["run"],
            r["heartbeat_interval_s"],
            r["max_leases"],
            relay_list(r.get("relays")),
        )

    async def lease(self, want: int = 1) -> list[Lease]:
        """Up to ``want`` new leases (fewer when over this node's allowance or no shard is free)."""
        r = await self._call("POST", f"/runs/{self.run_id}/leases", {"want": want}, signed=True)
        return [Lease.from_json(x) for x in r["leases"]]

    async def held_leases(self) -> list[Lease]:
        """Every lease the coordinator says this node holds (after a restart or a lost answer)."""
        r = await self._call("POST", f"/runs/{self.run_id}/leases", {"want": 0}, signed=True)
        return [Lease.from_json(x) for x in r["held"]]

    async def renew(self, lease: Lease) -> float:
        """Extend a lease; returns the new expiry. CoordinatorRefused(code='lease_lost') if it lapsed."""
        path = f"/runs/{self.run_id}/leases/{lease.unit}/renew"
        r = await self._call("POST", path, {"lease_token": lease.lease_token}, signed=True)
        return float(r["expires_at"])

    async def leave(self) -> None:
        """Say goodbye; the coordinator hands this node's leases to others at once."""
        await self._call("POST", f"/runs/{self.run_id}/leave", {}, signed=True)

    # ---------------------------------------------------------------- reports (buffered)

    async def complete(self, lease: Lease) -> dict[str, Any] | None:
        """Report a finished shard. The answer (``credited``), or None when queued for replay."""
        item = {"kind": "complete", "path": f"/runs/{self.run_id}/leases/{lease.unit}/complete",
                "body": {"lease_token": lease.lease_token}}  # fmt: skip
        return await self._report(item)

    async def heartbeat(
        self,
        step: int,
        *,
        loss: float | None = None,
        multiaddrs: Sequence[str] | None = None,
        reach: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Liveness (renews this node's leases), step and loss, and how the node reaches its
        peers (``reach``: ``coordinator_api.REACH``). None when queued (coalesced)."""
        body: dict[str, Any] = {"step": step}
        if loss is not None:
            body["loss"] = loss
        if multiaddrs is not None:
            body["multiaddrs"] = list(multiaddrs)
        if reach is not None:
            body["reach"] = dict(reach)
        return await self._report(
            {"kind": "heartbeat", "path": f"/runs/{self.run_id}/heartbeat", "body": body}
        )

    async def submit_receipts(self, receipts: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        """Send receipts (see :func:`sign_receipt`) in batches of 128; None when queued."""
        out: dict[str, Any] | None = None
        for i in range(0, len(receipts), 128):
            item = {"kind": "receipts", "path": f"/runs/{self.run_id}/receipts",
                    "body": {"receipts": list(receipts[i : i + 128])}}  # fmt: skip
            out = await self._report(item)
        return out

    @property
    def pending(self) -> int:
        """Reports queued for replay."""
        return len(self._buffer)

    async def _report(self, item: dict[str, Any]) -> dict[str, Any] | None:
        if not self._buffer:
            try:
                answer = dict(await self._call("POST", item["path"], item["body"], signed=True))
                self._take_credential(answer)
                return answer
            except CoordinatorUnreachable as e:
                log.info("coordinator unreachable, queueing %s: %s", item["kind"], e)
        self._enqueue(item)
        return None

    def _enqueue(self, item: dict[str, Any]) -> None:
        if item["kind"] == "heartbeat":
            self._buffer = deque(x for x in self._buffer if x["kind"] != "heartbeat")
        if len(self._buffer) >= self.max_buffer:
            self._buffer.popleft()
            self.dropped += 1
        self._buffer.append(item)
        self._save_buffer()
        if self._replayer is None or self._replayer.done():
            self._replayer = asyncio.create_task(self._replay_loop(), name="coordinator-replay")

    async def flush(self) -> int:
        """Replay queued reports in order now; returns how many were delivered.

        Stops at the first one that finds the coordinator still unreachable. A report the
        coordinator refuses (4xx, e.g. a lease that went to another node) is dropped.
        """
        delivered = 0
        async with self._flush_lock:
            while self._buffer:
                item = self._buffer[0]
                try:
                    self._take_credential(await self._call("POST", item["path"], item["body"], signed=True))
                    delivered += 1
                except CoordinatorUnreachable:
                    break
                except CoordinatorRefused as e:
                    log.warning("coordinator refused replayed %s: %s", item["kind"], e)
                    self.dropped += 1
                self._buffer.popleft()
                self._save_buffer()
        return delivered

    async def _replay_loop(self) -> None:
        delay = self.retry_min_s
        while self._buffer:
            await asyncio.sleep(delay)
            await self.flush()
            delay = min(self.retry_max_s, delay * 2)

    # ---------------------------------------------------------------- persistence

    def _save_buffer(self) -> None:
        if self.buffer_path is None:
            return
        tmp = self.buffer_path.with_name(self.buffer_path.name + ".tmp")
        tmp.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in self._buffer))
        os.replace(tmp, self.buffer_path)

    def _load_buffer(self) -> None:
        if self.buffer_path is None or not self.buffer_path.exists():
            return
        for line in self.buffer_path.read_text().splitlines()[-self.max_buffer :]:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and {"kind", "path", "body"} <= item.keys():
                self._buffer.append(item)

    def resume(self) -> None:
        """Start replaying reports loaded from ``buffer_path`` (call inside the event loop)."""
        if self._buffer and (self._replayer is None or self._replayer.done()):
            self._replayer = asyncio.create_task(self._replay_loop(), name="coordinator-replay")
