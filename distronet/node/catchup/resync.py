"""Catch-up in one place: when a node replays rounds, fetches the swarm's state, or repairs drift.

The whole flow (each box names the module that does it)::

    a newcomer to a running swarm        a failed round (ExchangeError;       a drift check found our
    (before its first step)              FellBehind: paused or cut off)      digest outvoted (drift.py)
         CatchUp.join                     CatchUp.after_failed_round          CatchUp.after_step
              │                                    │                                  │
              └──────────────┬─────────────────────┘                                  │
                             ▼                                                        │
      CatchUp.catch_up: replay the rounds the swarm decided (replay.py:               │
      manifest_ask asks each peer its step, the exchange's replay pulls each          │
      round's accepted frames, DistroOptimizer.apply_replayed applies them)           │
        ├── reached the swarm's step: done, momentum intact (no warm-up)              │
        ├── joining and the swarm at most one step ahead: in step, nothing to do      │
        └── no peer answered, the swarm too far ahead (retention), a round gone       │
                             ▼                                                        ▼
      fetch the state the donors agree on (statesync.fetch_state; asked for the state of one
      step, RENDEZVOUS_AHEAD past the step they vouch for, so donors a step apart meet), load it into a
      fresh optimizer (state.load_state_blob: momentum restarts at zero), offer it as a
      donor in turn (statesync.StateDonor)          [drift: from the winners only, no replay]
                             ▼
      replay again (the swarm moved on during the download); mask our next packets
      (exchange warm-up); drift-check every step up to ``Replica.verify_until`` (drift.py)

Every peer serves its own state on request (``statesync.StateDonor.serve_from`` with
``Replica.snapshot`` and ``Replica.state_at``) and answers digest questions (``digests.DigestBoard``, fed by
:meth:`CatchUp.after_step`). A newcomer tries again while fetching fails (a donor moved on
mid-download), not when the swarm has nothing newer; a node whose round failed tries until
``shutdown_timeout_s`` runs out, then raises :class:`CatchUpError`.

Errors::

    DistroError
    └── CatchUpError    no peer offered a newer state to resync from in time
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from distronet.node.catchup.digests import DigestBoard
from distronet.node.catchup.drift import DriftCount, DriftWatch
from distronet.node.catchup.replay import replay_rounds, vouched_step
from distronet.node.catchup.replica import CatchUpStatus, Replica
from distronet.node.catchup.statesync import Admitted, NoNewerState, StateDonor, StateManifest, fetch_state
from distronet.node.exchange.swarm import AsyncSwarmExchange, FellBehind
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.stack import Swarm, run_peers
from distronet.protocol.errors import ConfigError, DistroError
from distronet.protocol.identity import peer_id_to_b58

__all__ = ["VERIFY_STEPS", "CatchUp", "CatchUpError", "DownloadProgress"]

log = logging.getLogger(__name__)
VERIFY_STEPS = 3  # a node that caught up checks its hash against peers this many steps
REPLAY_S = 20.0  # at most this long replaying before a download
REPLAY_AFTER_S = 10.0  # replaying what the swarm decided during a download
DRIFT_ADOPT_S = 30.0  # fetching the drift check's winning state
RENDEZVOUS_AHEAD = 3
"""A newcomer asks the donors for their state this many steps past the one a quorum of them
vouch for (``statesync``'s rendezvous): far enough that a donor a step ahead of the others has
not passed it by the time the ask arrives, near enough to cost a few steps' wait."""
SWARM_SLACK = RENDEZVOUS_AHEAD + 2
"""Steps a fetched state may be past the step the peers vouch for once its offers are in (they
move on): the rendezvous step always passes (the vouched step does not go back), and so does
an honest offer of now (a donor's state is a step or two past the step it says it opened)."""


class CatchUpError(DistroError):
    """No peer offered a newer state to resync from in time: the node cannot go on."""


class DownloadProgress:
    """Logs a long download's progress at every further 10 % (the owner sees it is moving)."""

    def __init__(self, what: str) -> None:
        self.what, self.shown = what, -1

    def __call__(self, done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth > self.shown and total >= 4 * 2**20:
            self.shown = tenth
            log.info("%s download: %d%% of %.1f MB", self.what, 10 * tenth, total / 1e6)


class CatchUp:
    """A node's catch-up (module doc) over its swarm, exchange, state donor and digest board.

    ``stop`` is the node's stop request: the retries give up once it is set. ``count_drift``
    counts each drift check's verdict (``drift.DriftCount``). ``quorum``: how many distinct
    donors (or drift voters) must agree on a state before it is adopted; ``admitted``: the
    admission check a donor or voter must pass (none: every peer counts);
    docs/decisions/state-quorum.md. ``failed``: the last
    :meth:`catch_up` could not fetch or load a peer's state (a reason to try again).
    """

    def __init__(
        self,
        swarm: Swarm,
        core: AsyncSwarmExchange,
        donor: StateDonor,
        board: DigestBoard,
        replica: Replica,
        status: CatchUpStatus,
        *,
        count_drift: DriftCount,
        stop: asyncio.Event,
        quorum: int = 2,
        admitted: Admitted | None = None,
    ) -> None:
        self.swarm, self.core, self.donor, self.board = swarm, core, donor, board
        self.replica, self.status, self.stop = replica, status, stop
        self.quorum, self.admitted = quorum, admitted
        self.drift = DriftWatch(swarm, board, status, count_drift, quorum=quorum, admitted=admitted)
        self.failed = False

    async def join(self, timeout: float) -> None:
        """Adopt the swarm's state before the first step; try again (within ``timeout``) while
        fetching fails, not when the swarm has nothing newer or we are in step with it."""
        end = time.monotonic() + timeout
        while not await self.catch_up(
            newer_than=self.replica.step, timeout=max(1.0, end - time.monotonic()), joining=True
        ):
            if not self.failed or time.monotonic() >= end or self.stop.is_set():
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.3)

    async def after_failed_round(self, err: Exception, timeout: float) -> None:
        """After a failed round our parameters may differ from the swarm's: adopt its newer state,
        trying for up to ``timeout`` seconds (until a stop request). Raises ``CatchUpError``
        when none came."""
        if isinstance(err, FellBehind):
            self.status.fell_behind += 1
        step = self.replica.step
        log.warning("step %d failed in the exchange (%s); resyncing from peers", step, err)
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.stop.is_set():
            if await self.catch_up(newer_than=self.replica.step, timeout=max(1.0, end - time.monotonic())):
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), 0.5)
        if not self.stop.is_set():
            raise CatchUpError(
                f"step {self.replica.step} failed and no peer offered a newer state to resync from"
            )

    async def after_step(self, step: int, digest: str, drift_every: int) -> None:
        """At the boundary after step ``step`` (parameter digest ``digest``, hex): serve the digest
        to the peers' drift checks; adopt the state a finished check of ours says to (its
        winners: a newcomer's first packets race rounds the others may have decided already,
        and the exchange can then hand it another accepted set); start the next check when one
        is due (every step up to ``verify_until``, and every ``drift_every`` steps)."""
        self.board.record(step, bytes.fromhex(digest))
        donors = self.drift.drifted()
        if donors and not self.stop.is_set():
            with contextlib.suppress(Exception):  # a failed repair leaves the next check to try again
                await self.catch_up(
                    newer_than=self.replica.step - 1,
                    timeout=DRIFT_ADOPT_S,
                    donors=donors,
                    max_step=self.replica.step + SWARM_SLACK,  # the winners' state: our step, or a step on
                )
        now = self.replica.step
        if now <= self.replica.verify_until or (drift_every and now % drift_every == 0):
            self.drift.start(now - 1)

    async def catch_up(
        self,
        *,
        newer_than: int,
        timeout: float,
        donors: Sequence[PeerID] | None = None,
        joining: bool = False,
        max_step: int | None = None,
    ) -> bool:
        """Adopt the newest state the peers agree on if its step is > ``newer_than``; True if the
        replica moved (adopted, or replayed up to the swarm's step).

        ``donors``: fetch only from these peers (the drift check's winning group: our state
        differs, so no replay); default: the run's peers (``stack.run_peers``: the topic's, less
        relays, plus those reached only through one), and a node a few rounds
        behind replays them instead (``joining``: a swarm at most one step ahead is in step with
        us, nothing is downloaded). Only a state a quorum of the donors agree on, at most
        ``max_step``, is adopted (``statesync.choose_root``). A downloaded state restarts momentum at zero
        (ARCHITECTURE.md §5). Raises nothing for a swarm that has no newer state; the exchange
        is reused as it is.
        """
        self.failed = False
        replay = donors is None
        if donors is None:
            donors = await run_peers(self.swarm)
        if not donors:
            return False
        peers = [p.to_bytes() for p in donors]
        if replay:
            replayed = await self._replay(peers, min(timeout, REPLAY_S))
            if replayed or (replayed is False and joining):
                return bool(replayed)
            newer_than = max(newer_than, self.replica.step)  # rounds replayed before it stopped count
        bound = (lambda: self._bound(peers)) if replay else None  # asked once the offers are in
        at = await self._meeting_step(peers) if replay else 0
        got = await self._fetch(donors, newer_than, timeout, max_step, bound, at)
        if got is None or not await self._adopt(got[1]):
            return False
        if replay:  # the swarm moved on during the download
            await self._replay(peers, REPLAY_AFTER_S)
        self.status.resyncs += 1
        self.status.resync_steps.append(self.replica.step)  # where it resumes, with momentum at zero
        self.status.state_donors.append(peer_id_to_b58(got[0].peer_id))
        self.replica.verify_until = self.replica.step + VERIFY_STEPS
        # zero momentum: our next packets are masked warm-up packets
        self.status.warmup_until = self.core.start_warmup(self.replica.step)
        return True

    async def _replay(self, peers: list[bytes], timeout: float) -> bool | None:
        """Replay (``replay.py``): True when rounds were replayed up to the swarm's step (counted
        in ``status.resyncs``, so a drift check begun before it is void; the replica's hash is
        checked against peers for ``VERIFY_STEPS`` steps), False when the swarm is at most one
        step past ours (we are in step: nothing to replay or download), None when a state must
        be downloaded instead (``replica.step`` has moved if some rounds were replayed first)."""
        was = self.replica.step
        got = await replay_rounds(self.replica, self.core, peers, timeout)
        if got is None:
            return None
        if not got.rounds:
            return False if got.tip and got.swarm_step <= was + 1 else None
        log.info("%s: replayed rounds %d-%d the swarm decided, now at step %d (was at %d)",
                 "caught up" if got.tip else "partly caught up", got.first, got.first + got.rounds - 1,
                 self.replica.step, was)  # fmt: skip
        self.status.resyncs += 1
        self.status.replayed_rounds += got.rounds
        self.replica.verify_until = self.replica.step + VERIFY_STEPS
        return True if got.tip else None

    async def _bound(self, peers: list[bytes]) -> int | None:
        """The newest step a state may have: ``SWARM_SLACK`` past the step a quorum of the
        (admitted) peers say they have opened; None when none answered."""
        if self.admitted is not None:
            peers = [p for p in peers if self.admitted(p)]
        vouched = await vouched_step(self.core, peers, self.quorum)
        return None if vouched is None else max(vouched, 0) + SWARM_SLACK

    async def _meeting_step(self, peers: list[bytes]) -> int:
        """The step to ask the donors' state of (``RENDEZVOUS_AHEAD`` past the step a quorum of
        the admitted peers have opened), or 0 (each donor's state of now) when none answered."""
        if self.admitted is not None:
            peers = [p for p in peers if self.admitted(p)]
        vouched = await vouched_step(self.core, peers, self.quorum)
        return 0 if vouched is None else max(vouched, 0) + RENDEZVOUS_AHEAD

    async def _fetch(
        self,
        donors: Sequence[PeerID],
        newer_than: int,
        timeout: float,
        max_step: int | None,
        bound: Callable[[], Awaitable[int | None]] | None,
        at: int = 0,
    ) -> tuple[StateManifest, bytes] | None:
        """The manifest and state blob a quorum of the donors agree on if its step is >
        ``newer_than`` (and at most ``max_step`` and ``bound()``, asked after the offers came:
        ``statesync.fetch_state``), or None (none newer; or no quorum, or none could be fetched:
        ``failed``)."""
        try:
            manifest, blob = await fetch_state(
                self.swarm,
                donors,
                timeout=timeout,
                per_donor=2,
                progress=DownloadProgress("state"),
                newer_than=newer_than,
                quorum=self.quorum,
                admitted=self.admitted,
                max_step=max_step,
                bound=bound,
                at=at,
            )
        except NoNewerState:
            return None
        except (SwarmError, asyncio.TimeoutError) as e:
            log.info("no state to catch up from%s: %s", f" (asked for step {at}'s)" if at else "", e)
            self.failed = True
            return None
        return (manifest, blob) if manifest.step > newer_than else None

    async def _adopt(self, blob: bytes) -> bool:
        """Load ``blob`` into a fresh optimizer and train on from its step, then offer it to
        other peers; False (``failed``) when it does not fit this run's model."""
        from distronet.node.catchup.state import load_state_blob  # imports torch (loaded by now)

        fresh = self.replica.fresh_optimizer()
        async with self.replica.lock:  # no state snapshot of a half-loaded model
            try:
                step = await asyncio.to_thread(load_state_blob, blob, self.replica.model, fresh)
            except ConfigError as e:
                log.warning("a peer's state does not fit this run's model: %s", e)
                self.failed = True
                return False
            log.info("caught up: adopted the swarm's state at step %d (was at %d)", step, self.replica.step)
            self.replica.use(fresh, step)
            await self.replica.boundary()
        self.donor.offer(step, blob)
        return True
