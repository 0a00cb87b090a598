"""The manifest-ask protocol's server side over a real Unix socket: manifests, "which step" and
"which accepted set did you apply", served through the swarm's servicer seam."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from distronet.node.exchange.manifest_ask import GONE, manifest_route
from distronet.node.swarm.servicer import StreamServicer


async def ask(
    tmp_path: Path,
    request: bytes,
    sealed: Callable[[int], bytes | None],
    newest: int,
    decided: Callable[[int], bytes | None] = lambda _: None,
) -> bytes:
    path = str(tmp_path / "s")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        route = manifest_route(sealed, lambda: newest, decided)
        await StreamServicer(None).handle(route, None, reader, writer)

    server = await asyncio.start_unix_server(handle, path)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5.0)  # the server closes after one answer
        writer.close()
        return answer
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.asyncio
async def test_a_manifest_request_gets_the_sealed_bytes_or_none(tmp_path: Path) -> None:
    held = {7: b"sealed-7"}
    assert (
        await ask(tmp_path, b"DNM?" + struct.pack(">Q", 7), held.get, 9) == struct.pack(">I", 8) + b"sealed-7"
    )
    assert await ask(tmp_path, b"DNM?" + struct.pack(">Q", 8), held.get, 9) == bytes(4)


@pytest.mark.asyncio
async def test_a_which_step_request_gets_the_newest_step(tmp_path: Path) -> None:
    assert await ask(tmp_path, b"DNN?" + bytes(8), {}.get, 41) == struct.pack(">IQ", 8, 41)
    assert await ask(tmp_path, b"DNN?" + bytes(8), {}.get, -1) == bytes(4)  # no step yet: n = 0


@pytest.mark.asyncio
async def test_a_malformed_request_gets_nothing(tmp_path: Path) -> None:
    assert await ask(tmp_path, b"XXXX" + bytes(8), {0: b"x"}.get, 3) == bytes(4)


@pytest.mark.asyncio
async def test_a_decided_request_gets_the_adopted_manifest_pending_or_gone(tmp_path: Path) -> None:
    def decided(step: int) -> bytes | None:
        return {3: GONE, 5: b"adopted-5"}.get(step)

    def req(step: int) -> bytes:
        return b"DNR?" + struct.pack(">Q", step)

    sealed = {5: b"sealed-5"}.get  # what it sealed is another question
    assert await ask(tmp_path, req(5), sealed, 9, decided) == struct.pack(">I", 9) + b"adopted-5"
    assert await ask(tmp_path, req(6), sealed, 9, decided) == bytes(4)  # not decided there (yet)
    assert await ask(tmp_path, req(3), sealed, 9, decided) == struct.pack(">I", 1) + GONE
