"""Asking a producer for its sealed round manifest directly, over one libp2p stream.

Gossip may lose a leader's manifest; a replica that waited too long asks the better-ranked
producers themselves (``exchange.AsyncSwarmExchange._ask_better``). Wire form, on a stream of
``MANIFEST_PULL_PROTOCOL``::

    request   b"DNM?" | step u64 (big-endian)                 12 bytes
    response  n u32 (big-endian) | n bytes of sealed manifest  n = 0: none sealed for that step

The answer is opened and checked like a gossiped one (``manifest.open_manifest``); here only
its size is bounded (``MAX_MANIFEST_BYTES``) before it is read.

The same protocol answers "which step are you at?" (``request_newest``), which a replica asks
its topic's peers before applying a round that only it produced (``exchange``, "Alone")::

    request   b"DNN?" | 8 zero bytes                          12 bytes
    response  n u32 = 8 | newest step u64                     n = 0: no step yet
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from hivemind.p2p import PeerID

from distronet.node.swarm.control import open_stream, write_stream

__all__ = [
    "MANIFEST_PULL_PROTOCOL",
    "MAX_MANIFEST_BYTES",
    "request_manifest",
    "request_newest",
    "serve_manifest_request",
]

MANIFEST_PULL_PROTOCOL = "/distronet/manifest/1"
MAX_MANIFEST_BYTES = 64 * 1024
_ASK = b"DNM?"
_NEWEST = b"DNN?"
_MAX_STEP = 2**62  # a larger step read off the wire is malformed
_SERVE_TIMEOUT_S = 10.0


async def _request(control_path: str, peer: PeerID, request: bytes, timeout: float) -> bytes | None:
    """The answer's n bytes, or None when n = 0, n > ``MAX_MANIFEST_BYTES``, or ``peer`` is dead,
    unreachable or silent past ``timeout`` seconds."""

    async def ask() -> bytes | None:
        reader, writer = await open_stream(control_path, peer, MANIFEST_PULL_PROTOCOL, timeout)
        try:
            writer.write(request)
            await writer.drain()
            (n,) = struct.unpack(">I", await reader.readexactly(4))
            if n == 0 or n > MAX_MANIFEST_BYTES:
                return None
            return await reader.readexactly(n)
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(ask(), timeout)
    except Exception:  # dead, unreachable or silent: no answer from this one
        return None


async def request_manifest(control_path: str, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """The manifest ``peer`` sealed for ``step``, or None when it has none, is dead, unreachable,
    silent past ``timeout`` seconds or announces more than ``MAX_MANIFEST_BYTES``."""
    return await _request(control_path, peer, _ASK + struct.pack(">Q", step), timeout)


async def request_newest(control_path: str, peer: PeerID, timeout: float) -> int | None:
    """The newest step ``peer``'s exchange has opened, or None when it has none yet, is dead,
    unreachable, silent past ``timeout`` seconds, or answers out of bounds."""
    data = await _request(control_path, peer, _NEWEST + bytes(8), timeout)
    if data is None or len(data) != 8:
        return None
    (step,) = struct.unpack(">Q", data)
    return step if step < _MAX_STEP else None


async def serve_manifest_request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    sealed: Callable[[int], bytes | None],
    newest: Callable[[], int] = lambda: -1,
) -> None:
    """Answer one request: a manifest with ``sealed(step)``, "which step" with ``newest()`` (None,
    a negative step or a malformed request: n = 0); closes the stream. A silent or vanished asker
    is dropped after ``_SERVE_TIMEOUT_S``."""
    try:
        req = await asyncio.wait_for(reader.readexactly(12), _SERVE_TIMEOUT_S)
        data: bytes | None = None
        if req[:4] == _ASK:
            data = sealed(struct.unpack(">Q", req[4:])[0])
        elif req[:4] == _NEWEST and 0 <= (at := newest()) < _MAX_STEP:
            data = struct.pack(">Q", at)
        data = data or b""
        write_stream(writer, struct.pack(">I", len(data)) + data)
        await asyncio.wait_for(writer.drain(), _SERVE_TIMEOUT_S)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
