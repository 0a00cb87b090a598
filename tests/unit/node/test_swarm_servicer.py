"""The stream-servicer seam (swarm/servicer.py) on real Unix sockets: framing, deadlines and
error mapping, the same path a p2pd stream takes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from distronet.node.swarm.errors import StreamError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.servicer import StreamCall, StreamRoute, StreamServicer, ask
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity


@asynccontextmanager
async def served(
    tmp_path: Path, route: StreamRoute, servicer: StreamServicer
) -> AsyncIterator[Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]]:
    path = str(tmp_path / "s")

    async def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await servicer.handle(route, None, reader, writer)

    server = await asyncio.start_unix_server(on_stream, path)
    try:
        yield lambda: asyncio.open_unix_connection(path)
    finally:
        server.close()
        await server.wait_closed()


async def echo(call: StreamCall) -> bytes:
    if call.request == b"bad!":
        raise Rejected(RejectCode.MALFORMED, "bad request")
    if call.request == b"bug!":
        raise RuntimeError("a bug in the handler")
    if call.request == b"slow":
        await asyncio.sleep(5)
    return call.request.upper()


async def test_one_request_per_stream_is_answered_then_closed(tmp_path: Path) -> None:
    servicer = StreamServicer(None)
    async with served(tmp_path, StreamRoute("/t/1", 4, echo), servicer) as connect:
        reader, writer = await connect()
        writer.write(b"abcdefgh")  # a second request on a one-shot route is never read
        assert await asyncio.wait_for(reader.read(), 5.0) == b"ABCD"
        writer.close()
    assert servicer.served["/t/1"] == 1


async def test_a_reused_stream_serves_until_the_asker_closes(tmp_path: Path) -> None:
    servicer = StreamServicer(None)
    async with served(tmp_path, StreamRoute("/t/1", 4, echo, idle_s=5.0), servicer) as connect:
        reader, writer = await connect()
        for word in (b"abcd", b"efgh", b"ijkl"):
            writer.write(word)
            assert await asyncio.wait_for(reader.readexactly(4), 5.0) == word.upper()
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()
    assert servicer.served["/t/1"] == 3 and not servicer.rejected


@pytest.mark.parametrize(("send", "code"), [(b"ab", RejectCode.TRUNCATED), (b"bad!", RejectCode.MALFORMED)])
async def test_a_refused_request_closes_the_stream_and_is_counted(
    tmp_path: Path, send: bytes, code: RejectCode
) -> None:
    servicer = StreamServicer(None)
    async with served(tmp_path, StreamRoute("/t/1", 4, echo), servicer) as connect:
        reader, writer = await connect()
        writer.write(send)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()
    assert servicer.rejected == {code: 1} and not servicer.served


async def test_a_handler_bug_is_logged_and_never_escapes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    servicer = StreamServicer(None)
    with caplog.at_level(logging.ERROR, logger="distronet.node.swarm.servicer"):
        async with served(tmp_path, StreamRoute("/t/1", 4, echo), servicer) as connect:
            reader, writer = await connect()
            writer.write(b"bug!")
            assert await asyncio.wait_for(reader.read(), 5.0) == b""
            writer.close()
    assert servicer.failed == 1
    assert "a bug in the handler" in caplog.text


async def test_deadlines_drop_a_silent_asker_and_a_slow_answer(tmp_path: Path) -> None:
    servicer = StreamServicer(None)
    route = StreamRoute("/t/1", 4, echo, read_s=0.2, deadline_s=0.2)
    async with served(tmp_path, route, servicer) as connect:
        reader, writer = await connect()  # says nothing
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()
        reader, writer = await connect()
        writer.write(b"slow")
        assert await asyncio.wait_for(reader.read(), 5.0) == b""
        writer.close()
    assert not servicer.served and servicer.failed == 0


async def test_a_servicer_without_a_host_registers_nothing() -> None:
    with pytest.raises(ValueError):
        await StreamServicer(None).add(StreamRoute("/t/1", 4, echo))
    await StreamServicer(None).close()


async def test_an_ask_to_a_missing_daemon_is_a_stream_error(tmp_path: Path) -> None:
    peer = PeerID(Identity.from_seed(bytes(32)).peer_id)

    async def read(reader: asyncio.StreamReader) -> bytes:
        return await reader.readexactly(1)

    with pytest.raises(StreamError):
        await ask(str(tmp_path / "no-such-socket"), peer, "/t/1", b"x", read, 1.0)
