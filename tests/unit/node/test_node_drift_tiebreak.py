"""The drift check's tie-break (``digests.state_to_adopt``): every replica picks the same state."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from distronet.node.catchup.digests import state_to_adopt

A, B, C, D = (bytes([i]) * 32 for i in (1, 2, 3, 4))


def test_all_equal_keeps() -> None:
    assert state_to_adopt(A, {"p1": A, "p2": A}) is None


def test_no_answers_keeps() -> None:
    assert state_to_adopt(A, {}) is None
    assert state_to_adopt(A, {"p1": None, "p2": None}) is None


def test_lone_outlier_adopts_majority() -> None:
    assert state_to_adopt(D, {"p1": A, "p2": A, "p3": None}) == ["p1", "p2"]


def test_majority_wins_even_when_someone_agrees_with_us() -> None:
    # 2 hold A (us + p1), 3 hold B: the A side adopts B
    assert state_to_adopt(A, {"p1": A, "p2": B, "p3": B, "p4": B}) == ["p2", "p3", "p4"]


def test_all_different_smallest_digest_wins() -> None:
    """The case that never repaired: no two replicas agree. The smallest digest keeps its state,
    every other replica adopts it, from that replica only."""
    swarm = {"n0": C, "n1": A, "n2": D, "n3": B}
    verdicts = {
        me: state_to_adopt(mine, {p: d for p, d in swarm.items() if p != me}) for me, mine in swarm.items()
    }
    assert verdicts == {"n0": ["n1"], "n1": None, "n2": ["n1"], "n3": ["n1"]}


def test_two_replicas_never_swap() -> None:
    assert state_to_adopt(A, {"y": B}) is None
    assert state_to_adopt(B, {"x": A}) == ["x"]


def test_equal_groups_smallest_digest_wins() -> None:
    assert state_to_adopt(A, {"p1": A, "p2": B, "p3": B}) is None
    assert state_to_adopt(B, {"p1": B, "p2": A, "p3": A}) == ["p2", "p3"]


@given(st.lists(st.sampled_from([A, B, C, D]), min_size=1, max_size=8))
def test_full_view_converges_in_one_round(digests: list[bytes]) -> None:
    """With every answer heard, after each node adopts what the rule says, all hold one digest,
    no node in the winning group moves, and every donor holds that digest."""
    swarm = dict(enumerate(digests))
    after = {}
    for me, mine in swarm.items():
        donors = state_to_adopt(mine, {p: d for p, d in swarm.items() if p != me})
        if donors is None:
            after[me] = mine
        else:
            assert donors and me not in donors
            held = {swarm[p] for p in donors}
            assert len(held) == 1 and mine not in held
            after[me] = held.pop()
    assert len(set(after.values())) == 1
    winner = next(iter(after.values()))
    assert all(after[p] == d for p, d in swarm.items() if d == winner)
    # and the result is stable: a second round moves nobody
    for me, mine in after.items():
        assert state_to_adopt(mine, {p: d for p, d in after.items() if p != me}) is None


def test_order_of_answers_does_not_matter() -> None:
    peers = {"a": B, "b": C, "c": B, "d": C}
    for perm in itertools.permutations(peers):
        got = state_to_adopt(D, {p: peers[p] for p in perm})
        assert got is not None and sorted(got) == ["a", "c"]
