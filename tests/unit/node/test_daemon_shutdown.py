"""Shutdown is bounded: close() against a stalled coordinator, the watchdog's forced exit, and
the coroutine chain a stuck task is reported with."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from distronet.node.config import NodeConfig
from distronet.node.daemon.coordinator_client import CoordinatorClient
from distronet.node.daemon.node import CLOSE_BUDGET_S, CLOSE_CAPS_S, Node, NodeState
from distronet.node.daemon.parts import awaiting
from distronet.node.exitcodes import ExitCode
from distronet.protocol.identity import Identity


@pytest.fixture
def stalled_url() -> Iterator[str]:
    """A coordinator that accepts connections and never answers (as a SIGSTOPped one does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_close_against_a_stalled_coordinator_is_capped(stalled_url: str) -> None:
    node = Node(NodeConfig(run_id="r", coordinator=stalled_url))
    node._to(NodeState.STARTING)
    node.client = CoordinatorClient(stalled_url, "r", Identity.generate(), timeout_s=60.0)
    node.join_sent = True  # a node that joined leaves the run on close
    t0 = time.monotonic()
    await node.close()
    took = time.monotonic() - t0
    assert node.state is NodeState.CLOSED and node.stage == "closed"
    # the leave waited out its own cap (not the client's 60 s timeout), and nothing else hung
    assert CLOSE_CAPS_S["leave the run"] - 0.1 <= took <= CLOSE_CAPS_S["leave the run"] + 1.5, took


def test_wind_down_leaves_the_close_budget() -> None:
    node = Node(NodeConfig(run_id="r", coordinator="http://127.0.0.1:9", shutdown_timeout_s=25.0))
    assert node.wind_down_s() == pytest.approx(25.0 - CLOSE_BUDGET_S)
    node.request_stop()
    node.request_stop()  # the first request starts the clock
    assert 0 < node.wind_down_s() <= 25.0 - CLOSE_BUDGET_S
    tiny = Node(NodeConfig(run_id="r", coordinator="http://127.0.0.1:9", shutdown_timeout_s=1.0))
    assert tiny.wind_down_s() == pytest.approx(2.0)  # MIN_WIND_DOWN_S


async def test_awaiting_names_the_coroutine_chain() -> None:
    async def stuck_inner() -> None:
        await asyncio.sleep(30)

    async def stuck_outer() -> None:
        await stuck_inner()

    task = asyncio.ensure_future(stuck_outer())
    await asyncio.sleep(0.01)
    where = awaiting(task)
    task.cancel()
    assert where.index("stuck_outer") < where.index("stuck_inner") < where.index("sleep")


def test_watchdog_dumps_stacks_and_exits_with_its_code() -> None:
    code = (
        "import threading, time\n"
        "from distronet.node.join import ShutdownWatchdog\n"
        "ShutdownWatchdog(lambda: 'leave the run').arm(0.3)\n"
        "def parked():\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=parked, name='parked').start()\n"
        "time.sleep(30)\n"
    )
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert r.returncode == ExitCode.SHUTDOWN_TIMEOUT, r.stderr[-2000:]
    assert time.monotonic() - t0 < 20
    err = r.stderr.decode()
    assert "stage: leave the run" in err and "in parked" in err, err
