"""`distro-coordinator`: the run's lightweight coordinator service.

    distro-coordinator serve [--db sqlite:///path | postgresql://...] [--run run.toml ...]

Every :class:`~distronet.coordinator.config.CoordinatorConfig` field is a flag (``--field-name``)
and an environment variable (``DISTRO_COORD_FIELD_NAME``); the flag wins. SIGINT/SIGTERM shut
down gracefully (stop accepting, finish in-flight requests, commit, close the store) within
``--shutdown-timeout-s``; a second signal exits at once with code 130.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "config_from_args", "main"]

ENV_PREFIX = "DISTRO_COORD_"
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
log = logging.getLogger("distronet.coordinator")


def _fields() -> list[dataclasses.Field[Any]]:
    from distronet.coordinator.config import CoordinatorConfig

    return list(dataclasses.fields(CoordinatorConfig))


def build_parser() -> argparse.ArgumentParser:
    """The `distro-coordinator` parser; `serve` has one flag per config field."""
    parser = argparse.ArgumentParser(
        prog="distro-coordinator", description="Coordinator of distro-node runs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="serve the coordinator API")
    for f in _fields():
        flag = "--" + f.name.replace("_", "-")
        env = ENV_PREFIX + f.name.upper()
        kind: Any = type(f.default) if f.default is not None else str
        serve.add_argument(flag, type=kind, default=None, help=f"(env {env}; default {f.default!r})")
    serve.add_argument(
        "--run", action="append", default=[], metavar="FILE", help="create this run (TOML) at start"
    )
    serve.add_argument("--log-level", default=os.environ.get(ENV_PREFIX + "LOG_LEVEL", "INFO"))
    return parser


def config_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Any:
    """A CoordinatorConfig from flags, then ``DISTRO_COORD_*`` variables, then defaults."""
    from distronet.coordinator.config import CoordinatorConfig
    from distronet.coordinator.errors import RunConfigError

    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    for f in _fields():
        v = getattr(args, f.name, None)
        if v is None and ENV_PREFIX + f.name.upper() in env:
            raw = env[ENV_PREFIX + f.name.upper()]
            kind: Any = type(f.default) if f.default is not None else str
            try:
                v = kind(raw)
            except ValueError:
                raise RunConfigError(
                    f"{ENV_PREFIX}{f.name.upper()}={raw!r} is not a {kind.__name__}"
                ) from None
        if v is not None:
            values[f.name] = v
    return CoordinatorConfig(**values)


async def serve(cfg: Any, run_files: Sequence[str]) -> int:
    """Run the service until a signal or a storage failure. Returns the exit code.

    The first SIGINT/SIGTERM starts a graceful shutdown; a second one, even during it, exits
    at once (130)."""
    from distronet.coordinator.local import local_coordinator

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    hits = [0]

    def on_signal() -> None:
        hits[0] += 1
        if hits[0] > 1:
            os._exit(EXIT_INTERRUPTED)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        async with local_coordinator(cfg, port=cfg.port, run_files=run_files, owns_process=True) as lc:
            if cfg.port_file:
                tmp = Path(cfg.port_file + ".tmp")
                tmp.write_text(str(lc.port))
                os.replace(tmp, cfg.port_file)
            log.info("coordinator listening on %s (store %s)", lc.url, lc.app.store.url_scheme)
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lc.app.fatal.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            log.info("shutting down")
        return EXIT_ERROR if lc.app.fatal.is_set() else EXIT_OK
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `distro-coordinator` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from distronet.protocol.errors import DistroError

    try:
        cfg = config_from_args(args)
        try:
            import uvloop  # optional: a faster event loop where installed

            runner: Any = uvloop.run
        except ImportError:
            runner = asyncio.run
        return int(runner(serve(cfg, args.run)))
    except DistroError as e:
        print(f"distro-coordinator: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
