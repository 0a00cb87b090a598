"""Issue 17: a few request bytes must not buy a peer the server's whole upload budget.

A hostile puller asks for the same 1 MB frame again and again on one stream; the server's pull
route serves it until that peer has had its share of the upload budget (``StreamLimits``
``serve_upload_share_pct`` of rate x window), then refuses it (LIMIT_EXCEEDED, stream closed),
while an honest peer asking after it is still served. On the old code the hostile peer got
every answer it asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.control import peer_id
from distronet.node.swarm.pull import ContentStore, Puller, encode_request
from distronet.node.swarm.servicer import PeerQuota
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.limits import StreamLimits
from distronet.protocol.pull import PULL_HEADER_BYTES, PullStatus, decode_pull_header

SIZE = 1_000_000


async def pulls_answered(path: str, digest: bytes, asks: int) -> int:
    """Ask ``asks`` times on one stream; how many full answers came back before it closed."""
    reader, writer = await asyncio.open_unix_connection(path)
    got = 0
    try:
        for _ in range(asks):
            writer.write(encode_request(digest, 1 << 21))
            await writer.drain()
            head = await reader.readexactly(PULL_HEADER_BYTES)
            assert decode_pull_header(head, max_bytes=1 << 21).status is PullStatus.OK
            await reader.readexactly(SIZE)
            got += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()
    return got


@pytest.mark.asyncio
async def test_hostile_puller_is_cut_off_at_its_share_while_another_is_served(tmp_path: Path) -> None:
    store = ContentStore()
    digest = store.put(b"x" * SIZE, step=0)
    puller = Puller(
        None, store, Bandwidth.unlimited(), serve_timeout_s=5.0, protocol="/t", idle_timeout_s=5.0
    )  # type: ignore[arg-type]
    # an upload budget of 1 MB/s: 10 MB a 10 s window, half of it (5 MB) for any one peer
    puller.servicer.quota = PeerQuota(StreamLimits(), upload_rate=1_000_000, upload_burst=0)
    hostile, honest = peer_id(Identity.generate().peer_id), peer_id(Identity.generate().peer_id)
    who = {str(tmp_path / "h"): hostile, str(tmp_path / "o"): honest}
    servers = []
    for path, peer in who.items():

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, peer: object = peer) -> None:
            await puller.servicer.handle(puller.route(), peer, r, w)  # type: ignore[arg-type]

        servers.append(await asyncio.start_unix_server(serve, path))
    try:
        h_path, o_path = who
        assert await pulls_answered(h_path, digest, 30) == 4  # 4 x 1 MB (+ headers) fit in 5 MB
        assert await pulls_answered(h_path, digest, 3) == 0  # still over its share: refused at once
        assert await pulls_answered(o_path, digest, 2) == 2  # another peer is still served
    finally:
        for server in servers:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
    assert puller.servicer.rejected[RejectCode.LIMIT_EXCEEDED] == 2
    assert puller.served == 6


def test_requests_and_streams_per_peer_are_capped() -> None:
    now = [0.0]
    limits = StreamLimits(serve_window_s=10, serve_requests_per_window=3, serve_concurrent_per_peer=2)
    quota = PeerQuota(limits, clock=lambda: now[0])
    for _ in range(3):
        quota.request(b"a")
    with pytest.raises(Rejected) as info:
        quota.request(b"a")
    assert info.value.code == RejectCode.LIMIT_EXCEEDED
    quota.request(b"b")  # another peer has its own window
    now[0] = 10.0
    quota.request(b"a")  # a new window
    with quota.stream(b"a"), quota.stream(b"a"):
        with pytest.raises(Rejected), quota.stream(b"a"):
            pass
        with quota.stream(b"b"):
            pass
    with quota.stream(b"a"):  # released on exit
        pass
    unlimited = PeerQuota(limits)
    unlimited.spend(b"a", 1 << 40)  # no upload rate given: bytes are not capped
    with pytest.raises(ValueError):
        StreamLimits(serve_upload_share_pct=101)


def test_peers_tracked_per_window_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from distronet.node.swarm import servicer

    monkeypatch.setattr(servicer, "_MAX_TRACKED", 3)
    now = [0.0]
    quota = PeerQuota(StreamLimits(serve_window_s=10), clock=lambda: now[0])
    for p in (b"a", b"b", b"c"):
        quota.request(p)
    with pytest.raises(Rejected):
        quota.request(b"d")  # a fourth peer in the same window
    quota.request(b"a")  # known peers are still served
    now[0] = 10.0
    quota.request(b"d")  # the old windows ended: forgotten
