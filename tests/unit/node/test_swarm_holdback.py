"""HoldBack: messages for steps past the window, bounded per sender and in senders."""

from __future__ import annotations

import pytest

from distronet.node.daemon.status import KEEP_ROUNDS, NodeStatus
from distronet.node.exchange.holdback import HoldBack

A, B, C = b"a" * 38, b"b" * 38, b"c" * 38


def test_keeps_the_newest_steps_per_sender_and_hands_back_a_window() -> None:
    h: HoldBack[str] = HoldBack(per_source=3, max_sources=2)
    for step in range(10, 16):
        assert h.hold(A, step, f"a{step}") == True  # noqa: E712  (each is the newest so far)
    assert not h.hold(A, 11, "old")  # older than A's newest 3
    assert not h.hold(A, 15, "again")  # that step is held already
    assert h.hold(B, 20, "b20")
    assert not h.hold(C, 30, "c30")  # sender table full: a flood of new senders is refused
    assert len(h) == 4 and h.newest() == {A: 15, B: 20}
    got = h.take(14, 18)  # 13 is below the window: dropped; 20 stays held
    assert got == [(14, A, "a14"), (15, A, "a15")]
    assert h.newest() == {B: 20} and h.take(0, 100) == [(20, B, "b20")] and len(h) == 0
    assert h.hold(C, 30, "c30")  # room again


def test_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        HoldBack(per_source=0)


def test_status_keeps_recent_rounds_and_writes_them_as_json() -> None:
    s = NodeStatus("run", "peer")
    for step in range(KEEP_ROUNDS + 5):
        s.record_round(step, ["p1", "p2"])
    doc = s.to_json()
    assert len(doc["accepted"]) == KEEP_ROUNDS and "5" in doc["accepted"] and "4" not in doc["accepted"]
    assert doc["completed_units"] == [] and doc["warmup_until"] == -1 and doc["pending_reports"] == 0
