"""Catching up by replaying the rounds the swarm decided, instead of downloading its state.

A replica that holds the swarm's state of an earlier step — a node of a run that started a moment
before it (every replica starts from the run's seeded weights), one back from a short pause or a
failed round, one restarted from its own checkpoint — and is only a few rounds behind does not
need the whole state (7.4 MB for the default GPT: ~15 s under a 4 mbit donor's upload, during
which the swarm moves on again). It asks a peer which accepted set it applied for each round it
missed (``manifest_ask.request_decided``), pulls those frames (~25 KB a packet) and applies them
in order (``DistroOptimizer.apply_replayed``: decode + update, ~35 ms a round, no gradient), until
the peer answers that the next round is not decided yet: it is then at the swarm's step, with its
momentum intact (so its packets count at once; no warm-up masking).

``replay_to_swarm`` is tried first by ``CatchUp.catch_up`` (``resync.py`` draws the whole
catch-up flow); it gives up (the node downloads a state) when no peer answers, when the swarm is
more than ``max_gap`` rounds ahead (the peers' retention less ``GAP_MARGIN``: older frames are
gone), or when a round cannot be fetched. After a download it runs again: the swarm moved on
while the state came. A replica whose state *differs* from the swarm's (a drift check found it)
must not replay: replaying keeps its own parameters. :func:`replay_rounds` wires it to a
``Replica`` and the libp2p exchange.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from distronet.node.catchup.replica import Replica
from distronet.node.exchange.base import Round, RoundUnavailable
from distronet.node.exchange.manifest_ask import AskStep, ask_newest, steps_of
from distronet.node.exchange.swarm import AsyncSwarmExchange
from distronet.node.swarm.control import peer_id

__all__ = ["AHEAD", "Replayed", "kth_newest", "replay_rounds", "replay_to_swarm", "vouched_step"]

log = logging.getLogger(__name__)

ASK_TIMEOUT_S = 2.0  # per question
GAP_MARGIN = 4  # rounds a peer may drop from its window (retention) while we replay
AHEAD = 4  # rounds fetched ahead of the one being applied


@dataclass(frozen=True)
class Replayed:
    """What a replay did: ``rounds`` applied (``first`` .. ``first + rounds - 1``), the newest
    step a peer had opened when asked (``swarm_step``; -1: none yet), and whether it reached a
    round the peer had not decided yet (``tip``; else a round could not be fetched or the time
    ran out, and the rounds applied are kept: each is the swarm's)."""

    first: int
    rounds: int
    swarm_step: int
    tip: bool = True


ReplayRound = Callable[[int, list[bytes], float], Awaitable[Round | None]]
ApplyRound = Callable[[Round], Awaitable[None]]


async def replay_to_swarm(
    peers: Sequence[bytes],
    *,
    ask_step: AskStep,
    due: int,
    max_gap: int,
    replay_round: ReplayRound,
    apply: ApplyRound,
    timeout: float,
) -> Replayed | None:
    """Replay from round ``due`` up to the swarm's step (module doc). ``ask_step(peer)`` is
    ``manifest_ask.ask_newest`` (-1: no step yet; None: no answer); ``replay_round(step, sources,
    timeout)`` is the exchange's ``replay``; ``apply`` applies one round to the model.
    None when the node should download a state instead: no peer answered, or the swarm is more
    than ``max_gap`` rounds past ``due``; ``tip`` false when a round could not be fetched or the
    time ran out (after the rounds counted)."""

    def where() -> Awaitable[dict[bytes, int]]:  # peer -> its newest step, for those that answer
        return steps_of(peers, ask_step)

    at = await where()
    if not at:
        return None
    swarm = max(at.values())
    if swarm - due > max_gap:
        log.info("replay: the swarm is at step %d, %d rounds past ours: too far", swarm, swarm - due)
        return None
    sources = sorted(at, key=lambda p: -at[p])  # the most advanced peer first
    end, step = time.monotonic() + timeout, due
    ahead: dict[int, asyncio.Task[Round | None]] = {}  # the next rounds, fetched while one applies

    def fetch(s: int) -> asyncio.Task[Round | None]:
        return asyncio.ensure_future(
            replay_round(s, sources, max(0.1, min(ASK_TIMEOUT_S, end - time.monotonic())))
        )

    try:
        while True:
            for s in range(step, min(step + AHEAD, swarm + 1)):  # none past the swarm's newest
                if s not in ahead:
                    ahead[s] = fetch(s)
            if step not in ahead:  # past the peers' newest step as last asked: where are they now?
                swarm = max([swarm, *(await where()).values()])
                if step > swarm:
                    return Replayed(due, step - due, swarm)
                continue
            left = end - time.monotonic()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                rnd = await asyncio.wait_for(ahead.pop(step), left)
            except asyncio.TimeoutError:
                log.info("replay: out of time at round %d", step)
                return Replayed(due, step - due, swarm, tip=False)
            except RoundUnavailable as e:
                log.info("replay: round %d: %s", step, e)
                return Replayed(due, step - due, swarm, tip=False)
            if rnd is None:  # asked before the last rounds were applied: the swarm may be past it
                try:
                    rnd = await asyncio.wait_for(fetch(step), max(0.1, end - time.monotonic()))
                except (asyncio.TimeoutError, RoundUnavailable):
                    rnd = None
                if rnd is None:
                    return Replayed(due, step - due, swarm)
            await apply(rnd)
            step += 1
    finally:
        for task in ahead.values():
            task.cancel()


async def replay_rounds(
    replica: Replica, core: AsyncSwarmExchange, peers: Sequence[bytes], timeout: float
) -> Replayed | None:
    """:func:`replay_to_swarm` from the round ``replica``'s optimizer is due to apply, over the
    libp2p exchange ``core`` (its ``replay``; each peer's step asked with ``manifest_ask``), each
    round applied under ``replica.lock``. Moves ``replica.step`` past the rounds applied (each is
    the swarm's, whatever came after them). None: a state must be downloaded instead."""
    optimizer, control = replica.optimizer, core.swarm.host.control_path

    async def apply(rnd: Round) -> None:
        async with replica.lock:
            await asyncio.to_thread(optimizer.apply_replayed, rnd)

    got = await replay_to_swarm(
        peers, ask_step=lambda p: ask_newest(control, peer_id(p), ASK_TIMEOUT_S), due=optimizer.rounds_due(),
        max_gap=max(1, core.config.retention - GAP_MARGIN), replay_round=core.replay, apply=apply,
        timeout=timeout,
    )  # fmt: skip
    if got is not None and got.rounds:
        replica.step = optimizer.step_index
    return got


def kth_newest(steps: Sequence[int], quorum: int) -> int | None:
    """The newest step that at least ``min(quorum, len(steps))`` of the answers reach (None for
    no answer): a single peer claiming a far step does not move it while others answer."""
    if not steps:
        return None
    return sorted(steps, reverse=True)[min(max(1, quorum), len(steps)) - 1]


async def vouched_step(core: AsyncSwarmExchange, peers: Sequence[bytes], quorum: int) -> int | None:
    """:func:`kth_newest` of the steps (up to ``PROBE_PEERS`` of) ``peers`` say they have opened
    (``manifest_ask.ask_newest``): the bound a fetched state's step must keep (``resync.py``)."""
    control = core.swarm.host.control_path
    at = await steps_of(peers, lambda p: ask_newest(control, peer_id(p), ASK_TIMEOUT_S))
    return kth_newest(list(at.values()), quorum)
