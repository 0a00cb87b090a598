"""How the exchange takes a peer's announcement: who may announce (admission), which round it
opens, and the pull of its frame within the download budget's holds (steps 1-2 of the round's
life in ``swarm.py``'s docstring).

``AsyncSwarmExchange`` inherits these; they are in their own module so that the round's life
cycle stays readable there. Wire form: ``protocol/announce.py``; admission:
``node/swarm/admission.py``; holds: ``node/swarm/budget.Reservations``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from distronet.node.exchange.holdback import HoldBack
from distronet.node.exchange.types import ExchangeConfig, RoundState
from distronet.node.swarm.control import peer_id
from distronet.node.swarm.errors import PullError
from distronet.protocol.announce import Announcement, open_announcement
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.manifest import leader_rank

if TYPE_CHECKING:
    from distronet.node.exchange.base import ExchangeStats
    from distronet.node.swarm.admission import Admission
    from distronet.node.swarm.budget import Reservations
    from distronet.node.swarm.stack import Swarm

__all__ = ["MAX_REFUSED_SHOWN", "Announcements", "FrameCheck"]

log = logging.getLogger(__name__)
MAX_REFUSED_SHOWN = 64  # peers kept in ``refused_peers``

FrameCheck = Callable[[int, bytes, bytes], bool]
"""``(step, producer, frame) -> ok``: whether a pulled frame is a valid packet of that producer
for that step; run in a worker thread before the frame may be listed in a manifest we lead."""


class Announcements:
    """Mixin of ``AsyncSwarmExchange``: what it needs is declared here, set there."""

    swarm: Swarm
    config: ExchangeConfig
    admission: Admission
    rejected: Counter[RejectCode]
    frame_check: FrameCheck | None
    frames_refused: int
    skipped_for_budget: int
    warmup_heard: int
    round_deadline_s: float
    _newest: int
    _stats: ExchangeStats
    _not_admitted: dict[int, set[bytes]]
    refused_peers: dict[bytes, int]
    _subscribed: set[bytes]
    _holds: Reservations
    _early_notes: HoldBack[Announcement]

    def _round(self, step: int, *, local: bool) -> RoundState | None:
        raise NotImplementedError

    def _ahead_of_window(self, step: int) -> bool:
        raise NotImplementedError

    def _on_announcement(self, data: bytes, sender: bytes) -> None:
        ann = open_announcement(data, run_id=self.swarm.run_id, limits=self.config.limits)
        if ann.peer_id != sender:
            raise Rejected(RejectCode.WRONG_PEER, "announcement relayed under another sender")
        self._check_admitted(ann)
        state = self._round(ann.step, local=False)
        if state is None:
            if self._ahead_of_window(ann.step):  # refused now, held in case we get there
                self._early_notes.hold(ann.peer_id, ann.step, ann)
            raise Rejected(
                RejectCode.STALE_STEP, f"announcement for step {ann.step}, window at {self._newest}"
            )
        self._admit(state, ann)

    def _check_admitted(self, ann: Announcement) -> None:
        """Refuse (NOT_ADMITTED, or the credential's own code) an announcement of a producer the
        run's coordinator has not admitted; a no-op when admission is not enforced."""
        if not self.admission.enforced:
            return
        try:
            if ann.credential is None:
                raise Rejected(RejectCode.NOT_ADMITTED, "announcement without a credential")
            self.admission.offer(ann.credential, ann.peer_id)
        except Rejected:
            self._note_refused(ann.peer_id)
            if len(self._not_admitted) < 4 * self.config.retention:
                refused = self._not_admitted.setdefault(ann.step, set())
                if len(refused) < self.config.max_manifest_entries:
                    refused.add(ann.peer_id)
            raise

    def _note_refused(self, peer: bytes) -> None:
        """Count one message of ``peer`` refused as not admitted (``refused_peers``, bounded)."""
        self.refused_peers[peer] = self.refused_peers.pop(peer, 0) + 1  # re-inserted: newest last
        if len(self.refused_peers) > MAX_REFUSED_SHOWN:
            del self.refused_peers[next(iter(self.refused_peers))]

    def _refused(self, step: int) -> set[bytes]:
        """Producers refused as not admitted in ``step`` or the two rounds before it."""
        out: set[bytes] = set()
        for s in (step, step - 1, step - 2):
            out |= self._not_admitted.get(s, set())
        return {p for p in out if not self.admission.admits(p)}

    def _rank(self, step: int, peer: bytes) -> bytes:
        """``peer``'s sort key for leading ``step`` (docs/decisions/leader-rank.md)."""
        return leader_rank(step, peer, self.admission.ticket(peer))

    def _admit(self, state: RoundState, ann: Announcement) -> None:
        """A valid announcement of a round in our window: note it and pull its frame if we can."""
        if not self.admission.admits(ann.peer_id):  # held since, and its credential ran out
            self.rejected[RejectCode.NOT_ADMITTED] += 1
            return
        if ann.peer_id in state.announced:
            self._stats.duplicates_dropped += 1
            return
        if ann.warmup:  # live, but its packet is masked: no pull, no lead, not in any manifest
            state.announced[ann.peer_id] = ann
            state.warm.add(ann.peer_id)
            self.warmup_heard += 1
            state.changed.set()
            return
        if state.frozen:
            self._stats.late_dropped += 1
            state.late.add(ann.peer_id)  # a producer all the same: it may lead the next rounds
            return
        state.announced[ann.peer_id] = ann
        state.changed.set()
        left = state.opened_at + self.round_deadline_s - time.monotonic()
        key = (ann.step, ann.peer_id)  # held against bytes received, one fair share at most
        down, shares = self.swarm.bandwidth.down, len(self._subscribed)
        if not self._holds.admit(down, key, ann.packet_size, left, shares=shares):
            self.skipped_for_budget += 1  # a subset is pulled rather than the budget exceeded
            return
        state.pulls[ann.peer_id] = asyncio.ensure_future(self._pull_announced(state, ann, left))

    async def _pull_announced(self, state: RoundState, ann: Announcement, timeout: float) -> None:
        try:
            await self._pull_announced_inner(state, ann, timeout)
        finally:
            self._holds.release((ann.step, ann.peer_id))
            state.changed.set()  # the round may be complete now

    async def _pull_announced_inner(self, state: RoundState, ann: Announcement, timeout: float) -> None:
        try:
            frame = await self.swarm.puller.fetch(
                peer_id(ann.peer_id), ann.packet_sha256, max_bytes=ann.packet_size, size=ann.packet_size,
                timeout=max(0.1, timeout), step=ann.step,
                progress=lambda n: self._holds.arrived((ann.step, ann.peer_id), n),
            )  # fmt: skip
        except (PullError, Rejected) as e:
            log.info("pull of step %d from %s failed: %s", ann.step, ann.peer_id_b58, e)
            return
        self._stats.count_down(len(frame))
        check = self.frame_check
        if check is not None and not await asyncio.to_thread(check, ann.step, ann.peer_id, frame):
            self.frames_refused += 1  # a valid announcement of an invalid packet: never listed
            log.info("step %d: the frame of %s is not a valid packet of it", ann.step, ann.peer_id_b58)
            return
        if not state.frozen:
            state.frames[ann.peer_id] = (ann.packet_sha256, frame)
