"""Serving a pull to a puller that has closed the stream, on uvloop (the node's loop): a
ConnectionResetError that the servicer handles, not uvloop's RuntimeError for a write on a closed
transport (which escaped the handler and was logged as an unhandled exception in p2pd's stream
handler during a bench run)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvloop

from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.pull import ContentStore, Puller, encode_request
from distronet.node.swarm.servicer import StreamCall


def test_serving_a_closed_stream_raises_connection_reset(tmp_path: Path) -> None:
    store = ContentStore()
    digest = store.put(b"x" * 200_000, step=0)
    puller = Puller(None, store, Bandwidth.unlimited(), serve_timeout_s=5.0, protocol="/t")  # type: ignore[arg-type]
    path = str(tmp_path / "s")

    async def main() -> None:
        async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        server = await asyncio.start_unix_server(idle, path)
        try:
            _, writer = await asyncio.open_unix_connection(path)
            writer.close()  # the other side is gone before the answer is written
            await writer.wait_closed()
            with pytest.raises(ConnectionResetError):
                await puller._serve_one(StreamCall(None, encode_request(digest, 1 << 20), writer))
        finally:
            server.close()
            await server.wait_closed()

    uvloop.run(main())
    assert puller.served == 0
