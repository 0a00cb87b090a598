"""Asking a producer for its sealed round manifest directly, over one libp2p stream.

Gossip may lose a leader's manifest; a replica that waited too long asks the better-ranked
producers themselves (``exchange.AsyncSwarmExchange._ask_better``). Wire form, on a stream of
``MANIFEST_PULL_PROTOCOL``::

    request   b"DNM?" | step u64 (big-endian)                 12 bytes
    response  n u32 (big-endian) | n bytes of sealed manifest  n = 0: none sealed for that step

The answer is opened and checked like a gossiped one (``manifest.open_manifest``); here only
its size is bounded (``MAX_MANIFEST_BYTES``) before it is read.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from hivemind.p2p import PeerID

from distronet.node.swarm.control import open_stream

__all__ = ["MANIFEST_PULL_PROTOCOL", "MAX_MANIFEST_BYTES", "request_manifest", "serve_manifest_request"]

MANIFEST_PULL_PROTOCOL = "/distronet/manifest/1"
MAX_MANIFEST_BYTES = 64 * 1024
_ASK = b"DNM?"
_SERVE_TIMEOUT_S = 10.0


async def request_manifest(control_path: str, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """The manifest ``peer`` sealed for ``step``, or None when it has none, is dead, unreachable,
    silent past ``timeout`` seconds or announces more than ``MAX_MANIFEST_BYTES``."""

    async def ask() -> bytes | None:
        reader, writer = await open_stream(control_path, peer, MANIFEST_PULL_PROTOCOL, timeout)
        try:
            writer.write(_ASK + struct.pack(">Q", step))
            await writer.drain()
            (n,) = struct.unpack(">I", await reader.readexactly(4))
            if n == 0 or n > MAX_MANIFEST_BYTES:
                return None
            return await reader.readexactly(n)
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(ask(), timeout)
    except Exception:  # dead, unreachable or silent: no manifest from this one
        return None


async def serve_manifest_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sealed: Callable[[int], bytes | None]
) -> None:
    """Answer one request with ``sealed(step)`` (None or a malformed request: n = 0); closes the
    stream. A silent or vanished asker is dropped after ``_SERVE_TIMEOUT_S``."""
    try:
        req = await asyncio.wait_for(reader.readexactly(12), _SERVE_TIMEOUT_S)
        data = (sealed(struct.unpack(">Q", req[4:])[0]) if req[:4] == _ASK else None) or b""
        writer.write(struct.pack(">I", len(data)) + data)
        await asyncio.wait_for(writer.drain(), _SERVE_TIMEOUT_S)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
