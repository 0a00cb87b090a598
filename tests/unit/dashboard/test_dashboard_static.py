"""The dashboard's static handler: redirect, content types, CSP, caching, and no path traversal."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from distronet.coordinator import dashboard_static as ds
from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import local_coordinator

SECRET = "top-secret-do-not-serve"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A static folder with one file of each kind, plus bait beside and below it."""
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "secret.js").write_text(SECRET)
    static = tmp_path / "static"
    static.mkdir()
    (static / "index.html").write_text("<!doctype html><title>t</title>")
    (static / "app.js").write_text("'use strict';")
    (static / "style.css").write_text("body{}")
    (static / "icon.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    (static / "notes.txt").write_text(SECRET)  # unknown suffix: never served
    (static / ".hidden.js").write_text(SECRET)
    sub = static / "sub"
    sub.mkdir()
    (sub / "deep.js").write_text(SECRET)
    return static


@pytest.fixture
async def client(root: Path) -> AsyncIterator[TestClient]:
    app = web.Application()
    ds.add_dashboard_routes(app, root)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_bare_path_redirects_to_the_page_keeping_the_query(client: TestClient) -> None:
    r = await client.get("/dashboard?run=r1", allow_redirects=False)
    assert r.status == 301
    assert r.headers["Location"] == "/dashboard/?run=r1"
    r = await client.get("/dashboard", allow_redirects=False)
    assert r.headers["Location"] == "/dashboard/"


@pytest.mark.parametrize(
    ("path", "ctype"),
    [
        ("/dashboard/", "text/html; charset=utf-8"),
        ("/dashboard/index.html", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/style.css", "text/css; charset=utf-8"),
        ("/dashboard/icon.svg", "image/svg+xml"),
    ],
)
async def test_files_have_their_content_type_and_security_headers(
    client: TestClient, path: str, ctype: str
) -> None:
    r = await client.get(path)
    assert r.status == 200
    assert r.headers["Content-Type"] == ctype
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "*" not in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Cache-Control"] == "no-cache"
    assert re.fullmatch(r'"[0-9a-f]{32}"', r.headers["ETag"])


async def test_a_matching_etag_gets_304_without_a_body(client: TestClient) -> None:
    first = await client.get("/dashboard/app.js")
    etag = first.headers["ETag"]
    r = await client.get("/dashboard/app.js", headers={"If-None-Match": f'"nope", {etag}'})
    assert r.status == 304
    assert await r.read() == b""
    r = await client.get("/dashboard/app.js", headers={"If-None-Match": '"other"'})
    assert r.status == 200 and await r.text() == "'use strict';"


async def test_head_answers_without_a_body(client: TestClient) -> None:
    r = await client.head("/dashboard/style.css")
    assert r.status == 200
    assert r.headers["Content-Type"] == "text/css; charset=utf-8"


@pytest.mark.parametrize(
    "raw",
    [
        "/dashboard/../secret.txt",
        "/dashboard/..%2fsecret.txt",
        "/dashboard/%2e%2e%2fsecret.js",
        "/dashboard/%2E%2E/secret.js",
        "/dashboard/..%5csecret.js",
        "/dashboard/sub/deep.js",
        "/dashboard/sub%2fdeep.js",
        "/dashboard/.hidden.js",
        "/dashboard/notes.txt",
        "/dashboard/%00app.js",
        "/dashboard//etc/passwd",
        "/dashboard/" + "a" * 5000 + ".js",
    ],
)
async def test_nothing_outside_the_asset_table_is_served(client: TestClient, raw: str) -> None:
    r = await client.get(URL(raw, encoded=True), allow_redirects=False)
    body = await r.text()
    assert r.status in (400, 404, 414), (raw, r.status)
    assert SECRET not in body


async def test_assets_are_read_once_so_later_files_are_not_served(client: TestClient, root: Path) -> None:
    (root / "late.js").write_text(SECRET)
    r = await client.get("/dashboard/late.js")
    assert r.status == 404


async def test_missing_folder_gives_no_assets_and_the_page_404s(tmp_path: Path) -> None:
    app = web.Application()
    assert ds.add_dashboard_routes(app, tmp_path / "absent") == {}
    async with TestClient(TestServer(app)) as c:
        r = await c.get("/dashboard/")
        assert r.status == 404 and "no dashboard file" in await r.text()


def test_oversize_files_are_skipped(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds, "MAX_ASSET_BYTES", 10)
    assets = ds.load_assets(root)
    assert "app.js" not in assets  # 13 bytes
    assert set(assets) == {"style.css"}  # 6 bytes; the others are over 10


# ---------------------------------------------------------------- the packaged page


def test_the_package_ships_the_page() -> None:
    assets = ds.load_assets()
    assert {"index.html", "app.js", "style.css", "favicon.svg"} <= set(assets)


def test_the_page_loads_nothing_from_elsewhere_and_nothing_inline() -> None:
    """The CSP would block inline script/style; the page must not need any, nor another origin."""
    assets = ds.load_assets()
    html = assets["index.html"].body.decode()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert re.search(r'\bsrc="[a-z.]+"', tag), tag  # external, relative, same folder
    assert not re.search(r"<script\b[^>]*>\s*[^<\s]", html)  # no inline code
    assert "<style" not in html and " style=" not in html
    assert not re.search(r"\son[a-z]+=", html)  # no inline handlers
    for url in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert "//" not in url and not url.startswith("/"), url
    js = assets["app.js"].body.decode()
    assert "innerHTML" not in js and "eval(" not in js
    assert re.findall(r"https?://[^'\"\s]*", js) == ["http://www.w3.org/2000/svg"]  # a namespace, not a load
    css = assets["style.css"].body.decode()
    assert "url(" not in css and "@import" not in css


async def test_the_coordinator_serves_the_dashboard(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}")
    async with local_coordinator(cfg) as lc:
        app = lc.app.web
        assert {"dashboard", "dashboard_asset", "dashboard_redirect"} <= {r.name for r in app.router.routes()}
        async with TestClient(TestServer(app)) as c:
            r = await c.get("/dashboard/")
            assert r.status == 200 and "app.js" in await r.text()
            r = await c.get("/dashboard/app.js")
            assert r.status == 200 and "EventSource" in await r.text()
