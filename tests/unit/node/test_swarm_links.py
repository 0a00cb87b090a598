"""``swarm.links.LinkWatch``: whom to re-dial when a member is missing from the gossip topics."""

from __future__ import annotations

from distronet.node.swarm.links import LinkWatch


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
