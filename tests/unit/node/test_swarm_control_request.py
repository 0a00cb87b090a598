"""``control.request``: one p2pd control request, its socket closed on every path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from distronet.node.swarm import control
from distronet.node.swarm.errors import DaemonError

pb = control.pb  # hivemind's p2pd protobufs, imported through the swarm package (torch-free)

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class FakeDaemon:
    """A control socket whose answer each test sets; it records when each connection ended."""

    def __init__(self) -> None:
        self.serve: Serve | None = None
        self.ended: list[bool] = []  # per connection: the client closed it (EOF seen)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = pb.Request()
        await control.read_delimited(reader, req)
        assert self.serve is not None
        await self.serve(reader, writer)
        self.ended.append(await reader.read() == b"")
        writer.close()


@pytest_asyncio.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[tuple[FakeDaemon, str]]:
    fake = FakeDaemon()
    path = str(tmp_path / "p2pd.sock")
    server = await asyncio.start_unix_server(fake.handle, path)
    try:
        yield fake, path
    finally:
        server.close()
        await server.wait_closed()


def _answer(resp: pb.Response) -> Serve:
    async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await control.write_delimited(writer, resp)

    return serve


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the fake daemon never saw the connection end")


async def test_an_answer_is_returned_and_the_socket_closed(daemon: tuple[FakeDaemon, str]) -> None:
    fake, path = daemon
    ok = pb.Response(type=pb.Response.OK, peers=[pb.PeerInfo(id=b"\x01" * 38, addrs=[b"\x04"])])
    fake.serve = _answer(ok)
    resp = await control.request(path, pb.Request(type=pb.Request.LIST_PEERS), 5.0)
    assert [p.id for p in resp.peers] == [b"\x01" * 38]
    await _until(lambda: fake.ended == [True])


async def test_a_refusal_is_a_daemon_error_with_its_message(daemon: tuple[FakeDaemon, str]) -> None:
    fake, path = daemon
    fake.serve = _answer(pb.Response(type=pb.Response.ERROR, error=pb.ErrorResponse(msg="no route")))
    with pytest.raises(DaemonError, match="refused CONNECT: no route"):
        await control.request(path, pb.Request(type=pb.Request.CONNECT), 5.0)
    await _until(lambda: fake.ended == [True])


async def test_a_silent_daemon_is_a_daemon_error_and_the_socket_is_closed(
    daemon: tuple[FakeDaemon, str],
) -> None:
    fake, path = daemon
    fake.serve = lambda _r, _w: asyncio.sleep(0)  # reads the request, never answers
    with pytest.raises(DaemonError, match=r"did not answer DISCONNECT within 0\.2 s"):
        await control.request(path, pb.Request(type=pb.Request.DISCONNECT), 0.2)
    await _until(lambda: fake.ended == [True])


async def test_a_daemon_that_hangs_up_or_is_gone_is_a_daemon_error(
    daemon: tuple[FakeDaemon, str], tmp_path: Path
) -> None:
    fake, path = daemon

    async def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x05ab")  # a frame of 5 bytes cut after 2
        writer.close()

    fake.serve = hang_up
    with pytest.raises(DaemonError, match="failed during LIST_PEERS"):
        await control.request(path, pb.Request(type=pb.Request.LIST_PEERS), 5.0)
    with pytest.raises(DaemonError, match="failed during LIST_PEERS"):
        await control.request(str(tmp_path / "none.sock"), pb.Request(type=pb.Request.LIST_PEERS), 5.0)


async def test_an_answer_over_the_limit_is_refused(daemon: tuple[FakeDaemon, str]) -> None:
    fake, path = daemon
    big = pb.Response(type=pb.Response.OK, peers=[pb.PeerInfo(id=bytes(38)) for _ in range(100)])
    fake.serve = _answer(big)
    with pytest.raises(DaemonError):
        await control.request(path, pb.Request(type=pb.Request.LIST_PEERS), 5.0, limit=1000)
