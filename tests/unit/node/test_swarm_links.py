"""``swarm.links``: whom to re-dial when a member is missing from the gossip topics
(``LinkWatch``), and what one ``repair_links`` check dials (against a fake swarm)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.links import LinkWatch, repair_links
from distronet.protocol.identity import Identity


def test_member_in_topic_is_never_redialled() -> None:
    w = LinkWatch(grace=1, every_s=0.0)
    for t in range(5):
        assert w.due({"a", "b"}, {"a", "b", "c"}, float(t)) == []


def test_missing_member_redialled_after_grace_then_rate_limited() -> None:
    w = LinkWatch(grace=2, every_s=30.0)
    assert w.due({"a", "b"}, {"a"}, 0.0) == []  # first sighting: maybe its hello is still on the way
    assert w.due({"a", "b"}, {"a"}, 3.0) == ["b"]
    assert w.due({"a", "b"}, {"a"}, 6.0) == []  # re-dialled 3 s ago
    assert w.due({"a", "b"}, {"a"}, 33.0) == ["b"]
    assert w.redials == 0  # counted by repair_links, which dials


def test_a_member_that_joined_the_topic_resets_its_count() -> None:
    w = LinkWatch(grace=2, every_s=0.0)
    assert w.due({"b"}, set(), 0.0) == []
    assert w.due({"b"}, {"b"}, 1.0) == []
    assert w.due({"b"}, set(), 2.0) == []  # missing again: counting starts over
    assert w.due({"b"}, set(), 3.0) == ["b"]


def test_several_missing_sorted() -> None:
    w = LinkWatch(grace=1, every_s=10.0)
    assert w.due({"c", "a", "b"}, {"b"}, 0.0) == ["a", "c"]


# --- repair_links against a fake swarm: who is disconnected and dialled ---------------------------

RELAY, ME, A, B = (Identity.from_seed(bytes([i + 1]) * 32).peer_id_b58 for i in range(4))
RELAY_ADDR = f"/ip4/192.0.2.1/tcp/4002/p2p/{RELAY}"


class _Host:
    def __init__(self, connected: set[str], relayed: set[str]) -> None:
        self.peer_id_b58 = ME
        self.relay_ids = frozenset({RELAY})
        self.config = SimpleNamespace(relays=[RELAY_ADDR])
        self.connected, self.relayed = connected, relayed
        self.calls: list[tuple[str, str]] = []

    async def relayed_peers(self) -> set[str]:
        return self.relayed

    async def connected_peers(self) -> list[PeerID]:
        return [PeerID.from_base58(p) for p in sorted(self.connected)]

    async def disconnect(self, peer: PeerID) -> None:
        self.calls.append(("disconnect", peer.to_base58()))

    async def connect(self, addr: str) -> None:
        self.calls.append(("connect", addr))


def _fake_swarm(topic: list[str], host: _Host) -> Any:
    async def members() -> dict[str, Any]:
        return {p: SimpleNamespace(maddrs=[f"/ip4/10.0.0.{i}/tcp/4001"]) for i, p in enumerate((ME, A, B))}

    async def topic_peers(_: str) -> list[PeerID]:
        return [PeerID.from_base58(p) for p in topic]

    return SimpleNamespace(
        host=host,
        membership=SimpleNamespace(members=members),
        gossip=SimpleNamespace(topic_peers=topic_peers),
    )


async def test_a_connected_relay_missing_from_the_topics_is_dialled_again() -> None:
    """A is in our topics, B is reached only through the relay, and the relay is connected but not
    in our topics, so B's gossip cannot reach us: the relay is re-dialled (disconnect, then its
    run-file address). B is due but left connected: its addresses are behind its router, and the
    relayed connection is its only path (a NAT chaos run's node never meshed again after B's
    was cut)."""
    host = _Host(connected={RELAY, A, B}, relayed={B})
    swarm = _fake_swarm([A], host)
    due = await repair_links(swarm, LinkWatch(grace=1, every_s=0.0), ["t"])
    assert due == [B]
    assert host.calls == [("disconnect", RELAY), ("connect", RELAY_ADDR)]


async def test_a_member_connected_directly_is_still_cut_and_dialled_again() -> None:
    host = _Host(connected={RELAY, A, B}, relayed=set())
    swarm = _fake_swarm([A], host)
    assert await repair_links(swarm, LinkWatch(grace=1, every_s=0.0), ["t"]) == [B]
    assert ("disconnect", B) in host.calls
    assert host.calls[-1] == ("connect", f"/ip4/10.0.0.2/tcp/4001/p2p/{B}")


async def test_with_the_relay_in_the_topics_its_peers_count_and_nobody_is_dialled() -> None:
    host = _Host(connected={RELAY, A, B}, relayed={B})
    swarm = _fake_swarm([RELAY, A], host)
    assert await repair_links(swarm, LinkWatch(grace=1, every_s=0.0), ["t"]) == []
    assert host.calls == []


async def test_a_relay_not_connected_is_left_to_the_reservation_logic() -> None:
    host = _Host(connected={A}, relayed=set())
    swarm = _fake_swarm([A], host)
    assert await repair_links(swarm, LinkWatch(grace=1, every_s=0.0), ["t"]) == [B]
    assert [c for c in host.calls if RELAY in c[1]] == []
