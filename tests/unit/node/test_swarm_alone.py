"""``AloneWatch``: whom a replica that knows nobody asks, and what it does with the answers."""

from __future__ import annotations

import asyncio
import time

import pytest

from distronet.node.exchange.alone import NEAR_STEPS, PROBE_PEERS, RECHECK_S, AloneWatch


class Behind(Exception):
    def __init__(self, message: str, swarm_step: int) -> None:
        super().__init__(message)
        self.swarm_step = swarm_step


PEERS = [bytes([i]) * 38 for i in range(6)]


async def settle(
    watch: AloneWatch, at: dict[bytes, int | None], heard: list[bool], step: int = 50
) -> list[bytes]:
    """Run ``settle`` for ``step`` with peers at ``at``; the peers asked for a manifest."""
    asked_manifest: list[bytes] = []

    async def ask_step(peer: bytes) -> int | None:
        return at.get(peer)

    async def ask_manifest(peer: bytes) -> bool:
        asked_manifest.append(peer)
        return False

    await watch.settle(
        step, list(at), ask_step=ask_step, ask_manifest=ask_manifest, heard=lambda: heard[0],
        changed=asyncio.Event(), round_deadline_s=0.01, fell_behind=Behind,
    )  # fmt: skip
    return asked_manifest


async def test_a_peer_past_our_step_means_we_fell_behind() -> None:
    with pytest.raises(Behind) as info:
        await settle(AloneWatch(0), {PEERS[0]: 49, PEERS[1]: 57, PEERS[2]: None}, [False])
    assert info.value.swarm_step == 57 and "cannot hear the swarm" in str(info.value)


async def test_peers_far_behind_or_silent_let_the_round_of_one_go_on_and_are_not_asked_again_soon() -> None:
    watch = AloneWatch(0)
    t0 = time.monotonic()
    asked = await settle(watch, {PEERS[0]: 50 - NEAR_STEPS - 1, PEERS[1]: None}, [False])
    assert asked == [] and watch.waits == 0
    assert watch.quiet_until >= t0 + RECHECK_S
    assert await settle(watch, {PEERS[0]: 99}, [False]) == []  # quiet: not asked (99 would raise)


async def test_peers_in_step_are_waited_for_and_asked_for_the_round_until_someone_is_heard() -> None:
    watch = AloneWatch(0)
    heard = [False]

    async def hear_soon() -> None:
        await asyncio.sleep(0.03)
        heard[0] = True

    hearing = asyncio.ensure_future(hear_soon())
    asked = await settle(watch, {PEERS[0]: 50, PEERS[1]: 50 - NEAR_STEPS}, heard)
    await hearing
    assert watch.waits == 1 and set(asked) == {PEERS[0], PEERS[1]}


async def test_the_wait_for_peers_in_step_is_bounded() -> None:
    watch = AloneWatch(0)
    t0 = time.monotonic()
    await settle(watch, {PEERS[0]: 48}, [False])  # never heard: (NEAR_STEPS + 2) deadlines
    assert 0.9 * (NEAR_STEPS + 2) * 0.01 <= time.monotonic() - t0 < 5.0
    assert watch.waits == 1


async def test_only_a_few_peers_are_asked_and_only_after_the_configured_rounds_of_one() -> None:
    asked: list[bytes] = []

    async def ask_step(peer: bytes) -> int | None:
        asked.append(peer)
        return None

    watch = AloneWatch(2)

    async def run() -> None:
        await watch.settle(
            5, PEERS, ask_step=ask_step, ask_manifest=lambda p: asyncio.sleep(0, False), heard=lambda: False,
            changed=asyncio.Event(), round_deadline_s=0.01, fell_behind=Behind,
        )  # fmt: skip

    await run()
    assert asked == []  # no round of one yet
    watch.decided(True, 1)
    watch.decided(True, 1)
    await run()
    assert asked == sorted(PEERS)[:PROBE_PEERS]
    watch.decided(True, 3)  # a round with others in it ends the run of rounds of one
    assert watch.streak == 0
