"""A short way in for the four hot node routes: heartbeat, lease, renew and complete.

Every node calls these every few seconds; they are nearly all of the coordinator's traffic.
aiohttp's application layer (router walk with a regex per candidate route, middleware chain,
per-request app bookkeeping) costs about a tenth of such a call. :func:`install_fast_path`
puts a dispatcher in front of it on the running server: a POST whose raw path is exactly one
of the hot routes goes straight to that route's pipeline (:meth:`CoordinatorApp._wrap`, the same
one the router calls: same auth, limits, validation, durability and error answers, same
metrics via :meth:`CoordinatorApp.guarded`); everything else, including anything percent-encoded,
with a query string, or with ``Expect: 100-continue``, goes through aiohttp's application as
before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import hdrs, web

from distronet.protocol.coordinator_api import API_PREFIX

if TYPE_CHECKING:
    from distronet.coordinator.app import CoordinatorApp

__all__ = ["install_fast_path", "match_hot"]

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


def install_fast_path(runner: web.AppRunner, app: CoordinatorApp) -> None:
    """Route hot calls on ``runner``'s server straight to ``app``'s pipelines.

    Call after ``await runner.setup()`` and before any site starts (connections take the
    server's handler when they open). Raises RuntimeError when the runner is not set up.
    """
    server = runner.server
    if server is None:
        raise RuntimeError("install_fast_path needs a runner after `await runner.setup()`")
    fallback = server.request_handler
    pipelines = app.pipelines

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        hit = match_hot(request.method, request.raw_path)
        if hit is None or hdrs.EXPECT in request.headers:
            return await fallback(request)
        name, params = hit
        return await app.guarded(name, request, pipelines[name](request, params))

    server.request_handler = handle
