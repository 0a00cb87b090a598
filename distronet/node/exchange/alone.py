"""A replica that knows no producer but itself: ask the topic's peers which step they are at.

``exchange.AsyncSwarmExchange`` (module doc, "Hearing nobody") calls :meth:`AloneWatch.settle`
before freezing a round in which it knows nobody but itself (the two rounds before were rounds of
one) while other peers are in the announcement topic. From the ``rounds``-th such round in a row
(default 0: at the first), the watch asks up to ``PROBE_PEERS`` of them which step they are at
(``manifest_ask.request_newest``):

- a peer past this step → ``FellBehind`` (the daemon adopts the swarm's state);
- peers at most ``NEAR_STEPS`` below it (alive, in step, but unheard: our gossip is deaf, or we
  ran ahead) → wait for them, re-asking about once a second and asking them for this step's
  manifest (which the exchange adopts when one has sealed it), until someone is heard or for at
  most ``NEAR_STEPS + 2`` round deadlines;
- no answer, or only peers far behind (dead, paused, still syncing) → the round of one goes
  ahead, and rounds of one go on unasked for ``RECHECK_S``. A node whose peers all died keeps
  training.

The watch holds no reference to the exchange: it is given the peers, how to ask them, and how to
tell that the round is no longer one of ours alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection

from distronet.node.exchange.manifest_ask import PROBE_PEERS, AskStep, steps_of
from distronet.protocol.manifest import leader_rank

__all__ = ["NEAR_STEPS", "PROBE_PEERS", "PROBE_TIMEOUT_S", "RECHECK_S", "AloneWatch", "MakeFellBehind"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0  # per question
NEAR_STEPS = 8  # a peer at most this far below our step is in step with us
RECHECK_S = 10.0  # after asking found nobody near, rounds of one go on unasked this long

AskManifest = Callable[[bytes], Awaitable[bool]]
MakeFellBehind = Callable[[str, int], Exception]  # (message, swarm_step) -> the error to raise


class AloneWatch:
    """Rounds of one in a row, and when to ask the topic's peers. One per exchange; event-loop only."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.streak = 0  # rounds of one applied in a row while peers were in the topic
        self.waits = 0  # rounds of one held back for unheard peers in step with us
        self.quiet_until = 0.0  # rounds of one go on unasked until then (monotonic)

    def decided(self, alone: bool, accepted: int) -> None:
        """Count a decided round: ``alone`` as :meth:`settle` was called for it, ``accepted``
        packets in its accepted set."""
        self.streak = self.streak + 1 if alone and accepted <= 1 else 0

    async def settle(
        self,
        step: int,
        peers: Collection[bytes],
        *,
        ask_step: AskStep,
        ask_manifest: AskManifest,
        heard: Callable[[], bool],
        changed: asyncio.Event,
        round_deadline_s: float,
        fell_behind: MakeFellBehind,
    ) -> None:
        """Return when the round may be decided (``heard()`` became true: an announcement or a
        manifest came; nobody is near; or the wait ran out). Raises ``fell_behind(message,
        swarm_step)`` when a peer is past ``step``. ``changed`` is set whenever the round gains
        something; ``ask_manifest(peer)`` asks one peer for the round's sealed manifest."""
        if self.streak < self.rounds or time.monotonic() < self.quiet_until:
            return
        wait_s = (NEAR_STEPS + 2) * round_deadline_s
        give_up = time.monotonic() + wait_s
        waited = False
        while True:
            at = await steps_of(peers, ask_step)
            if any(s > step for s in at.values()):
                raise fell_behind(
                    f"step {step}: no other producer heard while peers in our topic are at steps up to "
                    f"{max(at.values())}; this replica cannot hear the swarm",
                    max(at.values()),
                )
            near = sorted(
                (p for p, s in at.items() if s >= step - NEAR_STEPS), key=lambda p: leader_rank(step, p)
            )
            if not near:
                self.quiet_until = time.monotonic() + RECHECK_S
                return
            if not waited:
                waited = True
                self.waits += 1
                log.info("round %d: nobody heard, %d peer(s) in step (at %d-%d): waiting for them", step,
                         len(near), min(at[p] for p in near), max(at[p] for p in near))  # fmt: skip
            for peer in near:  # one in step may have sealed this round already
                await ask_manifest(peer)
            if heard():
                return
            left = give_up - time.monotonic()
            if left <= 0:
                log.warning("round %d: %d peer(s) in step but unheard for %.0f s: applying a round of one",
                            step, len(near), wait_s)  # fmt: skip
                return
            changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), min(1.0, left))
