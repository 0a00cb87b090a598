"""``stack.run_peers``: the run's peers to ask for digests, rounds and states (relays are not
nodes; peers behind a relay count while the relay forwards the run's gossip)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from distronet.node.swarm.errors import DaemonError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.stack import run_peers
from distronet.protocol.identity import Identity

RELAY, A, B, C = (Identity.from_seed(bytes([i]) * 32).peer_id_b58 for i in range(4))


def _swarm(topic: list[str], relayed: set[str] | Exception) -> Any:
    async def topic_peers(_: str) -> list[PeerID]:
        return [PeerID.from_base58(p) for p in topic]

    async def relayed_peers() -> set[str]:
        if isinstance(relayed, Exception):
            raise relayed
        return relayed

    host = SimpleNamespace(relay_ids=frozenset({RELAY}), relayed_peers=relayed_peers)
    return SimpleNamespace(topic="t", gossip=SimpleNamespace(topic_peers=topic_peers), host=host)


async def test_peers_behind_the_relay_count_and_the_relay_does_not() -> None:
    got = await run_peers(_swarm([RELAY, A], {B, C}))
    assert sorted(p.to_base58() for p in got) == sorted([A, B, C])


async def test_without_a_relay_in_the_topic_only_the_topic_peers() -> None:
    got = await run_peers(_swarm([A, B], {C}))
    assert sorted(p.to_base58() for p in got) == sorted([A, B])


async def test_a_silent_p2pd_leaves_the_topic_peers() -> None:
    got = await run_peers(_swarm([RELAY, A], DaemonError("list peers: no answer")))
    assert [p.to_base58() for p in got] == [A]
