"""An in-process coordinator on a loopback port, for tests and tools (real HTTP, real store).

async with local_coordinator(CoordinatorConfig(db="sqlite:///tmp/c.db", operator_token="t")) as lc:
    ...  # lc.url, lc.app (CoordinatorApp), lc.site (HotSite: its hot_calls, handed_over)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from distronet.coordinator.app import CoordinatorApp
from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.fastpath import install_fast_path
from distronet.coordinator.hotpath import HotSite

__all__ = ["LocalCoordinator", "local_coordinator"]


@dataclass
class LocalCoordinator:
    app: CoordinatorApp
    url: str
    runner: web.AppRunner
    site: HotSite


@contextlib.asynccontextmanager
async def local_coordinator(
    cfg: CoordinatorConfig, app: CoordinatorApp | None = None, *, port: int = 0
) -> AsyncIterator[LocalCoordinator]:
    """Start a coordinator on ``cfg.host`` and ``port`` (0: a free one); shut it down gracefully on exit."""
    app = app if app is not None else CoordinatorApp(cfg)
    await app.start()
    runner = web.AppRunner(
        app.web, access_log=None, handle_signals=False, shutdown_timeout=cfg.shutdown_timeout_s
    )
    await runner.setup()
    install_fast_path(runner, app)
    try:
        site = HotSite(runner, app, cfg.host, port, shutdown_timeout=cfg.shutdown_timeout_s)
        await site.start()
        port = site.port
        yield LocalCoordinator(app, f"http://{cfg.host}:{port}", runner, site)
    finally:
        await runner.cleanup()
