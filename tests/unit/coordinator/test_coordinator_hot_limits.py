"""The hot path's absolute deadlines and per-IP connection cap, over real loopback sockets:
a client dribbling one byte at a time is closed at the head (or body) deadline, however
often it sends; the connection past an IP's cap is closed as it opens."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import local_coordinator

TOKEN = "hot-limits-operator-token"
HEAD = (
    b"POST /api/v1/runs/r1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 40\r\n"
)


def _cfg(tmp_path: Path, **kw: object) -> CoordinatorConfig:
    return CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN, **kw)  # type: ignore[arg-type]


async def _closed(reader: asyncio.StreamReader, within: float) -> bool:
    """True when the server closes the connection (EOF or reset) within ``within`` seconds."""
    try:
        return await asyncio.wait_for(reader.read(1), within) == b""
    except (ConnectionError, asyncio.IncompleteReadError):
        return True
    except asyncio.TimeoutError:
        return False


async def _dribble(writer: asyncio.StreamWriter, data: bytes, every: float, stop: float) -> int:
    """Send ``data`` one byte every ``every`` s until it is sent, the peer goes or ``stop``."""
    sent = 0
    for b in data:
        if time.monotonic() >= stop or writer.is_closing():
            break
        try:
            writer.write(bytes([b]))
            await writer.drain()
        except ConnectionError:
            break
        sent += 1
        await asyncio.sleep(every)
    return sent


async def test_a_dribbled_head_is_closed_at_its_deadline(tmp_path: Path) -> None:
    async with local_coordinator(_cfg(tmp_path, head_timeout_s=0.8)) as lc:
        host, port = lc.url.split("//")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        t0 = time.monotonic()
        feeder = asyncio.create_task(_dribble(writer, HEAD * 50, 0.05, t0 + 10))
        assert await _closed(reader, 5.0)  # the bytes kept coming; the deadline held anyway
        took = time.monotonic() - t0
        feeder.cancel()
        writer.close()
        assert 0.7 <= took < 3.0, took


async def test_a_dribbled_body_is_closed_at_its_deadline(tmp_path: Path) -> None:
    async with local_coordinator(_cfg(tmp_path, head_timeout_s=5.0, body_timeout_s=0.8)) as lc:
        host, port = lc.url.split("//")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(HEAD + b"\r\n")  # a whole head, then a 40-byte body a byte at a time
        t0 = time.monotonic()
        feeder = asyncio.create_task(_dribble(writer, b"x" * 40, 0.1, t0 + 10))
        assert await _closed(reader, 3.5)
        took = time.monotonic() - t0
        feeder.cancel()
        writer.close()
        assert 0.7 <= took < 3.0, took  # 40 bytes at 10/s would take 4 s


async def test_connections_past_the_per_ip_cap_are_closed(tmp_path: Path) -> None:
    async with local_coordinator(_cfg(tmp_path, max_conns_per_ip=3)) as lc:
        host, port = lc.url.split("//")[1].split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await _closed(reader, 3.0)  # the 4th from 127.0.0.1
        assert lc.site._hot.refused == 1
        for r, _w in held:
            assert not await _closed(r, 0.2)  # the first three stay open
        # a handed-over connection (a non-hot route) still counts until it closes
        held[0][1].write(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(held[0][0].readuntil(b"\r\n"), 5)).startswith(b"HTTP/1.1")
        r5, w5 = await asyncio.open_connection(host, int(port))
        assert await _closed(r5, 3.0)
        # once one closes, a new connection from the IP is served again
        held[1][1].close()
        deadline = time.monotonic() + 5
        while lc.site._hot.per_ip.get("127.0.0.1", 0) > 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        r6, w6 = await asyncio.open_connection(host, int(port))
        assert not await _closed(r6, 0.3)
        for _r, w in [*held, (reader, writer), (r5, w5), (r6, w6)]:
            w.close()
