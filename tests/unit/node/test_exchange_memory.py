"""The in-memory exchange and its faulty links: identical accepted sets on every replica."""

from __future__ import annotations

import pytest

from distronet.node.exchange.base import ExchangeError, PeerDead, Round, RoundUnavailable
from distronet.node.exchange.faulty import FaultPlan, FaultyExchange, FaultyLinks
from distronet.node.exchange.memory import MemoryHub
from distronet.protocol.errors import ConfigError

PEERS = [bytes([i]) * 4 for i in (3, 1, 4, 2)]


def _frame(pid: bytes, step: int) -> bytes:
    return pid + step.to_bytes(4, "big") * 10


def test_round_sorted_and_counts() -> None:
    hub = MemoryHub()
    exs = [hub.join(p) for p in PEERS]
    for ex in exs:
        ex.publish(0, _frame(ex.peer_id, 0))
    rounds = [ex.collect(0) for ex in exs]
    assert all(r == rounds[0] for r in rounds)
    assert list(rounds[0].manifest) == sorted(PEERS)
    assert rounds[0][PEERS[0]] == _frame(PEERS[0], 0)
    assert exs[0].stats.bytes_up == len(_frame(PEERS[0], 0))
    assert exs[0].stats.bytes_down == 3 * len(_frame(PEERS[0], 0))
    with pytest.raises(ExchangeError):
        exs[0].publish(0, b"again")


def test_late_publish_excluded_everywhere() -> None:
    hub = MemoryHub()
    exs = [hub.join(p) for p in PEERS]
    for ex in exs[:3]:
        ex.publish(5, _frame(ex.peer_id, 5))
    r0 = exs[0].collect(5)
    exs[3].publish(5, _frame(PEERS[3], 5))  # after the round was decided
    assert all(ex.collect(5) == r0 for ex in exs)
    assert PEERS[3] not in r0 and len(r0) == 3 and hub.late_uploads == 1


def test_faulty_links_identical_sets_and_exact_bytes() -> None:
    plan = FaultPlan(seed=7, p_drop=0.2, p_late=0.1, p_duplicate=0.3, max_delay=0.9)
    links = FaultyLinks(plan)
    hub = MemoryHub(links)
    exs = [hub.join(p) for p in PEERS]
    sizes = set()
    for step in range(40):
        for ex in exs:
            ex.publish(step, _frame(ex.peer_id, step))
        rounds = [ex.collect(step) for ex in exs]
        assert all(r.frames == rounds[0].frames for r in rounds)
        for pid, fr in rounds[0].items():
            assert fr == _frame(pid, step)
        sizes.add(len(rounds[0]))
    assert min(sizes) < len(PEERS)  # some uploads were lost or late
    assert links.counts["duplicate"] > 0 and links.counts["drop"] > 0 and links.counts["late"] > 0
    assert sum(ex.stats.repulled for ex in exs) > 0
    assert sum(ex.stats.duplicates_dropped for ex in exs) > 0


def test_faulty_links_replay() -> None:
    plan = FaultPlan(seed=3, p_drop=0.5)
    a, b = FaultyLinks(plan), FaultyLinks(plan)
    fates = [a.fate("up", s, PEERS[0], None) for s in range(50)]
    assert fates == [b.fate("up", s, PEERS[0], None) for s in range(50)]


def test_peer_death() -> None:
    hub = MemoryHub()
    exs = [FaultyExchange(hub.join(p), die_at_step=2 if i == 1 else None) for i, p in enumerate(PEERS)]
    for step in range(4):
        for ex in exs:
            if not (ex.dead or (step >= 2 and ex is exs[1])):
                ex.publish(step, _frame(ex.peer_id, step))
        live = [ex for ex in exs if not ex.dead and not (step >= 2 and ex is exs[1])]
        rounds = [ex.collect(step) for ex in live]
        assert all(r == rounds[0] for r in rounds)
        assert (PEERS[1] in rounds[0]) == (step < 2)
    with pytest.raises(PeerDead):
        exs[1].publish(2, b"x")
    assert exs[1].dead and PEERS[1] not in hub.live_peers


def test_retention_and_config_errors() -> None:
    hub = MemoryHub(retention=2)
    ex = hub.join(PEERS[0])
    for step in range(5):
        ex.publish(step, b"f")
        ex.collect(step)
    with pytest.raises(RoundUnavailable):
        ex.collect(0)
    with pytest.raises(ConfigError):
        FaultPlan(p_drop=1.5)
    with pytest.raises(ExchangeError):
        hub.join(PEERS[0])
    assert isinstance(Round(0, {b"b": b"1", b"a": b"2"}).manifest, tuple)
    assert Round(0, {b"b": b"1", b"a": b"2"}).manifest == (b"a", b"b")
