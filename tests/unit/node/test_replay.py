"""``node/replay.replay_to_swarm``: when a replica replays the swarm's rounds, from whom, until
when, and when it must download a state instead (peers and rounds given as callables)."""

from __future__ import annotations

import asyncio

import pytest

from distronet.node.catchup.replay import AHEAD, Replayed, replay_to_swarm
from distronet.node.exchange.base import Round, RoundUnavailable

A, B, C = b"a" * 38, b"b" * 38, b"c" * 38


class _Swarm:
    """Peers at given steps; rounds below ``decided_below`` are decided, those below ``gone_below``
    are older than the peers' window."""

    def __init__(self, at: dict[bytes, int | None], decided_below: int, gone_below: int = -1) -> None:
        self.at, self.decided_below, self.gone_below = at, decided_below, gone_below
        self.asked: list[tuple[int, list[bytes]]] = []
        self.applied: list[int] = []

    async def ask_step(self, peer: bytes) -> int | None:
        return self.at.get(peer)

    async def replay_round(self, step: int, sources: list[bytes], timeout: float) -> Round | None:
        self.asked.append((step, sources))
        if step < self.gone_below:
            raise RoundUnavailable(f"step {step} is older than the window")
        return Round(step, {}) if step < self.decided_below else None

    async def apply(self, rnd: Round) -> None:
        self.applied.append(rnd.step)

    async def run(self, due: int, max_gap: int = 16, timeout: float = 10.0) -> Replayed | None:
        return await replay_to_swarm(
            list(self.at), ask_step=self.ask_step, due=due, max_gap=max_gap,
            replay_round=self.replay_round, apply=self.apply, timeout=timeout,
        )  # fmt: skip


@pytest.mark.asyncio
async def test_it_replays_each_decided_round_in_order_from_the_most_advanced_peer() -> None:
    swarm = _Swarm({A: 5, B: 7, C: None}, decided_below=6)
    assert await swarm.run(due=2) == Replayed(first=2, rounds=4, swarm_step=7)
    assert swarm.applied == [2, 3, 4, 5]
    asked = sorted({s for s, _ in swarm.asked})  # 6: not decided yet, the tip
    assert asked == [2, 3, 4, 5, 6, 7]  # fetched ahead, but never past the swarm's newest step
    assert all(sources == [B, A] for _, sources in swarm.asked)  # silent C is not asked


@pytest.mark.asyncio
async def test_in_step_it_replays_nothing_and_says_where_the_swarm_is() -> None:
    swarm = _Swarm({A: -1, B: 0}, decided_below=0)  # a run starting: nobody has decided a round
    assert await swarm.run(due=0) == Replayed(first=0, rounds=0, swarm_step=0)
    assert swarm.applied == [] and {s for s, _ in swarm.asked} == {0}  # nothing past their step
    unborn = _Swarm({A: -1, B: -1}, decided_below=0)  # no peer has made a step: nothing to ask
    assert await unborn.run(due=0) == Replayed(first=0, rounds=0, swarm_step=-1)
    assert unborn.asked == []


@pytest.mark.asyncio
async def test_it_gives_up_for_a_download_when_nobody_answers_or_the_swarm_is_too_far() -> None:
    assert await _Swarm({A: None, B: None}, decided_below=9).run(due=0) is None
    far = _Swarm({A: 40}, decided_below=40)
    assert await far.run(due=3, max_gap=16) is None
    assert far.asked == []  # not a single round fetched


@pytest.mark.asyncio
async def test_a_round_older_than_the_peers_window_or_no_time_left_stops_short_of_the_tip() -> None:
    gone = _Swarm({A: 10}, decided_below=10, gone_below=4)
    assert await gone.run(due=2) == Replayed(first=2, rounds=0, swarm_step=10, tip=False)
    assert gone.applied == []

    class Slow(_Swarm):
        async def apply(self, rnd: Round) -> None:
            await asyncio.sleep(0.05)
            self.applied.append(rnd.step)

    slow = Slow({A: 10}, decided_below=10)
    got = await slow.run(due=0, timeout=0.12)
    assert got is not None and not got.tip and got.rounds == len(slow.applied)  # what it applied counts
    assert 1 <= len(slow.applied) <= 4


@pytest.mark.asyncio
async def test_rounds_fetched_ahead_are_applied_in_order_whatever_order_they_arrive_in() -> None:
    class Reversed(_Swarm):
        async def replay_round(self, step: int, sources: list[bytes], timeout: float) -> Round | None:
            await asyncio.sleep(0.01 * (AHEAD - step % AHEAD))  # later rounds arrive first
            return await super().replay_round(step, sources, timeout)

    swarm = Reversed({A: 12}, decided_below=11)
    assert await swarm.run(due=0) == Replayed(first=0, rounds=11, swarm_step=12)
    assert swarm.applied == list(range(11))


@pytest.mark.asyncio
async def test_a_swarm_that_moves_on_during_the_replay_is_followed_to_its_new_tip() -> None:
    class Moving(_Swarm):
        async def apply(self, rnd: Round) -> None:
            await super().apply(rnd)
            if self.decided_below < 8:  # the swarm decides one more round while we apply one
                self.decided_below += 1
                self.at[A] = self.decided_below

    swarm = Moving({A: 3}, decided_below=3)
    assert await swarm.run(due=0) == Replayed(first=0, rounds=8, swarm_step=8)
    assert swarm.applied == list(range(8))
