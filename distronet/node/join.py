"""`distro-node join <run-id> --coordinator URL [...]`: run the node daemon until stopped.

Every flag is also a ``DISTRO_*`` environment variable and a key of ``--config FILE`` (see
``node/config.py``). Exit codes are ``ExitCode``: 0 after a clean stop (SIGINT/SIGTERM or
``--max-steps``), 2 bad configuration, 3 coordinator unreachable, 4 refused, 5 network, 6 still
alive past the shutdown deadline, 130 a second Ctrl-C.

Shutdown has a deadline: from the first SIGINT/SIGTERM (or the end of the run) a watchdog
thread gives the process ``shutdown_timeout_s`` (+ ``WATCHDOG_GRACE_S``) to exit; past it, it
logs the daemon's shutdown stage, dumps every thread's stack to stderr (``faulthandler``) and
exits with ``ExitCode.SHUTDOWN_TIMEOUT``. SIGUSR1 dumps every thread's stack at any time.

Process tuning comes from the config and is applied here, in the open: ``train.omp_spincount``
as ``GOMP_SPINCOUNT`` before torch loads (``tune_torch_env``), ``event_loop`` for the loop
(``_run``); ``net.p2pd_gogc`` goes to p2pd's own environment (``swarm/p2p.py``). The collector
is a design, not a knob: off while the node is built, then everything built frozen out of every
later collection (``_main``, ``run_node``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from distronet.node.config import NodeConfig, add_config_arguments, config_from_args
from distronet.node.exitcodes import ExitCode
from distronet.protocol.errors import ConfigError

__all__ = ["ShutdownWatchdog", "add_parser", "run_node", "tune_torch_env"]

log = logging.getLogger("distronet.node")
WATCHDOG_GRACE_S = 3.0  # past shutdown_timeout_s, the watchdog forces exit


class ShutdownWatchdog:
    """A daemon thread that forces the process out once shutdown overruns its deadline.

    ``arm(seconds)`` (the first call starts the clock; a later call only shortens it). Past the
    deadline: log ``stage()`` (what shutdown was doing), dump every thread's stack to stderr,
    ``os._exit(ExitCode.SHUTDOWN_TIMEOUT)``. It watches the interpreter's own exit too (loop
    teardown, executor and thread joins), so no path out of the daemon can hang.
    """

    def __init__(self, stage: Callable[[], str]) -> None:
        self.stage = stage
        self.deadline: float | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        if self.deadline is not None and self.deadline <= end:
            return
        self.deadline = end
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="shutdown-watchdog", daemon=True)
            self._thread.start()
        self._wake.set()

    def _watch(self) -> None:
        while True:
            assert self.deadline is not None
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            self._wake.wait(left)
            self._wake.clear()
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"\nshutdown did not finish in time (stage: {self.stage()}); every thread's stack:\n"
            )
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        os._exit(int(ExitCode.SHUTDOWN_TIMEOUT))


def _force_exit() -> None:
    sys.stderr.write("\nsecond interrupt: exiting now\n")
    sys.stderr.flush()
    os._exit(int(ExitCode.INTERRUPTED))


def _leave_process(code: int) -> NoReturn:
    """Flush the logs and leave with ``code`` at once, skipping the interpreter's teardown.

    Once the node is closed (checkpoint fsynced, status written, run left, p2pd stopped) there
    is nothing left to tear down, and the teardown is what made a stopping node slow: a full
    garbage collection of the torch/hivemind/numba heap (4-9 s seen on a loaded 2-core machine,
    after ``close`` had finished in under 2 s) and joins of worker threads (an abandoned step's
    thread never returns)."""
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


async def run_node(cfg: NodeConfig) -> int:
    """Create the node, run it, close it, and leave the process (``_leave_process``) with the
    exit code; SIGINT/SIGTERM stop it cleanly, a second one forces exit."""
    from distronet.node.daemon.node import Node, NodeError

    loop = asyncio.get_running_loop()
    node: Node | None = None
    stop_seen = False
    early_stop = asyncio.Event()
    limit = cfg.shutdown_timeout_s + WATCHDOG_GRACE_S
    watchdog = ShutdownWatchdog(lambda: node.stage if node is not None else "starting")
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    def on_signal() -> None:
        nonlocal stop_seen
        if stop_seen:
            _force_exit()
        stop_seen = True
        watchdog.arm(limit)
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
            gc.freeze()  # what the start built lives as long as the process (see _main)
            gc.enable()
            if early_stop.is_set():
                node.request_stop()
            code = await node.run()
        except NodeError as e:
            log.error("%s", e)
            code = e.exit_code
        finally:
            if node is not None:
                from distronet.node.daemon.node import CLOSE_BUDGET_S

                watchdog.arm(CLOSE_BUDGET_S + WATCHDOG_GRACE_S)  # close, then the process's own exit
                await node.close()
        _leave_process(int(code))
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
            if stop_seen:  # a second Ctrl-C while the process winds down still forces exit 130
                signal.signal(sig, lambda *_: _force_exit())


def tune_torch_env(cfg: NodeConfig) -> None:
    """Export ``GOMP_SPINCOUNT = train.omp_spincount`` (0: leave the environment's) for torch's
    OpenMP workers. libgomp reads it once, when torch loads: call before ``preload_torch``."""
    spin = cfg.train.omp_spincount
    if not spin:
        return
    if "torch" in sys.modules:  # pragma: no cover - a programming error, not a user's
        log.warning("torch is already loaded: omp_spincount=%d has no effect", spin)
    os.environ["GOMP_SPINCOUNT"] = str(spin)


def _run(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """Run the daemon's coroutine on uvloop (a hivemind dependency; its loop costs the node ~3 ms
    of CPU a step less than asyncio's), or on asyncio's loop where uvloop is missing or
    ``event_loop="asyncio"`` asks for it."""
    if event_loop == "uvloop":
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
    # The start builds ~300k objects that live as long as the process (torch, hivemind, numba,
    # the model): Python's collector would scan them all 4-5 times while they are made (0.2-0.35 s
    # each on a loaded 2-core machine) and again at every later full collection. It stays off
    # until the node is built, which then freezes them out of every collection (run_node).
    gc.disable()
    from distronet.node.daemon.parts import preload_torch, warm_decoder

    tune_torch_env(cfg)
    preload_torch()  # while the node connects; also keeps TorchDynamo out (~2 CPU-s less)
    warm_decoder()
    try:
        return _run(run_node(cfg), cfg.event_loop)
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
