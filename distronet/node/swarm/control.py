"""p2pd control-socket framing (varint-length-delimited protobuf), a leak-free stream open and
leak-free one-shot requests.

hivemind's ``ControlClient.stream_open`` leaves its socket open when the daemon refuses the
stream (peer unreachable, no handler), and its ``connect``, ``disconnect`` and ``list_peers``
leave theirs open when the answer does not come (cancelled by a deadline, p2pd gone); each
surfaces later, in whatever test or task the collector runs in, as an unraisable error from
``StreamWriter.__del__``. :func:`open_stream` and :func:`request` close the socket on every path.
"""

from __future__ import annotations

import asyncio

from google.protobuf.message import DecodeError, Message
from hivemind.p2p import PeerID
from hivemind.proto import p2pd_pb2 as pb

from distronet.node.swarm.errors import DaemonError

__all__ = [
    "MAX_CONTROL_FRAME",
    "MAX_LIST_FRAME",
    "open_stream",
    "peer_id",
    "read_delimited",
    "request",
    "write_delimited",
    "write_stream",
]

MAX_CONTROL_FRAME = 64 * 1024
MAX_LIST_FRAME = 4 * 2**20  # a LIST_PEERS answer: ~100 bytes a connection
_MAX_VARINT_BYTES = 10
_PEER_IDS: dict[bytes, PeerID] = {}
_MAX_PEER_IDS = 4096


def peer_id(raw: bytes) -> PeerID:
    """``PeerID(raw)``, shared per id: hivemind's constructor base58-encodes the id (~0.1 ms in
    Python), and every gossip message and pull names a peer. Cached up to 4096 ids."""
    pid = _PEER_IDS.get(raw)
    if pid is None:
        if len(_PEER_IDS) >= _MAX_PEER_IDS:
            _PEER_IDS.clear()
        pid = _PEER_IDS[raw] = PeerID(raw)
    return pid


def write_stream(writer: asyncio.StreamWriter, data: bytes | memoryview) -> None:
    """``writer.write`` for a stream handler's answer, or ConnectionResetError when the asker has
    closed the stream meanwhile: uvloop raises RuntimeError for a write on a closed transport,
    which escaped the handlers and was logged as an unhandled exception in p2pd's stream handler.
    Every handler here already treats ConnectionError as the asker leaving."""
    if writer.is_closing():
        raise ConnectionResetError("the other side closed the stream")
    writer.write(data)


async def write_delimited(writer: asyncio.StreamWriter, msg: Message) -> None:
    """Write ``msg`` prefixed by its unsigned-varint length."""
    body = msg.SerializeToString()
    n, head = len(body), bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        head.append(byte | (0x80 if n else 0))
        if not n:
            break
    writer.write(bytes(head) + body)
    await writer.drain()


async def read_delimited(reader: asyncio.StreamReader, msg: Message, limit: int = MAX_CONTROL_FRAME) -> None:
    """Read one varint-delimited message into ``msg``; the length is checked before reading.

    Raises: DaemonError on a length over ``limit``, a bad varint or undecodable bytes;
    asyncio.IncompleteReadError when the connection ends.
    """
    size, shift = 0, 0
    for _ in range(_MAX_VARINT_BYTES):
        byte = (await reader.readexactly(1))[0]
        size |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    else:
        raise DaemonError("control frame length varint too long")
    if size > limit:
        raise DaemonError(f"control frame of {size} bytes is over the {limit}-byte limit")
    try:
        msg.ParseFromString(await reader.readexactly(size))
    except DecodeError as e:
        raise DaemonError(f"undecodable control frame: {e}") from e


async def open_stream(
    control_path: str, peer: PeerID, proto: str, timeout: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a libp2p stream to ``peer`` speaking ``proto`` through the daemon at ``control_path``.

    Raises DaemonError (refused: unreachable peer, no handler) or on ``timeout``; the control
    socket is closed on every failure.
    """
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(control_path), timeout)
    try:
        req = pb.Request(
            type=pb.Request.STREAM_OPEN, streamOpen=pb.StreamOpenRequest(peer=peer.to_bytes(), proto=[proto])
        )
        await write_delimited(writer, req)
        resp = pb.Response()
        await asyncio.wait_for(read_delimited(reader, resp), timeout)
        if resp.type == pb.Response.ERROR:
            raise DaemonError(f"p2pd cannot open {proto} to {peer.to_base58()}: {resp.error.msg}")
    except asyncio.TimeoutError:
        writer.close()
        raise DaemonError(f"opening {proto} to {peer.to_base58()} took over {timeout:.1f} s") from None
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def request(
    control_path: str, req: pb.Request, timeout: float, *, limit: int = MAX_CONTROL_FRAME
) -> pb.Response:
    """Send ``req`` on a new control connection and read its response (at most ``limit``
    bytes), all within ``timeout`` seconds; the connection is closed on every path.

    Raises DaemonError: p2pd refused (an ``ERROR`` response, its message), did not answer in
    time, or is unreachable.
    """

    async def exchange() -> pb.Response:
        reader, writer = await asyncio.open_unix_connection(control_path)
        try:
            await write_delimited(writer, req)
            resp = pb.Response()
            await read_delimited(reader, resp, limit)
            return resp
        finally:
            writer.close()

    what = pb.Request.Type.Name(req.type)
    try:
        resp = await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        raise DaemonError(f"p2pd did not answer {what} within {timeout:.1f} s") from None
    except (OSError, asyncio.IncompleteReadError) as e:
        raise DaemonError(f"p2pd control connection failed during {what}: {e!r}") from e
    if resp.type == pb.Response.ERROR:
        raise DaemonError(f"p2pd refused {what}: {resp.error.msg}")
    return resp
