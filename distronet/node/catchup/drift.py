"""Drift checks: is our replica still bit-identical to the swarm's, and if not, whose state to adopt.

After a step, a node compares its parameter digest of that step with the peers' digests of it
(``digests.ask_digest``: one small request per peer; a peer one step behind answers when it gets
there; its answer is signed, and one that does not verify is no vote). ``digests.state_to_adopt``
gives the verdict every replica reaches alike: of the admitted voters (all, without an admission
check), the largest group of equal digests, ties to the smallest digest, wins if a quorum backs
it; its members keep their state, the others adopt it from them
(``CatchUp.catch_up(donors=...)``, ``resync.py``). A check runs at every step up to
``Replica.verify_until`` (just after catching up, when a newcomer's first packets race rounds
the others may have decided already) and every ``drift_every`` steps, in the background
(:class:`DriftWatch`): a step never waits for the peers' answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from distronet.node.catchup.digests import DigestBoard, ask_digest, state_to_adopt
from distronet.node.catchup.replica import CatchUpStatus
from distronet.node.catchup.statesync import Admitted
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.stack import Swarm, run_peers

__all__ = ["CHECK_TIMEOUT_S", "DriftCount", "DriftWatch", "drift_check"]

log = logging.getLogger(__name__)
ASK_TIMEOUT_S = 5.0  # per peer
CHECK_TIMEOUT_S = 15.0  # a whole check; one that runs out finds nothing

DriftCount = Callable[[str], None]
"""Counts one check's verdict: ``equal``, ``differs``, ``kept`` (ours differs but ranks first)
or ``skipped`` (no peer answered); the daemon's ``drift_checks_total{result}`` metric."""


async def drift_check(
    swarm: Swarm,
    board: DigestBoard,
    done: int,
    status: CatchUpStatus,
    count: DriftCount,
    *,
    quorum: int = 2,
    admitted: Admitted | None = None,
) -> list[PeerID] | None:
    """Compare our digest after step ``done`` (``board``) with the peers' on the run's topic
    (only those ``admitted`` accepts vote; a state is adopted when ``quorum`` voters back it).
    Returns the peers whose state we should adopt (module doc), or None to keep ours. Counts
    the verdict (``status.drift_equal`` / ``drift_differs``, ``count``). Never raises for silent
    or unreachable peers."""
    mine = board.get(done)
    peers = await run_peers(swarm)
    if admitted is not None:
        peers = [p for p in peers if admitted(p.to_bytes())]
    if mine is None or not peers:
        return None
    asks = (ask_digest(swarm.host, p, done, ASK_TIMEOUT_S, run_id=swarm.run_id) for p in peers)
    theirs = await asyncio.gather(*asks)
    known = [d for d in theirs if d is not None]
    log.info("drift check after step %d: %d of %d peers answered, %d equal", done, len(known), len(peers),
             known.count(mine))  # fmt: skip
    if not known:
        count("skipped")
        return None
    donors = state_to_adopt(mine, dict(zip(peers, theirs, strict=True)), quorum=quorum)
    if donors is None:
        if mine in known:
            status.drift_equal += 1
            count("equal")
        else:
            count("kept")
            log.warning("step %d: our parameters differ from all %d peers that answered; ours rank "
                        "first (smallest digest), so we keep them", done, len(known))  # fmt: skip
        return None
    status.drift_differs += 1
    count("differs")
    log.warning("step %d: our parameters differ from the %d of %d answering peers that rank first; "
                "adopting their state", done, len(donors), len(known))  # fmt: skip
    return donors


class DriftWatch:
    """One drift check at a time, in the background; a check that finds drift makes
    :meth:`drifted` return its winners at the next step boundary (unless the replica caught up
    meanwhile, ``status.resyncs`` moved, which makes that check's verdict moot)."""

    def __init__(
        self,
        swarm: Swarm,
        board: DigestBoard,
        status: CatchUpStatus,
        count: DriftCount,
        *,
        quorum: int = 2,
        admitted: Admitted | None = None,
    ) -> None:
        self.swarm, self.board, self.status, self.count = swarm, board, status, count
        self.quorum, self.admitted = quorum, admitted
        self.task: asyncio.Task[list[PeerID] | None] | None = None
        self.resyncs = 0  # status.resyncs when the running check started

    def start(self, done: int) -> None:
        """Check our digest after step ``done`` against the peers', unless a check is running."""
        if self.task is None:
            self.resyncs = self.status.resyncs
            self.task = asyncio.ensure_future(self._check(done))

    async def _check(self, done: int) -> list[PeerID] | None:
        check = drift_check(
            self.swarm, self.board, done, self.status, self.count, quorum=self.quorum, admitted=self.admitted
        )
        return await asyncio.wait_for(check, CHECK_TIMEOUT_S)

    def drifted(self) -> list[PeerID] | None:
        """Once, when the finished check found drift that still applies: the peers to adopt from."""
        if self.task is None or not self.task.done():
            return None
        task, self.task = self.task, None
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result() if self.status.resyncs == self.resyncs else None

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
