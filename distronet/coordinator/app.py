"""The HTTP face of the coordinator: the route table (:mod:`.routes`) on aiohttp, one request
pipeline. The four hot node routes are also served by :mod:`.hotpath`, which runs this
pipeline's own steps (:meth:`CoordinatorApp.admit`, ``node_headers``, ``verify_node``) on the
requests it parses itself.

Pipeline of every call (:meth:`CoordinatorApp._wrap`): declared body size (413) -> auth
(operator bearer 401/403, or signature / session headers 401/403) -> body read within the
route's limit (413) -> signature or session MAC (403; a forgery counts against its IP's rate)
-> per-client rate limit
(429: per peer once verified, per IP otherwise) -> nonce (403) -> JSON + schema (400/415) ->
operation -> wait until its writes are durable -> JSON answer. Errors are typed JSON bodies
(:func:`distronet.protocol.coordinator_api.error_body`); nothing unexpected becomes a bare 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from distronet.coordinator import handlers
from distronet.coordinator.auth import (
    MacHeaders,
    NonceCache,
    RateLimiter,
    SignedHeaders,
    check_bearer,
    parse_mac,
    parse_signed,
    verify_mac,
    verify_signed,
)
from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.dashboard_static import add_dashboard_routes
from distronet.coordinator.events import EventBus
from distronet.coordinator.groupcommit import GroupCommitter
from distronet.coordinator.metrics import Metrics
from distronet.coordinator.openapi import build_openapi
from distronet.coordinator.routes import JSON, ROUTES, Ctx, Route, Served, encode_json, parse_json
from distronet.coordinator.service import Coordinator, load_signing_key
from distronet.coordinator.sessions import SessionTable
from distronet.coordinator.store import Store, open_store
from distronet.coordinator.trace import TRACE
from distronet.protocol.coordinator_api import ApiError, ApiErrorCode, error_body
from distronet.protocol.coordinator_session import HDR_SESSION
from distronet.protocol.limits import MAX_PROBE_BYTES

__all__ = ["CoordinatorApp", "json_response"]

log = logging.getLogger(__name__)
VERSION = "0.1.0"


Pipeline = Callable[[web.BaseRequest, Mapping[str, str]], Awaitable[web.StreamResponse]]
_JSON_HEADERS: CIMultiDict[str] = CIMultiDict({"Content-Type": JSON})  # copied per use


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    h = _JSON_HEADERS if headers is None else CIMultiDict(_JSON_HEADERS, **headers)
    return web.Response(body=encode_json(obj).encode(), status=status, headers=h)


class CoordinatorApp:
    """The service, its store and its aiohttp application. ``await start()`` then serve ``web``."""

    def __init__(
        self, cfg: CoordinatorConfig, store: Store | None = None, *, clock: Callable[[], float] = time.time
    ):
        self.cfg = cfg
        self.clock = clock
        self.store = store if store is not None else open_store(cfg.db_url(), synchronous=cfg.sqlite_sync)
        self.events = EventBus()
        self.committer = GroupCommitter(
            self.store,
            on_fatal=self._fatal,
            on_commit=self._on_commit,
            min_interval_s=cfg.commit_min_interval_s,
        )
        self.svc = Coordinator(self.committer, self.events, clock=clock)
        self.metrics = Metrics(self.svc)
        self.nonces = NonceCache(2 * cfg.clock_skew_s)
        self.sessions = SessionTable(cfg.session_ttl_s)
        self.peer_limits = RateLimiter(cfg.peer_rate, cfg.peer_burst)
        self.ip_limits = RateLimiter(cfg.ip_rate, cfg.ip_burst)
        self.started_ms = int(clock() * 1000)
        self.gc_freeze = False  # process-wide: only the process's owner turns it on
        self.closing = False
        self.fatal = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self.web = web.Application(client_max_size=cfg.operator_body_limit, middlewares=[self._errors])
        for r in ROUTES:
            self.web.router.add_route(r.method, r.full_path, _routed(self._wrap(r)), name=r.name)
        add_dashboard_routes(self.web)
        self.web.on_shutdown.append(self._on_shutdown)
        self.web.on_cleanup.append(self._on_cleanup)
        self.openapi = build_openapi(ROUTES, VERSION)

    def served(self) -> Served:
        """This app as the operations see it (mypy checks that it is one)."""
        return self

    async def start(self) -> None:
        """Open and migrate the store, rebuild memory from it, start the writer and the sweeper."""
        await self.store.open()
        if self.cfg.credential_ttl_s > 0:
            self.svc.set_signer(load_signing_key(self.cfg.signing_key_path()), self.cfg.credential_ttl_s)
        self.svc.restore(await self.store.load())
        self.freeze_heap()
        self.started_ms = int(self.clock() * 1000)
        self.committer.start()
        TRACE.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="coordinator-sweep")

    def freeze_heap(self) -> None:
        """Hide every object alive now from the cyclic GC (``gc.freeze``) when ``gc_freeze`` is
        set (by `distro-coordinator serve`, which owns its process; off for in-process use).
        Called after loading or creating runs: their shards, manifests and lease books are
        long-lived, and a full collection that walks a 200,000-shard run stalls the event loop
        for 50-200 ms (a p99 killer). Frozen objects are still freed by reference counting."""
        if self.gc_freeze:
            gc.freeze()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sweep_interval_s)
            try:
                self.svc.sweep()
                self.sessions.prune(self.clock())
            except ApiError:
                return  # storage failed; _fatal handles the shutdown

    def _fatal(self, exc: BaseException) -> None:
        self.fatal.set()

    def _on_commit(self, rows: int, seconds: float) -> None:
        self.metrics.on_commit(rows, seconds)

    async def _on_shutdown(self, _app: web.Application) -> None:
        self.closing = True
        self.events.close_all()

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the sweeper, commit what is staged, close the store. Idempotent."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.committer.close()
        await self.store.close()
        TRACE.dump()

    # ---------------------------------------------------------------- pipeline

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        return await self.guarded(request.match_info.route.name or "unmatched", request, handler(request))

    async def guarded(
        self, route: str, request: web.BaseRequest, call: Awaitable[web.StreamResponse]
    ) -> web.StreamResponse:
        """Await ``call`` (the handling of ``request`` on ``route``); every error becomes a typed
        JSON answer (nothing unexpected a bare 500), and the request is counted in the metrics."""
        t0 = time.perf_counter()
        try:
            resp = await call
        except ApiError as e:
            resp = json_response(e.body(), e.code.http_status, _retry_after(e))
        except web.HTTPException as e:
            code = {
                404: ApiErrorCode.NOT_FOUND,
                405: ApiErrorCode.METHOD_NOT_ALLOWED,
                413: ApiErrorCode.TOO_LARGE,
            }
            c = code.get(e.status)
            if c is None:
                raise
            resp = json_response(error_body(c, e.reason or c.value), e.status)
        except Exception:
            log.exception("unexpected error in %s %s", request.method, request.path)
            resp = json_response(
                error_body(ApiErrorCode.INTERNAL, "internal error; see the coordinator log"), 500
            )
        self.metrics.observe(route, resp.status, time.perf_counter() - t0)
        return resp

    def _wrap(self, r: Route) -> Pipeline:
        op = getattr(handlers, r.name)
        limit = self.route_limit(r)
        is_post = r.method == "POST"

        async def handle(request: web.BaseRequest, params: Mapping[str, str]) -> web.StreamResponse:
            self.admit(request.content_length, limit)
            hdrs = request.headers
            peer: str | None = None
            if r.auth == "signed":
                now = self.clock()
                h = self.node_headers(r, hdrs, params, now)
                body = await self._read(request, limit) if is_post else b""
                peer = self.verify_node(h, request.method, request.path_qs, body, request.remote, now)
            elif r.auth == "operator":
                try:
                    check_bearer(hdrs.get("Authorization"), self.cfg.operator_token)
                except ApiError:
                    self._limit(self.ip_limits, request.remote or "?")
                    raise
                body = await self._read(request, limit) if is_post else b""
            else:
                self._limit(self.ip_limits, request.remote or "?")
                body = await self._read(request, limit) if is_post else b""
            parsed: dict[str, Any] = {}
            if r.schema is not None:
                if body and hdrs.get("Content-Type") != JSON and request.content_type != JSON:
                    raise ApiError(ApiErrorCode.UNSUPPORTED_MEDIA, "send the body as application/json")
                parsed = r.schema.validate(parse_json(body))
            data = body if is_post and r.schema is None else b""
            result = op(self, Ctx(request, params, parsed, peer, data))
            if r.raw:
                return await result  # type: ignore[no-any-return]
            status, obj = result
            await self.committer.durable()
            return json_response(obj, status)

        return handle

    # The pipeline's steps, shared with the hot-route protocol (:mod:`.hotpath`), which runs
    # them on requests it parsed itself: the same checks in the same order either way in.

    def route_limit(self, r: Route) -> int:
        """The body size limit of route ``r`` in bytes."""
        if r.limit == "probe":
            return MAX_PROBE_BYTES
        return self.cfg.node_body_limit if r.limit == "node" else self.cfg.operator_body_limit

    def admit(self, content_length: int | None, limit: int) -> None:
        """First step of every call: 503 while shutting down, 413 for a declared body over ``limit``."""
        if self.closing:
            raise ApiError(ApiErrorCode.UNAVAILABLE, "the coordinator is shutting down; retry shortly")
        if content_length is not None and content_length > limit:
            raise ApiError(
                ApiErrorCode.TOO_LARGE, f"body of {content_length} bytes is over this route's {limit}"
            )

    def node_headers(
        self, r: Route, hdrs: Any, params: Mapping[str, str], now: float
    ) -> MacHeaders | SignedHeaders:
        """The parsed auth headers of a signed route's call (``hdrs``: case-insensitive ``get``).
        Raises ApiError 401/403 before any body is read."""
        if r.mac and HDR_SESSION in hdrs:
            return parse_mac(
                hdrs,
                self.sessions,
                run_id=params.get("run_id"),
                skew_s=self.cfg.clock_skew_s,
                not_before_ms=self.started_ms,
                now=now,
            )
        return parse_signed(hdrs, skew_s=self.cfg.clock_skew_s, not_before_ms=self.started_ms, now=now)

    def verify_node(
        self,
        h: MacHeaders | SignedHeaders,
        method: str,
        path_qs: str,
        body: bytes,
        remote: str | None,
        now: float,
    ) -> str:
        """Check the MAC or signature over the exact request, then the peer's rate and the nonce.
        Returns the authenticated peer id. Raises ApiError 403/429."""
        try:
            if isinstance(h, MacHeaders):
                verify_mac(h, method, path_qs, body)
            else:
                verify_signed(h, method, path_qs, body)
        except ApiError:  # forgeries count against their IP, never against the peer they name
            self._limit(self.ip_limits, remote or "?")
            raise
        self._limit(self.peer_limits, h.peer)
        self.nonces.check_and_add(h.peer, h.nonce, now)
        return h.peer

    @staticmethod
    def _limit(limiter: RateLimiter, key: str) -> None:
        wait = limiter.retry_after(key)
        if wait > 0:
            raise ApiError(ApiErrorCode.RATE_LIMITED, f"too many requests; retry in {wait:.2f} s")

    @staticmethod
    async def _read(request: web.BaseRequest, limit: int) -> bytes:
        content = request.content
        if content.is_eof():  # the whole body has arrived already (small bodies): no await
            body = content.read_nowait()
            if len(body) > limit:
                raise ApiError(ApiErrorCode.TOO_LARGE, f"body is over this route's {limit} bytes")
            return body
        buf = bytearray()
        async for chunk in content.iter_any():
            buf += chunk
            if len(buf) > limit:
                raise ApiError(ApiErrorCode.TOO_LARGE, f"body is over this route's {limit} bytes")
        return bytes(buf)


def _routed(pipeline: Pipeline) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of a route: its pipeline with the router's path parameters."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await pipeline(request, request.match_info)

    return handler


def _retry_after(e: ApiError) -> dict[str, str] | None:
    if e.code is ApiErrorCode.RATE_LIMITED:
        return {"Retry-After": "1"}
    return None
