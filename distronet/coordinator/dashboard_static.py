"""Serves the operator dashboard's static page at ``/dashboard/`` (no Python of the dashboard runs here).

The page's files are package data of ``distronet.dashboard`` (``dashboard/static/``), located with
:mod:`importlib.resources` — data, not code, so the coordinator still imports only the protocol
layer. They are read once, when the routes are added, into an in-memory table keyed by file name:
a request names a key of that table or gets 404, so no request path ever reaches the filesystem
and no path can climb out of the folder. Only known suffixes are served, each with an explicit
content type; every answer carries a strict Content-Security-Policy (nothing loads from another
origin, no inline script or style) and an ETag, and asks the browser to revalidate (the file
names carry no version, so a long cache would keep an old page after an upgrade).

Routes: ``GET /dashboard`` -> 301 to ``/dashboard/`` (query kept); ``GET /dashboard/`` -> the
page; ``GET /dashboard/{name}`` -> one asset. HEAD works on each.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = [
    "CONTENT_TYPES",
    "CSP",
    "DASHBOARD_PATH",
    "MAX_ASSET_BYTES",
    "Asset",
    "add_dashboard_routes",
    "load_assets",
]

log = logging.getLogger(__name__)

DASHBOARD_PATH = "/dashboard"
MAX_ASSET_BYTES = 2 * 1024 * 1024
CONTENT_TYPES: Mapping[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True)
class Asset:
    """One static file held in memory."""

    body: bytes
    content_type: str
    etag: str  # quoted, strong


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else ""


def load_assets(root: Traversable | None = None) -> dict[str, Asset]:
    """The servable files directly under ``root`` (default: the package's ``static`` folder).

    Skips hidden files, sub-folders, unknown suffixes and files over :data:`MAX_ASSET_BYTES`.
    Returns ``{}`` (and logs a warning) when the folder is missing, so the coordinator still
    starts without its page. Cost: reads each file once.
    """
    if root is None:
        root = importlib.resources.files("distronet.dashboard") / "static"
    if not root.is_dir():
        log.warning("dashboard assets not found at %s; /dashboard/ will answer 404", root)
        return {}
    assets: dict[str, Asset] = {}
    for entry in root.iterdir():
        name = entry.name
        ctype = CONTENT_TYPES.get(_suffix(name))
        if name.startswith(".") or ctype is None or not entry.is_file():
            continue
        body = entry.read_bytes()
        if len(body) > MAX_ASSET_BYTES:
            log.warning("dashboard asset %s is %d bytes, over the %d limit; not served", name, len(body),
                        MAX_ASSET_BYTES)  # fmt: skip
            continue
        assets[name] = Asset(body, ctype, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return assets


def _answer(request: web.Request, asset: Asset) -> web.Response:
    headers = {**_SECURITY_HEADERS, "Cache-Control": "no-cache", "ETag": asset.etag}
    inm = request.headers.get("If-None-Match", "")
    if asset.etag in (t.strip() for t in inm.split(",")) or inm.strip() == "*":
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = asset.content_type
    return web.Response(body=asset.body, headers=headers)


def _not_found(what: str) -> web.Response:
    return web.Response(
        status=404,
        text=f"no dashboard file {what[:64]!r}\n",
        headers={
            **_SECURITY_HEADERS,
            "Content-Type": "text/plain; charset=utf-8",
            "Cache-Control": "no-store",
        },
    )


def add_dashboard_routes(app: web.Application, root: Traversable | None = None) -> dict[str, Asset]:
    """Add the dashboard's routes to ``app`` (before it starts); returns the assets it serves."""
    assets = load_assets(root)

    async def redirect(request: web.Request) -> web.StreamResponse:
        qs = request.query_string
        location = DASHBOARD_PATH + "/" + ("?" + qs if qs else "")
        return web.Response(status=301, headers={"Location": location, "Cache-Control": "no-cache"})

    async def index(request: web.Request) -> web.StreamResponse:
        asset = assets.get("index.html")
        return _answer(request, asset) if asset is not None else _not_found("index.html")

    async def asset(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        found = assets.get(name)
        return _answer(request, found) if found is not None else _not_found(name)

    app.router.add_get(DASHBOARD_PATH, redirect, name="dashboard_redirect")
    app.router.add_get(DASHBOARD_PATH + "/", index, name="dashboard")
    app.router.add_get(DASHBOARD_PATH + "/{name}", asset, name="dashboard_asset")
    return assets
