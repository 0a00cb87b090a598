"""Serving a coordinator: the one function `distro-coordinator serve` and the tests both use.

    async with local_coordinator(CoordinatorConfig(db="sqlite:///tmp/c.db", operator_token="t")) as lc:
        ...  # lc.url, lc.app (CoordinatorApp), lc.site (HotSite: its hot_calls, handed_over)

It starts the app (store opened, memory rebuilt), creates the runs of ``run_files``, then
listens on ``cfg.host`` and ``port``: every connection starts on the hot path
(:class:`~.hotpath.HotSite`) and is handed to aiohttp's server for anything else. On exit it
shuts down gracefully (stop listening, finish in-flight calls within
``cfg.shutdown_timeout_s``, commit, close the store).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web

from distronet.coordinator.app import CoordinatorApp
from distronet.coordinator.config import CoordinatorConfig, load_run_file
from distronet.coordinator.hotpath import HotSite

__all__ = ["BACKLOG", "LocalCoordinator", "local_coordinator"]

log = logging.getLogger("distronet.coordinator")
BACKLOG = 2048  # listen queue: a swarm's nodes reconnecting at once must not be refused


@dataclass
class LocalCoordinator:
    app: CoordinatorApp
    url: str
    runner: web.AppRunner
    site: HotSite

    @property
    def port(self) -> int:
        return self.site.port


@contextlib.asynccontextmanager
async def local_coordinator(
    cfg: CoordinatorConfig,
    app: CoordinatorApp | None = None,
    *,
    port: int = 0,
    run_files: Sequence[str] = (),
    owns_process: bool = False,
) -> AsyncIterator[LocalCoordinator]:
    """Serve ``app`` (default: a new one for ``cfg``) on ``cfg.host`` and ``port`` (0: a free one).

    ``owns_process`` (`distro-coordinator serve`): this process is the coordinator's own, so
    process-wide settings apply: the GC threshold ``cfg.gc_threshold`` and ``gc.freeze`` of the
    long-lived state (:meth:`CoordinatorApp.freeze_heap`). Raises RunConfigError for a bad run
    file, StoreError when the store cannot be opened.
    """
    if owns_process and cfg.gc_threshold > 0:
        gc.set_threshold(cfg.gc_threshold, 50, 100)
    app = app if app is not None else CoordinatorApp(cfg)
    if owns_process:
        app.gc_freeze = True
    await app.start()
    try:
        for f in run_files:
            spec, root = load_run_file(f)
            _, created = app.svc.create_run(spec, shard_root=root)
            await app.committer.durable()
            log.info("run %s %s from %s", spec["id"], "created" if created else "already present", f)
        app.freeze_heap()
    except BaseException:
        await app.close()
        raise
    runner = web.AppRunner(
        app.web, access_log=None, handle_signals=False, shutdown_timeout=cfg.shutdown_timeout_s
    )
    await runner.setup()
    try:
        site = HotSite(
            runner,
            app,
            cfg.host,
            port,
            backlog=BACKLOG,
            reuse_address=True,
            shutdown_timeout=cfg.shutdown_timeout_s,
        )
        await site.start()
        yield LocalCoordinator(app, f"http://{cfg.host}:{site.port}", runner, site)
    finally:
        await runner.cleanup()
