"""One function per route (named as in :data:`distronet.coordinator.routes.ROUTES`).

A plain handler returns ``(status, json_object)`` after staging its writes; the pipeline waits
for durability before it answers. A raw handler (SSE, files, metrics) is a coroutine returning
its own response.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from distronet.coordinator.routes import JSON, Ctx, Served, encode_json
from distronet.protocol.coordinator_api import ApiError, ApiErrorCode
from distronet.protocol.errors import ConfigError
from distronet.protocol.limits import MAX_PROBE_BYTES, MAX_TOKENIZER_BYTES
from distronet.protocol.run_file import file_beside

if TYPE_CHECKING:
    from distronet.coordinator.events import Event

Result = tuple[int, Any]
SSE_KEEPALIVE_S = 15.0
log = logging.getLogger("distronet.coordinator")
# sha256 of each tokenizer file served, by (path, size, mtime_ns): hashed once, not per request
_TOKENIZER_SHA: dict[tuple[str, int, int], str] = {}
_TOKENIZER_SHA_MAX = 64
_PROBE_CHUNK = 256 * 1024  # a download probe is written in pieces of this size
_PROBE_NOISE: list[bytes] = []  # MAX_PROBE_BYTES of random bytes, made at the first probe


def _run_id(ctx: Ctx) -> str:
    return ctx.params["run_id"]


def _unit(ctx: Ctx) -> int:
    raw = ctx.params["unit"]
    if not (0 < len(raw) <= 12 and raw.isdigit()):
        raise ApiError(ApiErrorCode.NOT_FOUND, "a unit is a non-negative integer")
    return int(raw)


def openapi(app: Served, ctx: Ctx) -> Result:
    return 200, app.openapi


def health(app: Served, ctx: Ctx) -> Result:
    ok = app.committer.failed is None and not app.closing
    return (200 if ok else 503), {"ok": ok, "runs": len(app.svc.runs), "commits": app.committer.commits}


def list_runs(app: Served, ctx: Ctx) -> Result:
    return 200, {"runs": sorted(app.svc.runs)}


def create_run(app: Served, ctx: Ctx) -> Result:
    run, created = app.svc.create_run(ctx.body)
    if created:
        app.freeze_heap()
    return (201 if created else 200), app.svc.run_public(run)


def get_run(app: Served, ctx: Ctx) -> Result:
    return 200, app.svc.run_public(app.svc.run(_run_id(ctx)))


def close_run(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    app.svc.set_run_state(run, "closed")
    return 200, app.svc.run_public(run)


def join_tokens(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    b = ctx.body
    return 200, {"tokens": app.svc.create_join_tokens(run, b["count"], b["uses"], b["expires_in_s"])}


def evict(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    node = app.svc.evict(run, ctx.params["peer_id"], ctx.body["reason"])
    return 200, node.public()


def nodes(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    return 200, {"nodes": [n.public() for n in run.nodes.values()]}


def leaderboard(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    assert ctx.request is not None
    raw = ctx.request.query.get("limit", "100")
    if not (0 < len(raw) <= 4 and raw.isdigit() and 1 <= int(raw) <= 1000):
        raise ApiError(ApiErrorCode.INVALID_FIELD, "limit must be an integer in 1..1000", field="query.limit")
    return 200, {"leaderboard": app.svc.leaderboard(run, int(raw))}


def lease_state(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    return 200, app.svc.lease_state(run, _unit(ctx))


def challenge(app: Served, ctx: Ctx) -> Result:
    run = app.svc.run(_run_id(ctx))
    ch, exp = app.svc.challenge(run, ctx.body["peer_id"])
    return 200, {"challenge": ch, "expires_at": exp}


def join(app: Served, ctx: Ctx) -> Result:
    return 200, app.svc.join(app.svc.run(_run_id(ctx)), ctx.body)


def session(app: Served, ctx: Ctx) -> Result:
    run, _node_rec = _node(app, ctx)
    assert ctx.peer is not None
    s, server_pub = app.sessions.open(run.id, ctx.peer, ctx.body["x25519"], app.clock())
    return 200, {
        "session_id": s.sid,
        "x25519": server_pub,
        "expires_at": s.expires_at,
        "expires_in_s": app.sessions.ttl_s,
    }


def _node(app: Served, ctx: Ctx) -> tuple[Any, Any]:
    run = app.svc.run(_run_id(ctx))
    assert ctx.peer is not None
    return run, app.svc.node_for(run, ctx.peer)


def lease(app: Served, ctx: Ctx) -> Result:
    run, node = _node(app, ctx)
    return 200, app.svc.lease(run, node, ctx.body["want"])


def renew(app: Served, ctx: Ctx) -> Result:
    run, node = _node(app, ctx)
    return 200, app.svc.renew(run, node, _unit(ctx), ctx.body["lease_token"])


def complete(app: Served, ctx: Ctx) -> Result:
    run, node = _node(app, ctx)
    return 200, app.svc.complete(run, node, _unit(ctx), ctx.body["lease_token"])


def heartbeat(app: Served, ctx: Ctx) -> Result:
    run, node = _node(app, ctx)
    return 200, app.svc.heartbeat(run, node, ctx.body)


def receipts(app: Served, ctx: Ctx) -> Result:
    run, node = _node(app, ctx)
    return 200, app.svc.receipts(run, node, ctx.body["receipts"])


def leave(app: Served, ctx: Ctx) -> Result:
    run, node = _node(app, ctx)
    return 200, app.svc.leave(run, node)


async def metrics(app: Served, ctx: Ctx) -> web.StreamResponse:
    return web.Response(body=app.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


def shard_file(root: str, rel: str) -> Path | None:
    """The file ``rel`` under ``root``, or None when it is not a file there (path traversal
    included: ``..`` or a symlink leading out of ``root``)."""
    base = Path(root).resolve()
    p = (base / rel).resolve()
    return p if p.is_relative_to(base) and p.is_file() else None


async def shard(app: Served, ctx: Ctx) -> web.StreamResponse:
    run = app.svc.run(_run_id(ctx))
    sid = ctx.params["shard_id"]
    idx = run.shard_index.get(sid)
    if idx is None:
        raise ApiError(ApiErrorCode.NOT_FOUND, f"no shard {sid[:64]!r} in run {run.id}")
    s = run.shards[idx]
    if s.url is not None:
        raise web.HTTPFound(s.url)
    path = shard_file(run.shard_root, s.path) if run.shard_root and s.path else None
    if path is None:
        raise ApiError(ApiErrorCode.NOT_FOUND, f"shard {sid!r} is not served by this coordinator")
    return web.FileResponse(path, headers={"ETag": f'"{s.sha256}"', "Cache-Control": "public, max-age=86400"})


def _probe_noise() -> bytes:
    """Random bytes (incompressible: no proxy or transport compression flatters a rate), made
    once per process and shared by every download probe."""
    if not _PROBE_NOISE:
        _PROBE_NOISE.append(os.urandom(MAX_PROBE_BYTES))
    return _PROBE_NOISE[0]


async def probe_down(app: Served, ctx: Ctx) -> web.StreamResponse:
    """``?bytes=N`` bytes of noise (``application/octet-stream``, not cached) for the caller to
    time a download; N in 1..``MAX_PROBE_BYTES``, checked before anything is sent (400
    ``invalid_field`` otherwise). 404 for an unknown run."""
    app.svc.run(_run_id(ctx))
    assert ctx.request is not None
    raw = ctx.request.query.get("bytes", "")
    if not (0 < len(raw) <= 9 and raw.isdigit() and 1 <= int(raw) <= MAX_PROBE_BYTES):
        raise ApiError(
            ApiErrorCode.INVALID_FIELD,
            f"bytes must be an integer in 1..{MAX_PROBE_BYTES}",
            field="query.bytes",
        )
    n = int(raw)
    resp = web.StreamResponse(
        headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-store"}
    )
    resp.content_length = n
    await resp.prepare(ctx.request)
    noise = memoryview(_probe_noise())
    for at in range(0, n, _PROBE_CHUNK):
        await resp.write(noise[at : min(n, at + _PROBE_CHUNK)])
    await resp.write_eof()
    return resp


async def probe_up(app: Served, ctx: Ctx) -> web.StreamResponse:
    """Count the body (read by the pipeline within ``MAX_PROBE_BYTES``: a larger one is 413
    ``too_large``, a declared one before it is read) and drop it: ``{"bytes": n}``. The caller
    times the call to get its upload rate. 404 for an unknown run."""
    app.svc.run(_run_id(ctx))
    body = encode_json({"bytes": len(ctx.data)}).encode()
    return web.Response(body=body, headers={"Content-Type": JSON, "Cache-Control": "no-store"})


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


async def tokenizer(app: Served, ctx: Ctx) -> web.StreamResponse:
    """The run's tokenizer file: ``tokenizer_file`` beside the manifest (``file_beside``'s path
    rules, at most ``MAX_TOKENIZER_BYTES``), served only while its sha256 is the manifest's
    ``tokenizer_sha256`` (hashed once per file version). 404 ``not_found`` when the run has no
    tokenizer (byte-level data), was created without its data folder, or the file is missing,
    too large or changed since ``data prepare`` wrote it (the coordinator's log says which)."""
    run = app.svc.run(_run_id(ctx))
    manifest = run.spec["data"]["manifest"]
    name, sha = manifest.get("tokenizer_file"), manifest.get("tokenizer_sha256")
    if not isinstance(name, str) or not isinstance(sha, str):
        raise ApiError(ApiErrorCode.NOT_FOUND, f"run {run.id} has no tokenizer (its data is byte-level)")
    if run.shard_root is None:
        raise ApiError(
            ApiErrorCode.NOT_FOUND,
            f"run {run.id}'s tokenizer is not served by this coordinator (the run was created "
            "without its data folder: give the manifest's path in the run file)",
        )
    try:
        path = file_beside(run.shard_root, name, "data.manifest.tokenizer_file", MAX_TOKENIZER_BYTES)
        st = path.stat()
    except (ConfigError, OSError) as e:
        log.warning("run %s: its tokenizer cannot be served: %s", run.id, e)
        raise ApiError(ApiErrorCode.NOT_FOUND, f"run {run.id}'s tokenizer is not served: {e}") from None
    key = (str(path), st.st_size, st.st_mtime_ns)
    digest = _TOKENIZER_SHA.get(key)
    if digest is None:
        digest = await asyncio.to_thread(_sha256_of, path)
        if len(_TOKENIZER_SHA) >= _TOKENIZER_SHA_MAX:
            _TOKENIZER_SHA.clear()
        _TOKENIZER_SHA[key] = digest
    if digest != sha:
        log.error(
            "run %s: %s has sha256 %s, the manifest says %s: prepare the data again",
            run.id,
            path,
            digest,
            sha,
        )
        raise ApiError(
            ApiErrorCode.NOT_FOUND,
            f"run {run.id}'s tokenizer is not served: the file differs from the manifest's tokenizer_sha256",
        )
    # (FileResponse sets its own ETag, from the file's mtime and size)
    return web.FileResponse(
        path, headers={"Cache-Control": "public, max-age=86400", "Content-Type": "application/json"}
    )


async def events(app: Served, ctx: Ctx) -> web.StreamResponse:
    """SSE: replay the ring after Last-Event-ID (or ?after=), then stream live events."""
    run = app.svc.run(_run_id(ctx))
    req = ctx.request
    assert req is not None
    raw = req.headers.get("Last-Event-ID") or req.query.get("after") or "0"
    after = int(raw) if raw.isdigit() and len(raw) <= 18 else 0
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    q = app.events.subscribe(run.id)
    try:
        await resp.prepare(req)
        await resp.write(b"retry: 2000\n\n")
        for old in app.events.recent(run.id, after):
            await resp.write(old.sse())
        while not app.closing:
            try:
                ev: Event | None = await asyncio.wait_for(q.get(), SSE_KEEPALIVE_S)
            except asyncio.TimeoutError:
                await resp.write(b": keepalive\n\n")
                continue
            if ev is None:
                break
            if ev.seq > after:
                await resp.write(ev.sse())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        app.events.unsubscribe(run.id, q)
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await resp.write_eof()
    return resp
