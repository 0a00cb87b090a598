"""Asking a producer for its sealed round manifest directly, over one libp2p stream.

Gossip may lose a leader's manifest; a replica that waited too long asks the better-ranked
producers themselves (``exchange.AsyncSwarmExchange._ask_better``). The same protocol answers
"which step are you at?" (``request_newest``), which a replica asks its topic's peers before
applying a round that only it produced (``exchange``, "Alone"), and "which accepted set did you
apply for this step?" (``request_decided``), which a replica a few rounds behind asks to replay
those rounds instead of downloading a whole state (``node/catchup/replay.py``).

Wire: ``distronet.protocol.manifest_ask`` (docs/protocol.md §14.3): a 12-byte request (tag,
step), a ``u32 n`` answer of at most ``max_manifest_answer_bytes``. An answered manifest is
opened and checked like a gossiped one (``protocol.manifest.open_manifest``) by the caller.
Served through the swarm's servicer (:func:`manifest_route`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection

from distronet.node.swarm.errors import StreamError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.servicer import StreamCall, StreamRoute, ask
from distronet.protocol.errors import Rejected
from distronet.protocol.limits import DEFAULT_STREAM_LIMITS
from distronet.protocol.manifest_ask import (
    ASK_ANSWER_HEADER_BYTES,
    ASK_REQUEST_BYTES,
    GONE,
    MANIFEST_ASK_PROTOCOL,
    AskKind,
    decode_answer_length,
    decode_ask,
    decode_newest,
    encode_answer,
    encode_ask,
    encode_newest,
)

__all__ = [
    "GONE",
    "MANIFEST_PULL_PROTOCOL",
    "MAX_MANIFEST_BYTES",
    "PROBE_PEERS",
    "AskStep",
    "answer_manifest_ask",
    "ask_newest",
    "manifest_route",
    "request_decided",
    "request_manifest",
    "request_newest",
    "steps_of",
]

MANIFEST_PULL_PROTOCOL = MANIFEST_ASK_PROTOCOL
MAX_MANIFEST_BYTES = DEFAULT_STREAM_LIMITS.max_manifest_answer_bytes
_SERVE_TIMEOUT_S = 10.0
PROBE_PEERS = 4  # peers asked at once which step they are at (swarm.alone, node/catchup/replay.py)


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    n = decode_answer_length(await reader.readexactly(ASK_ANSWER_HEADER_BYTES))
    return await reader.readexactly(n) if n else b""


async def _request(control_path: str, peer: PeerID, request: bytes, timeout: float) -> bytes | None:
    """The answer's n bytes (empty when n = 0), or None when n > ``MAX_MANIFEST_BYTES`` or
    ``peer`` is dead, unreachable or silent past ``timeout`` seconds."""
    try:
        return await ask(control_path, peer, MANIFEST_ASK_PROTOCOL, request, _read_answer, timeout)
    except (StreamError, Rejected):  # dead, unreachable, silent or lying: no answer from this one
        return None


async def request_manifest(control_path: str, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """The manifest ``peer`` sealed for ``step``, or None when it has none, is dead, unreachable,
    silent past ``timeout`` seconds or announces more than ``MAX_MANIFEST_BYTES``."""
    return await _request(control_path, peer, encode_ask(AskKind.SEALED, step), timeout) or None


async def request_decided(control_path: str, peer: PeerID, step: int, timeout: float) -> bytes | None:
    """The manifest ``peer`` adopted for ``step`` (its gossip bytes, unchecked), ``b""`` when it
    has not decided that step (yet), ``GONE`` when the step is older than its window, or None
    when it is dead, unreachable, silent past ``timeout`` seconds or answers too much."""
    return await _request(control_path, peer, encode_ask(AskKind.DECIDED, step), timeout)


async def request_newest(control_path: str, peer: PeerID, timeout: float) -> int | None:
    """The newest step ``peer``'s exchange has opened, or None when it has none yet, is dead,
    unreachable, silent past ``timeout`` seconds, or answers out of bounds."""
    step = await ask_newest(control_path, peer, timeout)
    return None if step is None or step < 0 else step


async def ask_newest(control_path: str, peer: PeerID, timeout: float) -> int | None:
    """Like :func:`request_newest`, but -1 when ``peer`` answered that it has no step yet (None
    only when it did not answer, or answered malformed)."""
    data = await _request(control_path, peer, encode_ask(AskKind.NEWEST), timeout)
    if data is None:
        return None
    try:
        return decode_newest(data)
    except Rejected:
        return None


AskStep = Callable[[bytes], Awaitable[int | None]]


async def steps_of(peers: Collection[bytes], ask: AskStep) -> dict[bytes, int]:
    """Ask up to ``PROBE_PEERS`` of ``peers`` (in id order) at once which step they are at
    (``ask`` is :func:`request_newest` or :func:`ask_newest` bound to a control path); the answers of
    those that answered."""
    asked = sorted(peers)[:PROBE_PEERS]
    answers = await asyncio.gather(*(ask(p) for p in asked))
    return {p: s for p, s in zip(asked, answers, strict=True) if s is not None}


def answer_manifest_ask(
    request: bytes,
    sealed: Callable[[int], bytes | None],
    newest: Callable[[], int] = lambda: -1,
    decided: Callable[[int], bytes | None] = lambda _: None,
) -> bytes:
    """The answer to one request: a manifest with ``sealed(step)``, "which step" with
    ``newest()``, an adopted manifest (or ``GONE``) with ``decided(step)``; n = 0 for None, a
    negative step, or a request this node does not understand (the asker then hears "none")."""
    try:
        req = decode_ask(request)
    except Rejected:
        return encode_answer(b"")
    data: bytes | None
    if req.kind is AskKind.SEALED:
        data = sealed(req.step)
    elif req.kind is AskKind.NEWEST:
        data = encode_newest(newest())
    else:
        data = decided(req.step)
    return encode_answer(data or b"")


def manifest_route(
    sealed: Callable[[int], bytes | None],
    newest: Callable[[], int] = lambda: -1,
    decided: Callable[[int], bytes | None] = lambda _: None,
) -> StreamRoute:
    """The servicer route of ``MANIFEST_PULL_PROTOCOL``: one request a stream, answered with
    :func:`answer_manifest_ask`; a silent or vanished asker is dropped after ``_SERVE_TIMEOUT_S``."""

    async def handle(call: StreamCall) -> bytes:
        return answer_manifest_ask(call.request, sealed, newest, decided)

    return StreamRoute(
        MANIFEST_ASK_PROTOCOL, ASK_REQUEST_BYTES, handle, read_s=_SERVE_TIMEOUT_S, deadline_s=_SERVE_TIMEOUT_S
    )
