"""Who may lead a round when some producers are warming up (masked packets)."""

from __future__ import annotations

from distronet.protocol.manifest import may_lead

A, B, C, X = b"a", b"b", b"c", b"x"


def test_warm_producers_never_lead_beside_unmasked_ones() -> None:
    assert may_lead({A, B, X}, {X}, set()) == {A, B}


def test_a_round_of_warm_producers_only_takes_them_as_they_are() -> None:
    # a swarm that all resynced at once: nobody unmasked is left to lead
    assert may_lead({X, A}, {X, A}, set()) == {X, A}


def test_a_replica_back_from_a_pause_does_not_lead_its_warm_up_alone() -> None:
    # chaos 3: the resumed replica heard only itself in time, but its peers are recent producers
    assert may_lead({X}, {X}, {A, B, C}) == set()
