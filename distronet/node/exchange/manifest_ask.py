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

and "which accepted set did you apply for this step?" (``request_decided``), which a replica
that is a few rounds behind asks to replay those rounds instead of downloading a whole state
(``node/catchup/replay.py``)::

    request   b"DNR?" | step u64                              12 bytes
    response  n u32 | n bytes: the manifest it adopted        n = 0: not decided there (yet);
                                                              n = 1, b"G": older than its window
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Collection

from distronet.node.swarm.control import open_stream, write_stream
from distronet.node.swarm.hivemind_shim import PeerID

__all__ = [
    "GONE",
    "MANIFEST_PULL_PROTOCOL",
    "MAX_MANIFEST_BYTES",
    "PROBE_PEERS",
    "AskStep",
    "ask_newest",
    "request_decided",
    "request_manifest",
    "request_newest",
    "serve_manifest_request",
    "steps_of",
]

MANIFEST_PULL_PROTOCOL = "/distronet/manifest/1"
MAX_MANIFEST_BYTES = 64 * 1024
_ASK = b"DNM?"
_NEWEST = b"DNN?"
_DECIDED = b"DNR?"
GONE = b"G"  # a decided-round answer: that step is older than the peer's window
_MAX_STEP = 2**62  # a larger step read off the wire is malformed
_SERVE_TIMEOUT_S = 10.0
PROBE_PEERS = 4  # peers asked at once which step they are at (swarm.alone, node/catchup/replay.py)


async def _request(control_path: str, peer: PeerID, request: bytes, timeout: float) -> bytes | None:
    """The answer's n bytes (empty when n = 0), or None when n > ``MAX_MANIFEST_BYTES`` or
    ``peer`` is dead, unreachable or silent past ``timeout`` seconds."""

    async def ask() -> bytes | None:
        reader, writer = await open_stream(control_path, peer, MANIFEST_PULL_PROTOCOL, timeout)
        try:
            writer.write(request)
            await writer.drain()
            (n,) = struct.unpack(">I", await reader.readexactly(4))
            if n > MAX_MANIFEST_BYTES:
                return None
            return await reader.readexactly(n) if n else b""
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(ask(), timeout)
    except Exception:  # dead, unreachable or silent: no answer from this one
        return None


async def request_manifest(control_path: str, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """The manifest ``peer`` sealed for ``step``, or None when it has none, is dead, unreachable,
    silent past ``timeout`` seconds or announces more than ``MAX_MANIFEST_BYTES``."""
    return await _request(control_path, peer, _ASK + struct.pack(">Q", step), timeout) or None


async def request_decided(control_path: str, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """The manifest ``peer`` adopted for ``step`` (its gossip bytes, unchecked), ``b""`` when it
    has not decided that step (yet), ``GONE`` when the step is older than its window, or None
    when it is dead, unreachable, silent past ``timeout`` seconds or answers too much."""
    return await _request(control_path, peer, _DECIDED + struct.pack(">Q", step), timeout)


async def request_newest(control_path: str, peer: PeerID, timeout: float) -> int | None:
    """The newest step ``peer``'s exchange has opened, or None when it has none yet, is dead,
    unreachable, silent past ``timeout`` seconds, or answers out of bounds."""
    step = await ask_newest(control_path, peer, timeout)
    return None if step is None or step < 0 else step


async def ask_newest(control_path: str, peer: PeerID, timeout: float) -> int | None:
    """Like :func:`request_newest`, but -1 when ``peer`` answered that it has no step yet (None
    only when it did not answer)."""
    data = await _request(control_path, peer, _NEWEST + bytes(8), timeout)
    if data is None or len(data) not in (0, 8):
        return None
    step = struct.unpack(">Q", data)[0] if data else -1
    return step if step < _MAX_STEP else None


AskStep = Callable[[bytes], Awaitable[int | None]]


async def steps_of(peers: Collection[bytes], ask: AskStep) -> dict[bytes, int]:
    """Ask up to ``PROBE_PEERS`` of ``peers`` (in id order) at once which step they are at
    (``ask`` is :func:`request_newest` or :func:`ask_newest` bound to a control path); the
    answers of those that answered."""
    asked = sorted(peers)[:PROBE_PEERS]
    answers = await asyncio.gather(*(ask(p) for p in asked))
    return {p: s for p, s in zip(asked, answers, strict=True) if s is not None}


async def serve_manifest_request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    sealed: Callable[[int], bytes | None],
    newest: Callable[[], int] = lambda: -1,
    decided: Callable[[int], bytes | None] = lambda _: None,
) -> None:
    """Answer one request: a manifest with ``sealed(step)``, "which step" with ``newest()``, an
    adopted manifest (or ``GONE``) with ``decided(step)`` (None, a negative step or a malformed
    request: n = 0); closes the stream. A silent or vanished asker is dropped after
    ``_SERVE_TIMEOUT_S``."""
    try:
        req = await asyncio.wait_for(reader.readexactly(12), _SERVE_TIMEOUT_S)
        data: bytes | None = None
        if req[:4] == _ASK:
            data = sealed(struct.unpack(">Q", req[4:])[0])
        elif req[:4] == _NEWEST and 0 <= (at := newest()) < _MAX_STEP:
            data = struct.pack(">Q", at)
        elif req[:4] == _DECIDED:
            data = decided(struct.unpack(">Q", req[4:])[0])
        data = data or b""
        write_stream(writer, struct.pack(">I", len(data)) + data)
        await asyncio.wait_for(writer.drain(), _SERVE_TIMEOUT_S)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
