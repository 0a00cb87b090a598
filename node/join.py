"""`distro-node join <run-id> --coordinator URL [...]`: run the node daemon until stopped.

Every flag is also a ``DISTRO_*`` environment variable and a key of ``--config FILE`` (see
``node/config.py``). Exit codes are ``ExitCode``: 0 after a clean stop (SIGINT/SIGTERM or
``--max-steps``), 2 bad configuration, 3 coordinator unreachable, 4 refused, 5 network, 130 a
second Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from distronet.node.config import NodeConfig, add_config_arguments, config_from_args
from distronet.node.exitcodes import ExitCode
from distronet.protocol.errors import ConfigError

__all__ = ["add_parser", "run_node"]

log = logging.getLogger("distronet.node")


def _force_exit() -> None:
    sys.stderr.write("\nsecond interrupt: exiting now\n")
    sys.stderr.flush()
    os._exit(int(ExitCode.INTERRUPTED))


async def run_node(cfg: NodeConfig) -> int:
    """Create the node, run it, close it; SIGINT/SIGTERM stop it cleanly, a second one forces exit."""
    from distronet.node.daemon import Node, NodeError

    loop = asyncio.get_running_loop()
    node: Node | None = None
    stop_seen = False
    early_stop = asyncio.Event()

    def on_signal() -> None:
        nonlocal stop_seen
        if stop_seen:
            _force_exit()
        stop_seen = True
        log.info("stop requested: finishing the step in flight (Ctrl-C again to force)")
        early_stop.set()
        if node is not None:
            node.request_stop()

    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal)
    try:
        try:
            node = await Node.create(cfg)
            if early_stop.is_set():
                node.request_stop()
            code = await node.run()
        except NodeError as e:
            log.error("%s", e)
            code = e.exit_code
        finally:
            if node is not None:
                await node.close()
        if node is not None and node.abandoned:
            logging.shutdown()
            os._exit(int(code))  # a worker thread is still inside the abandoned step
        return int(code)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
            if stop_seen:  # a second Ctrl-C while the process winds down still forces exit 130
                signal.signal(sig, lambda *_: _force_exit())


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run the daemon's coroutine on uvloop (a hivemind dependency; its loop costs the node ~3 ms
    of CPU a step less than asyncio's), or on asyncio's loop where uvloop is missing or
    ``DISTRO_EVENT_LOOP=asyncio`` asks for it."""
    if os.environ.get("DISTRO_EVENT_LOOP", "uvloop") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return int(uvloop.run(main))
    return asyncio.run(main)


def _main(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"distro-node join: {e}", file=sys.stderr)
        return int(ExitCode.USAGE)
    logging.basicConfig(
        level=cfg.observe.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    from distronet.node.node_parts import no_dynamo_for_optimizers, warm_decoder

    no_dynamo_for_optimizers()  # ~2 CPU-s less before the first step (a newcomer's start)
    warm_decoder()
    try:
        return _run(run_node(cfg))
    except ConfigError as e:
        print(f"distro-node join: {e}", file=sys.stderr)
        return int(ExitCode.USAGE)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node join`."""
    p = sub.add_parser(
        "join",
        help="join a training run and train until stopped",
        description="Join a training run: train on leased shards and exchange with peers within budget.",
    )
    add_config_arguments(p)
    p.set_defaults(func=_main)
