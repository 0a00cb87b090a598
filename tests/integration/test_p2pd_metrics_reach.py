"""The bundled p2pd's metrics page, read as the node reads it: AutoNAT's verdict is there whatever
the flags; the hole-punch counter only with ``-autonat`` (which starts DCUtR), as docs/node.md says."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import subprocess
from pathlib import Path

import pytest

from distronet.node.swarm.p2pd_metrics import P2pdReach, fetch

pytestmark = [pytest.mark.timeout(60)]


def _p2pd() -> str:
    spec = importlib.util.find_spec("hivemind")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(spec.submodule_search_locations[0]) / "hivemind_cli" / "p2pd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _page_of(tmp: Path, *flags: str) -> P2pdReach:
    port = _free_port()
    proc = subprocess.Popen(
        [_p2pd(), "-listen", f"/unix{tmp}/p.sock", "-hostAddrs", "/ip4/127.0.0.1/tcp/0",
         "-metricsAddr", f"127.0.0.1:{port}", "-q", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while (got := await fetch(port, timeout_s=1.0)) is None:
            assert proc.poll() is None, "p2pd exited"
            assert asyncio.get_running_loop().time() < deadline, "p2pd's metrics page did not come up"
            await asyncio.sleep(0.05)
        return got
    finally:
        proc.kill()
        proc.wait(10)


async def test_hole_punching_runs_only_with_autonat(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert await _page_of(tmp_path / "a") == P2pdReach("unknown", -1)
    assert await _page_of(tmp_path / "b", "-autonat") == P2pdReach("unknown", 0)


async def test_nothing_listening_is_none() -> None:
    assert await fetch(_free_port(), timeout_s=1.0) is None
