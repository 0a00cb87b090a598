"""How each peer is reached, from successive samples of p2pd's connections (swarm/reach.py)."""

from __future__ import annotations

from distronet.node.swarm.reach import ReachBook, ReachCounts, Route, is_relayed

RELAY = "/ip4/203.0.113.7/tcp/4001/p2p/12D3KooWRelay/p2p-circuit"
DIRECT = "/ip4/198.51.100.9/tcp/5555"


def test_a_circuit_address_is_relayed_any_other_direct() -> None:
    assert is_relayed(RELAY)
    assert not is_relayed(DIRECT)
    assert not is_relayed("/ip4/10.0.0.2/udp/4001/quic-v1")


def test_routes_and_counts_of_one_sample() -> None:
    book = ReachBook()
    routes = book.update([("A", DIRECT), ("B", RELAY), ("C", RELAY), ("C", DIRECT)])
    # a peer with both a relayed and a direct connection is reached directly
    assert routes == {"A": Route.DIRECT, "B": Route.RELAYED, "C": Route.DIRECT}
    assert book.counts() == ReachCounts(direct=2, hole_punched=0, relayed=1)
    assert book.counts().total == 3


def test_a_peer_first_seen_relayed_then_direct_was_hole_punched() -> None:
    book = ReachBook()
    assert book.update([("B", RELAY)]) == {"B": Route.RELAYED}
    assert book.update([("B", RELAY), ("B", DIRECT)]) == {"B": Route.HOLE_PUNCHED}
    assert book.update([("B", DIRECT)]) == {"B": Route.HOLE_PUNCHED}  # the relayed link closed
    assert book.counts() == ReachCounts(direct=0, hole_punched=1, relayed=0)
    # the punched link closes: gone from the routes; back on the relay, then direct again
    assert book.update([]) == {}
    assert book.update([("B", RELAY)]) == {"B": Route.RELAYED}
    assert book.update([("B", DIRECT)]) == {"B": Route.HOLE_PUNCHED}


def test_direct_from_the_start_is_never_hole_punched() -> None:
    book = ReachBook()
    for _ in range(3):
        assert book.update([("A", DIRECT)]) == {"A": Route.DIRECT}


def test_the_book_keeps_at_most_max_peers() -> None:
    book = ReachBook(max_peers=4)
    routes = book.update([(f"P{i}", RELAY) for i in range(10)])
    assert len(routes) == 4
    assert len(book._relayed_before) == 4
