"""The libp2p transport over REAL p2pd daemons on loopback: mesh, membership, gossip, pulls.

Three nodes (A bootstraps B and C) are started once for the module; a fourth is started and
SIGKILLed in the lapse test. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil
import pytest
import pytest_asyncio
from p2p_trio import eventually

from distronet.node.swarm.budget import EXACT, Bandwidth
from distronet.node.swarm.errors import DaemonError, GossipError, PullError, PullNotFound, PullPruned
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig, SwarmHost
from distronet.node.swarm.pubsub import Gossip
from distronet.node.swarm.pull import (
    PULL_PROTOCOL,
    ContentStore,
    Puller,
    _Stale,
    encode_response_header,
    nobody_holds,
)
from distronet.node.swarm.servicer import StreamCall, StreamRoute, StreamServicer
from distronet.node.swarm.stack import Swarm
from distronet.protocol.errors import ConfigError, RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.pull import PULL_REQUEST_BYTES

pytestmark = pytest.mark.asyncio(loop_scope="module")

RUN = "itest-run"
TTL = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def start_node(
    tmp: Path,
    name: str,
    bootstrap: tuple[str, ...] = (),
    bandwidth: Bandwidth | None = None,
    metrics_addr: str | None = None,
) -> Swarm:
    identity = Identity.generate()
    path = tmp / f"{name}.key"
    identity.save(path)
    config = SwarmConfig(
        identity_path=str(path),
        bootstrap=bootstrap,
        nat_traversal=False,
        gossip_heartbeat_s=0.2,
        idle_timeout_s=5.0,
        metrics_addr=metrics_addr,
    )
    membership = MembershipConfig(run_id=RUN, ttl_s=TTL, renew_every_s=1.0, dht_wait_timeout_s=1.0)
    return await Swarm.start(identity, config, membership, bandwidth=bandwidth)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[Swarm]]:
    tmp = tmp_path_factory.mktemp("swarm")
    metrics = f"127.0.0.1:{free_port()}"
    a = await start_node(
        tmp, "a", bandwidth=Bandwidth.from_rates("40mbit", "unlimited", wire=EXACT), metrics_addr=metrics
    )
    started = [a]
    try:
        boot = tuple(await a.host.maddrs())
        started.append(await start_node(tmp, "b", boot))
        started.append(await start_node(tmp, "c", boot))
        yield started
    finally:
        pids = [n.host.pid for n in started]
        for n in started:
            await n.close()
        for pid in pids:  # closed cleanly: no daemon left behind
            assert pid is not None
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_three_nodes_form_a_mesh_and_see_each_others_membership(nodes: list[Swarm]) -> None:
    ids = {n.identity.peer_id_b58 for n in nodes}
    assert {n.host.peer_id_b58 for n in nodes} == ids  # p2pd runs with our Ed25519 key file

    async def all_see_all() -> bool:
        views = await asyncio.gather(*(n.membership.members() for n in nodes))
        return all(set(v) == ids for v in views)

    await eventually(all_see_all, 10.0, "every node to see all three membership records")
    member = (await nodes[1].membership.members())[nodes[0].identity.peer_id_b58]
    assert any(m.endswith(nodes[0].identity.peer_id_b58) for m in member.maddrs)
    assert member.expires_at > time.time()
    assert set(await nodes[1].host.connected_peers()) >= {nodes[0].host.peer_id}
    links = await nodes[1].host.connections()  # p2pd's LIST_PEERS, read by our own control request
    assert any(p == nodes[0].host.peer_id_b58 and a.startswith("/ip4/127.0.0.1/") for p, a in links)
    assert await nodes[1].host.relayed_peers() == set()  # loopback links, none through a relay


async def test_announcement_from_one_node_reaches_the_others(nodes: list[Swarm]) -> None:
    a, b, c = nodes
    subs = [await n.gossip.subscribe(a.topic) for n in nodes]
    try:
        others = {b.host.peer_id, c.host.peer_id}

        async def a_sees_subscribers() -> bool:
            return set(await a.gossip.topic_peers(a.topic)) >= others

        await eventually(a_sees_subscribers, 10.0, "gossip subscriptions to propagate")
        assert a.topic in await a.gossip.topics()
        # gossipsub is best-effort: a message published while the mesh is still forming may be
        # lost (the exchange recovers by pulling manifests directly). So publish a fresh note
        # every second until each subscriber got one, and check that what arrived is ours.
        sent: list[bytes] = []
        pending = {1, 2}
        deadline = time.monotonic() + 20.0
        while pending:
            assert time.monotonic() < deadline, f"subscribers {sorted(pending)} never got a note"
            sent.append(b"announce:" + os.urandom(512))
            await a.gossip.publish(a.topic, sent[-1])
            for i in sorted(pending):
                with contextlib.suppress(asyncio.TimeoutError):
                    msg = await subs[i].get(timeout=1.0)
                    assert msg.data in sent
                    assert (msg.sender, msg.topic) == (a.host.peer_id, a.topic)
                    pending.discard(i)
        with pytest.raises(GossipError, match="over the 1024-byte cap"):
            await a.gossip.publish(a.topic, b"x" * 1025)
        with pytest.raises(asyncio.TimeoutError):  # own messages are not echoed back by default
            await subs[0].get(timeout=0.3)
    finally:
        for sub in subs:
            await sub.close()


async def test_publishes_share_one_control_connection_and_survive_its_loss(nodes: list[Swarm]) -> None:
    a, b, _ = nodes
    sub = await b.gossip.subscribe(a.topic)
    try:

        async def a_sees_b() -> bool:
            return b.host.peer_id in await a.gossip.topic_peers(a.topic)

        await eventually(a_sees_b, 10.0, "B's subscription to reach A")
        kept = a.gossip._kept
        await a.gossip.publish(a.topic, b"one")
        await a.gossip.publish(a.topic, b"two")
        assert kept is not None and a.gossip._kept is kept  # one connection for every call
        kept[1].close()  # the daemon side of it is gone: the next call goes out on a new one
        await asyncio.sleep(0)
        await a.gossip.publish(a.topic, b"three")
        assert a.gossip._kept is not None and a.gossip._kept is not kept
        got: set[bytes] = set()
        deadline = time.monotonic() + 10.0
        while got != {b"one", b"two", b"three"}:
            got.add((await sub.get(timeout=max(0.1, deadline - time.monotonic()))).data)
    finally:
        await sub.close()


async def test_payload_pulled_from_producer_then_from_a_peer_within_budget(nodes: list[Swarm]) -> None:
    a, b, c = nodes
    payload = os.urandom(1_500_000)
    digest = a.puller.store.put(payload, step=7)
    up_before, served_before = a.bandwidth.up.total_bytes, a.puller.served
    start = time.monotonic()
    got = await b.puller.pull(
        digest, [a.host.peer_id], max_bytes=2**21, timeout=20.0, size=len(payload), step=7
    )
    elapsed = time.monotonic() - start
    assert got == payload
    # A's upload budget is 40 mbit = 5 MB/s with a 0.5 MB burst: 1.5 MB cannot leave in under ~0.2 s
    assert elapsed >= (len(payload) - a.bandwidth.up.burst) / a.bandwidth.up.rate * 0.95
    assert a.bandwidth.up.total_bytes - up_before == len(payload) + 9
    assert a.puller.served == served_before + 1

    # C pulls from B (which now has it); A, listed as a fallback, is never asked
    got_c = await c.puller.pull(digest, [b.host.peer_id, a.host.peer_id], max_bytes=2**21, timeout=20.0)
    assert got_c == payload
    assert a.puller.served == served_before + 1
    assert b.puller.served == 1


async def test_pulls_reuse_one_stream_and_survive_its_close(nodes: list[Swarm]) -> None:
    """Several pulls from one peer go over one stream; when the server side closes it while idle,
    the next pull notices before any answer byte and succeeds on a new stream."""
    a, b, _ = nodes
    blobs = [os.urandom(30_000) for _ in range(4)]
    digests = [a.puller.store.put(x, step=9) for x in blobs]
    opened = b.puller.streams_opened
    for digest, blob in zip(digests[:3], blobs[:3], strict=True):
        assert await b.puller.fetch(a.host.peer_id, digest, max_bytes=2**20, timeout=10.0) == blob
    assert b.puller.streams_opened <= opened + 1  # B may still hold an idle stream to A from above
    opened = b.puller.streams_opened
    [(_, _, writer)] = b.puller._idle[a.host.peer_id.to_bytes()]
    writer.close()  # as if the other side had gone: the idle stream is dead
    a.puller.idle_timeout_s = 0.2  # from the next answer on, A closes a stream idle this long
    try:
        assert await b.puller.fetch(a.host.peer_id, digests[3], max_bytes=2**20, timeout=10.0) == blobs[3]
        assert b.puller.streams_opened == opened + 1
        # a pull on the stream A closed meanwhile is "stale": fetch retries it on a new stream
        [(_, reader, writer)] = b.puller._idle[a.host.peer_id.to_bytes()]
        deadline = time.monotonic() + 10.0
        while not reader.at_eof():
            assert time.monotonic() < deadline, "A never closed the idle stream"
            await asyncio.sleep(0.05)
        with pytest.raises(_Stale):
            await b.puller._ask(a.host.peer_id, "a", (reader, writer), digests[0], 2**20, None, reused=True)
    finally:
        a.puller.idle_timeout_s = 60.0


async def test_missing_and_oversize_payloads_get_typed_errors(nodes: list[Swarm]) -> None:
    a, b, _ = nodes
    payload = os.urandom(300_000)
    digest = a.puller.store.put(payload, step=8)
    with pytest.raises(Rejected) as info:
        await b.puller.fetch(a.host.peer_id, digest, max_bytes=100_000, timeout=10.0)
    assert info.value.code == RejectCode.TOO_LARGE
    with pytest.raises(Rejected) as info:
        await b.puller.fetch(a.host.peer_id, digest, max_bytes=2**20, timeout=10.0, size=len(payload) - 1)
    assert info.value.code == RejectCode.MALFORMED
    with pytest.raises(PullError) as missing:
        await b.puller.pull(
            hashlib.sha256(b"nobody has this").digest(), [a.host.peer_id], max_bytes=1024, timeout=5
        )
    assert a.host.peer_id_b58 in missing.value.causes
    assert digest not in b.puller.store


async def test_a_pull_that_ends_after_its_puller_closed_keeps_no_stream(nodes: list[Swarm]) -> None:
    """A stream-reusing puller hands a clean stream back to its idle pool; once the puller is
    closed (a pull still in flight, or started after), the stream is closed instead: a pooled
    one would outlive the puller, an unclosed socket for the collector."""
    a, b, _ = nodes
    late = Puller(
        b.host,
        ContentStore(),
        Bandwidth.unlimited(),
        serve_timeout_s=0,
        protocol=PULL_PROTOCOL,
        reuse_streams=True,
    )
    blob = os.urandom(10_000)
    digest = a.puller.store.put(blob, step=9)
    await late.close()
    assert await late.fetch(a.host.peer_id, digest, max_bytes=2**20, timeout=10.0) == blob
    assert late.streams_opened == 1 and late._idle == {}


async def test_a_gossip_client_closed_while_it_connects_keeps_no_connection(nodes: list[Swarm]) -> None:
    """``Gossip.close`` landing while a call opens its control connection: the new connection is
    closed and the call raises GossipError (it used to become the kept connection of a closed
    client, left to the collector); calls and subscriptions after close open nothing."""
    a = nodes[0]
    gossip = Gossip(a.host)
    await gossip.topics()
    assert gossip._kept is not None  # the kept connection, working
    gossip._drop_kept()  # the next call opens a new one
    connect, opened = gossip._connect, []

    async def connect_while_closing() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        conn = await connect()
        opened.append(conn)
        await gossip.close()
        return conn

    gossip._connect = connect_while_closing  # type: ignore[method-assign]
    with pytest.raises(GossipError, match="closed"):
        await gossip.topic_peers(a.topic)
    assert len(opened) == 1 and opened[0][1].is_closing() and gossip._kept is None
    for call in (gossip.topics(), gossip.publish(a.topic, b"late"), gossip.subscribe(a.topic)):
        with pytest.raises(GossipError, match="closed"):
            await call
    assert len(opened) == 1


async def test_a_pruned_payload_is_told_apart_from_one_never_held(nodes: list[Swarm]) -> None:
    """A frame past the server's retention gets PRUNED, one it never had NOT_FOUND: only the
    second may count towards "nobody holds this frame" (``pull.nobody_holds``)."""
    a, b, _ = nodes
    old = a.puller.store.put(os.urandom(5_000), step=3)
    assert a.puller.store.evict_before(4) >= 1 and a.puller.store.pruned(old)
    with pytest.raises(PullPruned, match="pruned"):
        await b.puller.fetch(a.host.peer_id, old, max_bytes=2**20, timeout=10.0)
    never = hashlib.sha256(b"never stored anywhere").digest()
    with pytest.raises(PullNotFound):
        await b.puller.fetch(a.host.peer_id, never, max_bytes=2**20, timeout=10.0)
    with pytest.raises(PullError) as err:
        await b.puller.pull(old, [a.host.peer_id], max_bytes=2**20, timeout=10.0)
    assert isinstance(err.value.causes[a.host.peer_id_b58], PullPruned)
    assert not nobody_holds(err.value, [])


EVIL = "/distronet/pull-evil/1"


async def test_lying_server_gets_typed_rejections(nodes: list[Swarm]) -> None:
    _, b, c = nodes
    good = os.urandom(50_000)
    digest = hashlib.sha256(good).digest()
    behaviour: dict[str, bytes] = {}

    async def evil(call: StreamCall) -> bytes:  # served through the seam like any route
        mode = behaviour["mode"]
        if mode == b"huge":  # declares 1 TiB and then sends nothing
            return encode_response_header(0, 1 << 40)
        if mode == b"corrupt":
            return encode_response_header(0, len(good)) + good[:-1] + bytes([good[-1] ^ 1])
        return encode_response_header(0, len(good)) + good[:10]  # truncated: then the stream ends

    liar = StreamServicer(c.host)
    await liar.add(StreamRoute(EVIL, PULL_REQUEST_BYTES, evil))
    victim = await Puller.create(b.host, protocol=EVIL)
    try:
        for mode, code in (
            (b"huge", RejectCode.TOO_LARGE),
            (b"corrupt", RejectCode.MALFORMED),
            (b"truncated", RejectCode.TRUNCATED),
        ):
            behaviour["mode"] = mode
            start = time.monotonic()
            with pytest.raises(Rejected) as info:
                await victim.fetch(c.host.peer_id, digest, max_bytes=2**20, timeout=10.0)
            assert info.value.code == code, mode
            assert info.value.peer_id == c.host.peer_id_b58
            assert time.monotonic() - start < 5.0
            assert digest not in victim.store
    finally:
        await victim.close()
        await liar.close()


@pytest.mark.slow
async def test_killed_node_membership_lapses_and_the_rest_keep_gossiping(
    nodes: list[Swarm], tmp_path: Path
) -> None:
    a, b, c = nodes
    d = await start_node(tmp_path, "d", tuple(await a.host.maddrs()))
    d_id = d.identity.peer_id_b58
    try:

        async def b_sees_d() -> bool:
            return d_id in await b.membership.members()

        await eventually(b_sees_d, 10.0, "the newcomer's record")
        pid = d.host.pid
        assert pid is not None
        d.host.kill()  # SIGKILL its p2pd and stop renewing, as a crash would
        assert d.membership._renew_task is not None
        d.membership._renew_task.cancel()
        killed_at = time.monotonic()

        async def d_gone() -> bool:
            views = await asyncio.gather(
                a.membership.members(), b.membership.members(), c.membership.members()
            )
            return all(d_id not in v and len(v) == 3 for v in views)

        await eventually(d_gone, TTL + 8.0, "the killed node's record to lapse")
        assert time.monotonic() - killed_at >= TTL - 1.5  # it lapsed by expiry, not earlier
        sub = await c.gossip.subscribe(c.topic)
        try:

            async def b_sees_c() -> bool:
                return c.host.peer_id in await b.gossip.topic_peers(c.topic)

            await eventually(b_sees_c, 10.0, "C's subscription")
            await b.gossip.publish(b.topic, b"still here")
            assert (await sub.get(timeout=10.0)).data == b"still here"
        finally:
            await sub.close()
    finally:
        await d.close(leave=False)
        assert (
            pid is None or not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        )


async def test_graceful_leave_is_seen_before_the_ttl(nodes: list[Swarm], tmp_path: Path) -> None:
    a, b, _ = nodes
    e = await start_node(tmp_path, "e", tuple(await a.host.maddrs()))
    e_id = e.identity.peer_id_b58

    async def b_sees_e() -> bool:
        return e_id in await b.membership.members()

    await eventually(b_sees_e, 10.0, "the newcomer's record")
    await e.close()
    left_at = time.monotonic()

    async def e_gone() -> bool:
        return e_id not in await b.membership.members()

    await eventually(e_gone, TTL, "the tombstone")
    assert time.monotonic() - left_at < TTL


async def test_p2pd_serves_its_own_prometheus_metrics(nodes: list[Swarm]) -> None:
    addr = nodes[0].host.config.metrics_addr
    assert addr is not None
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://{addr}/metrics") as resp,
    ):
        assert resp.status == 200
        text = await resp.text()
    assert "libp2p" in text


async def test_daemon_exits_by_itself_when_its_client_is_gone() -> None:
    """What protects against orphans when a node process is SIGKILLed: p2pd's -idleTimeout."""
    host = await SwarmHost.start(SwarmConfig(nat_traversal=False, idle_timeout_s=1.0))
    pid = host.pid
    assert pid is not None
    try:
        host.p2p._client.close()  # the control connection drops, as when our process dies

        async def exited() -> bool:
            return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

        await eventually(exited, 10.0, "p2pd to exit on its own")
    finally:
        await host.close()


async def test_unreachable_bootstrap_is_a_typed_error_and_leaves_no_daemon(tmp_path: Path) -> None:
    dead = Identity.generate().peer_id_b58
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(DaemonError, match="bootstrap peer"):  # p2pd itself refuses to start
        await start_node(tmp_path, "lonely", (f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{dead}",))
    left = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    assert left <= before


async def test_missing_identity_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        await SwarmHost.start(SwarmConfig(identity_path=str(tmp_path / "nope.key"), nat_traversal=False))


async def test_p2pd_child_gets_gogc_and_we_keep_our_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SwarmConfig.gogc`` (the node's ``net.p2pd_gogc``) is in p2pd's environment, not ours."""
    monkeypatch.delenv("GOGC", raising=False)
    host = await SwarmHost.start(SwarmConfig(nat_traversal=False, gogc=400))
    try:
        assert host.pid is not None
        assert psutil.Process(host.pid).environ().get("GOGC") == "400"
        assert "GOGC" not in os.environ
    finally:
        await host.close()
