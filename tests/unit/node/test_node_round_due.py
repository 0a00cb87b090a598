"""The daemon's round accounting under every overlap mode (the drift-check digest's swarm tests
are in tests/integration/test_swarm_sim.py)."""

from __future__ import annotations

from dataclasses import dataclass

from distronet.node.daemon.loops import round_due


@dataclass
class _Opt:
    start: int | None  # None: no overlap

    def overlapped(self, step: int) -> bool:
        return self.start is not None and step >= self.start


def test_round_due() -> None:
    assert [round_due(_Opt(None), s) for s in range(3)] == [0, 1, 2]
    assert [round_due(_Opt(0), s) for s in range(3)] == [None, 0, 1]
    assert [round_due(_Opt(2), s) for s in range(5)] == [0, 1, None, 2, 3]
    assert round_due(object(), 7) == 7
