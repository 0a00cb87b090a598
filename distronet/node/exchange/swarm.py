"""The ``Exchange`` over the libp2p swarm: announce → pull → one signed manifest per step.

A round's life at one replica (step ``t``):

1. The round *opens* at the first local sighting of ``t`` (our own publish or a peer's
   announcement). ``publish`` stores our frame for pulling and gossips a signed announcement.
2. Each valid announcement (signature, run, sender = producer) starts a pull from its producer
   right away — if the download budget can carry it before the deadline; otherwise it is
   skipped (a subset is pulled instead of exceeding the budget).
3. At ``open + round_deadline_s`` — or earlier, once the round is *complete* (every peer in the
   announcement topic and every producer of the two rounds before it has announced this one, and
   no pull is still running) — the replica
   freezes what it holds. (A manifest arriving first does not freeze it: a replica that has not
   heard every producer yet could rank the wrong leader first.) The producers it has heard
   of are ranked by ``leader_rank(t, peer)``; the replica at rank ``r`` gossips its manifest
   (the (peer, sha256, size) it holds, itself included) after ``r * manifest_grace_s`` unless a
   better-ranked manifest has already arrived.
4. Every replica adopts the best-ranked valid manifest it receives (at once if it comes from the
   top-ranked producer it knows; else, by ``manifest_wait_s``, it first asks better-ranked
   producers for their manifest directly (``manifest_ask``) — gossip may have lost it — then
   takes the best one), pulls any frame it lacks from the producer, the leader or another
   listed peer, and returns the ``Round``.

**Who may lead.** The producers a replica "knows" for step ``t`` are those it heard in ``t``
*and* every producer it heard in ``t - 1`` or ``t - 2`` (announcements that came after those
rounds froze included). Without the second part, a replica whose deadline passed before a slow
producer's announcement arrived ranked only the producers it had heard, adopted the best of
their manifests at once — while the slow producer, ranking itself first, sealed and applied its
own manifest with one packet more: two accepted sets for one step (seen in shaped runs). Now
every replica waits for (or asks) a recent producer ranked above the manifest it holds.

Replicas that saw the same manifests apply byte-identical accepted sets; one that did not get
the best-ranked leader's manifest within ``manifest_wait_s`` (nor by asking it) can still
diverge, which the daemon's periodic parameter-hash check catches.

**Warm-up masking.** A replica that has just adopted the swarm's state (a newcomer, or one that
resynced) starts with zero momentum; for ``warmup_mask_steps`` steps it still publishes, but its
announcements carry the signed warm-up mark (``protocol.announce``, key ``warm``). Every replica
counts such a producer as live (``warmup_heard``) but neither pulls its frame nor lets it lead:
leaders leave warm-up frames out of their manifest, so the accepted set — and the update every
replica applies — is the same everywhere. The masked replica's optimizer sees its packet not
accepted and keeps what it sent in its momentum (error feedback), which is its warm-up. Only when
every producer of a round is warming up, and no recent producer is still unheard, are their
packets taken as they are.

**Falling behind.** A replica that was paused (SIGSTOP, a laptop lid) wakes up rounds behind the
swarm: its next round has no other producer while valid announcements of its peers are for steps
past its window. ``collect`` then raises ``FellBehind`` (a ``RoundUnavailable``) instead of
applying a round of one, and the daemon adopts the swarm's current state.

**Hearing nobody.** A replica whose gossip delivers nothing (its p2pd starved) hears no producer
but itself while its peers hear it. It stays in the swarm's rounds: the producers it *knows* for
``t`` include those it accepted in ``t - 1`` and ``t - 2``, and before leading a round in which
it heard nobody it asks them for a manifest they may have sealed (``manifest_ask``). When it
knows nobody but itself while peers are in the topic, ``alone.AloneWatch`` asks them their step
before the round is frozen: past it → ``FellBehind``; in step → wait for them; else go on alone.

**A frame nobody holds.** A producer that dies with the leader that listed its frame, before
any other replica pulled it, leaves a manifest no replica can fill. When every listed peer still
reachable answers that it does not hold the frame (``pull.nobody_holds``; a timeout proves
nothing), the round is applied without it — the same set on every replica that answered —
rather than failed swarm-wide. One that got the frame after all diverges; the drift check heals.
A replica left with nobody at all (every source unreachable, no peer in the announcement topic:
the others died together) does the same and trains on alone, as it does in the rounds after
("Hearing nobody": it knows nobody). One that was only cut off for that long does so too.

**Admission.** In a run whose coordinator publishes a key, ``admission`` (``swarm.admission``)
is enforced: an announcement without a valid credential of its producer is dropped
(``NOT_ADMITTED``: never pulled, never listed; its producer is neither ranked nor waited for);
a manifest is adopted only from an admitted leader, and not when it lists a producer refused
here; frames are pulled (and rounds replayed) only from admitted peers; leaders rank by the
coordinator's ticket (``_rank``, docs/decisions/leader-rank.md). Refusals are counted by code
(``rejected``) and by peer (``refused_peers``); the daemon's status shows both. A leader lists a
pulled frame only when ``frame_check`` (the daemon's: ``packet_check``) accepts it. With
``admission`` open (no key: tests, local runs) everything is as before.

``exchange_sync.SwarmExchange`` wraps this async core in the synchronous ``Exchange`` interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from distronet.node.exchange.alone import PROBE_TIMEOUT_S, AloneWatch
from distronet.node.exchange.announced import Announcements, FrameCheck
from distronet.node.exchange.asks import ManifestAsks
from distronet.node.exchange.base import (
    ExchangeError,
    ExchangeStats,
    PeerDead,
    Round,
    RoundUnavailable,
)
from distronet.node.exchange.holdback import HoldBack
from distronet.node.exchange.manifest_ask import (
    MANIFEST_PULL_PROTOCOL,
    request_newest,
)
from distronet.node.exchange.types import ExchangeConfig, FellBehind, RoundState, manifest_topic
from distronet.node.swarm.admission import Admission
from distronet.node.swarm.budget import Reservations
from distronet.node.swarm.control import peer_id
from distronet.node.swarm.errors import PullError, SwarmError
from distronet.node.swarm.pubsub import Gossip, Subscription
from distronet.node.swarm.pull import all_unreachable, nobody_holds
from distronet.node.swarm.servicer import StreamServicer
from distronet.node.swarm.stack import Swarm
from distronet.protocol.announce import Announcement, seal_announcement
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import peer_id_to_b58
from distronet.protocol.limits import DEFAULT_LIMITS, DEFAULT_STREAM_LIMITS, Limits
from distronet.protocol.manifest import (
    Entry,
    RoundManifest,
    may_lead,
    open_manifest,
    seal_manifest,
)
from distronet.protocol.packet import open_packet

__all__ = [
    "MANIFEST_PULL_PROTOCOL",
    "AsyncSwarmExchange",
    "ExchangeConfig",
    "FellBehind",
    "FrameCheck",
    "manifest_topic",
    "packet_check",
]


def packet_check(run_id: str, layout: bytes, limits: Limits = DEFAULT_LIMITS) -> FrameCheck:
    """The daemon's ``FrameCheck``: ``open_packet`` accepts the frame (signature, run, layout),
    and it is signed by the producer for the step. Cost: as ``open_packet`` (one Ed25519 verify)."""

    def check(step: int, producer: bytes, frame: bytes) -> bool:
        try:
            pkt = open_packet(frame, run_id=run_id, layout_digest=layout, limits=limits)
        except Rejected:
            return False
        return pkt.peer_id == producer and pkt.step == step

    return check


log = logging.getLogger(__name__)


class AsyncSwarmExchange(Announcements, ManifestAsks):
    """The exchange's async core on one node's ``Swarm``. Build with :meth:`create`."""

    def __init__(
        self, swarm: Swarm, config: ExchangeConfig, manifests: Gossip, admission: Admission | None = None
    ) -> None:
        self.swarm, self.config, self._manifest_gossip = swarm, config, manifests
        self.admission = admission or Admission(swarm.run_id, None)  # None: open (module doc)
        self.credential: bytes | None = None  # ours, attached to our announcements (daemon sets it)
        self.frame_check: FrameCheck | None = None  # None: frames are listed as pulled (tests)
        self.frames_refused = 0  # pulled frames the check refused: never listed by us
        self._not_admitted: dict[int, set[bytes]] = {}  # step -> producers refused as not admitted
        # peer -> its announcements and manifests refused as not admitted (the latest
        # ``MAX_REFUSED_SHOWN`` peers, newest last: what the daemon's status shows)
        self.refused_peers: dict[bytes, int] = {}
        self._stats = ExchangeStats()
        self._rounds: dict[int, RoundState] = {}
        self._own: set[int] = set()
        self._newest = -1
        self._subs: list[Subscription] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.rejected: Counter[RejectCode] = Counter()
        self.skipped_for_budget = 0
        self.closed_early = 0  # rounds frozen before their deadline: complete
        self.followed = 0  # manifests we sealed with an earlier manifest's entries (we were late)
        self.dead_frames = 0  # manifest frames held by no live peer, applied without
        self._subscribed: set[bytes] = set()  # peers in our announcement topic (refreshed each second)
        self._holds = Reservations(floor=DEFAULT_STREAM_LIMITS.announced_hold_floor_bytes)
        self.round_deadline_s = config.round_deadline_s  # settable; open rounds see a change at once
        self.warmup_until = -1  # our packets for steps below this are published masked (warm-up)
        self.warmup_heard = 0  # warm-up announcements of other producers: live, but masked
        self._early_notes: HoldBack[Announcement] = HoldBack(config.retention)  # past our window
        self._early_manifests: HoldBack[RoundManifest] = HoldBack(config.retention)
        self.alone = AloneWatch(config.alone_rounds)  # rounds of one while peers are in the topic
        self._asks: StreamServicer | None = None  # serves MANIFEST_PULL_PROTOCOL (asks.py)

    def start_warmup(self, step: int) -> int:
        """Publish masked packets for ``step`` .. ``step + warmup_mask_steps - 1``; returns the
        first step whose packet counts again."""
        self.warmup_until = step + self.config.warmup_mask_steps
        return self.warmup_until

    @classmethod
    async def create(
        cls, swarm: Swarm, config: ExchangeConfig | None = None, admission: Admission | None = None
    ) -> AsyncSwarmExchange:
        """Subscribe to the run's announcement and manifest topics and start listening."""
        cfg = config or ExchangeConfig()
        self = cls(swarm, cfg, Gossip(swarm.host, max_message_bytes=64 * 1024), admission)
        self._subs = [
            await swarm.gossip.subscribe(swarm.topic),
            await self._manifest_gossip.subscribe(manifest_topic(swarm.run_id)),
        ]
        self._asks = await self._serve_asks()
        self._spawn(self._listen(self._subs[0], "_on_announcement"))
        self._spawn(self._listen(self._subs[1], "_on_manifest"))
        self._spawn(self._watch_topic())
        return self

    async def _watch_topic(self, every_s: float = 1.0) -> None:
        """Keep ``_subscribed`` (the peers p2pd knows in our announcement topic) about fresh."""
        while True:
            with contextlib.suppress(Exception):
                peers = await self.swarm.gossip.topic_peers(self.swarm.topic)
                self._subscribed = {p.to_bytes() for p in peers}
            await asyncio.sleep(every_s)

    async def _alone_after(self, err: PullError) -> bool:
        """Whether a failed pull leaves us the run's last live peer: every source unreachable
        and nobody left in our announcement topic (module doc, "A frame nobody holds")."""
        with contextlib.suppress(Exception):
            return all_unreachable(err) and not await self.swarm.gossip.topic_peers(self.swarm.topic)
        return False

    @property
    def peer_id(self) -> bytes:
        return self.swarm.identity.peer_id

    @property
    def stats(self) -> ExchangeStats:
        self._stats.bytes_up = self.swarm.bandwidth.up.total_bytes
        return self._stats

    def frame_allowance(self, n_pullers: int, within_s: float) -> int:
        """Largest frame (bytes) our upload budget can serve to ``n_pullers`` peers within
        ``within_s`` seconds — the optimizer lowers k (or sends a subset of tensors) to fit."""
        return self.swarm.bandwidth.up.affordable(within_s) // max(1, n_pullers)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _round(self, step: int, *, local: bool) -> RoundState | None:
        """The round of ``step``, opened if new. Only local calls (publish/collect) move the window;
        gossip may open rounds only inside it (``retention`` back, ``limits.max_step_lead`` ahead),
        so a peer cannot push us forward or make us hold unbounded rounds."""
        state = self._rounds.get(step)
        if state is not None:
            return state
        lead, keep = self.config.limits.max_step_lead, self.config.retention
        if step <= self._newest - keep:
            return None
        if not local and (step > self._newest + lead if self._newest >= 0 else len(self._rounds) >= 2 * keep):
            return None
        state = self._rounds[step] = RoundState(time.monotonic())
        if local and step > self._newest:
            self._newest = step
            for old in [s for s in self._rounds if not step - keep < s <= step + lead]:
                del self._rounds[old]
            for old in [s for s in self._not_admitted if not step - keep < s <= step + lead]:
                del self._not_admitted[old]
            self.swarm.puller.store.evict_before(step - keep + 1)
            self._release_held(step - keep + 1, step + lead)
        return state

    def _ahead_of_window(self, step: int) -> bool:
        return self._newest >= 0 and step > self._newest + self.config.limits.max_step_lead

    def _release_held(self, low: int, high: int) -> None:
        """Hand held announcements and manifests of steps now inside the window to their rounds."""
        for step, _, ann in self._early_notes.take(low, high):
            held = self._rounds.get(step) or self._round(step, local=False)
            if held is not None:
                self._admit(held, ann)
        for step, leader, man in self._early_manifests.take(low, high):
            held = self._rounds.get(step) or self._round(step, local=False)
            if held is not None and held.decided is None:
                held.manifests.setdefault(leader, man)
                held.changed.set()

    async def publish(self, step: int, frame: bytes) -> None:
        """Store our frame for pullers and gossip its announcement (never waits on peers)."""
        if self._closed:
            raise PeerDead("this node has left the swarm")
        if step in self._own:
            raise ExchangeError(f"step {step} already published by this peer")
        state = self._round(step, local=True)
        if state is None:
            raise RoundUnavailable(f"step {step} is older than the retention window")
        self._own.add(step)
        sha = self.swarm.puller.store.put(frame, step)
        state.frames[self.peer_id] = (sha, frame)
        warm = step < self.warmup_until
        if warm:
            state.warm.add(self.peer_id)
        self._stats.packets_up += 1
        self._stats.bytes_up_by_step[step] = len(frame)
        note = seal_announcement(
            self.swarm.identity,
            self.swarm.run_id,
            step,
            frame,
            limits=self.config.limits,
            warmup=warm,
            credential=self.credential,
        )
        self._spawn(self._gossip(self.swarm.gossip, self.swarm.topic, note))

    async def _gossip(self, gossip: Gossip, topic: str, data: bytes) -> None:
        try:
            await gossip.publish(topic, data)
        except SwarmError as e:
            log.warning("gossip publish on %s failed: %s", topic, e)

    async def _listen(self, sub: Subscription, handler: str) -> None:
        async for msg in sub:
            handle: Callable[[bytes, bytes], None] = getattr(self, handler)  # looked up per message
            try:
                handle(msg.data, msg.sender.to_bytes())
            except Rejected as e:
                self.rejected[e.code] += 1

    def leader_of(self, step: int) -> bytes | None:
        """The leader of the manifest this replica adopted for ``step`` (None: not decided here,
        or out of the retention window)."""
        state = self._rounds.get(step)
        return None if state is None or state.adopted is None else state.adopted.leader

    def _open_manifest(self, data: bytes) -> RoundManifest:
        limits = self.config.limits
        return open_manifest(
            data, run_id=self.swarm.run_id, max_entries=self.config.max_manifest_entries,
            max_size=limits.max_frame_bytes,
        )  # fmt: skip

    def _on_manifest(self, data: bytes, sender: bytes) -> None:  # from gossip
        self._accept_manifest(data, sender)

    def _accept_manifest(self, data: bytes, sender: bytes) -> None:
        man = self._open_manifest(data)
        if man.leader != sender:
            raise Rejected(RejectCode.WRONG_PEER, "manifest relayed under another sender")
        if not self.admission.admits(man.leader):
            self._note_refused(man.leader)
            raise Rejected(RejectCode.NOT_ADMITTED, "manifest of a leader not admitted to the run")
        listed = {p for p, _, _ in man.entries}
        if listed & self._not_admitted.get(man.step, set()):
            raise Rejected(RejectCode.NOT_ADMITTED, "manifest lists a producer not admitted to the run")
        state = self._round(man.step, local=False)
        if state is None:
            if self._ahead_of_window(man.step):
                self._early_manifests.hold(man.leader, man.step, man)
            raise Rejected(RejectCode.STALE_STEP, f"manifest for step {man.step}, window at {self._newest}")
        if state.decided is None:
            state.manifests.setdefault(man.leader, man)
            state.changed.set()

    async def collect(self, step: int) -> Round:
        """The accepted set of ``step``; waits for the deadline and the manifest. See module doc."""
        if self._closed:
            raise PeerDead("this node has left the swarm")
        state = self._round(step, local=True)
        if state is None:
            raise RoundUnavailable(f"step {step} is older than the retention window")
        if state.decided is not None:
            return state.decided
        if state.deciding is None:  # concurrent collects of one step share one decision
            state.deciding = asyncio.ensure_future(self._decide(step, state))
        return await asyncio.shield(state.deciding)

    def _expected(self, step: int) -> set[bytes]:
        """The other producers we wait for in ``step``: every peer subscribed to the run's
        announcements and every producer of either of the two rounds before it. Empty (no
        early close: wait for the deadline) unless both of those rounds were decided here, so
        a replica that starts or comes back learns who produces before it closes early."""
        out: set[bytes] = set(self._subscribed)
        for prev in (step - 1, step - 2):
            held = self._rounds.get(prev)
            if held is None or held.decided is None:
                return set()
            out.update(held.announced)
        out.discard(self.peer_id)
        return out - self._refused(step)

    @staticmethod
    def _complete(state: RoundState, expected: set[bytes]) -> bool:
        """Every expected producer announced this round and no pull of it is still running."""
        return (
            bool(expected)
            and expected.issubset(state.announced)
            and all(t.done() for t in state.pulls.values())
        )

    async def _until_frozen(self, step: int, state: RoundState) -> None:
        """Wait for the round's deadline, or less: until it is complete (nothing more is coming
        from the topic's peers and the producers of the last two rounds). Only a producer unknown
        to both loses by an early close (its packet counts from its next round); the manifest
        decides for every replica either way (module doc)."""
        expected = self._expected(step)
        while not self._complete(state, expected):
            left = state.opened_at + self.round_deadline_s - time.monotonic()
            if left <= 0:
                return
            state.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.changed.wait(), left)
        self.closed_early += 1

    async def _decide(self, step: int, state: RoundState) -> Round:
        await self._until_frozen(step, state)
        if state.decided is not None:
            return state.decided
        alone = self._alone(step, state)
        if alone:
            await self.alone.settle(
                step, self._subscribed - {self.peer_id},
                ask_step=lambda p: request_newest(self.swarm.host.control_path, peer_id(p), PROBE_TIMEOUT_S),
                ask_manifest=lambda p: self._ask_manifest(step, p, PROBE_TIMEOUT_S),
                heard=lambda: bool(state.manifests) or self._heard_others(state),
                changed=state.changed, round_deadline_s=self.round_deadline_s, fell_behind=FellBehind,
            )  # fmt: skip
            pending = [t for t in state.pulls.values() if not t.done()]
            if pending:  # someone announced while we waited: let its frame arrive
                await asyncio.wait(pending, timeout=self.round_deadline_s)
        state.frozen = True
        producers = set(state.announced) | set(state.frames)
        if producers <= {self.peer_id}:
            self._check_behind(step)
        unheard = self._recent_producers(step) - producers - state.warm
        eligible = may_lead(producers, state.warm, unheard)
        ranked = sorted((eligible | unheard) - self._refused(step), key=lambda p: self._rank(step, p))
        if producers <= {self.peer_id} and unheard:
            # we heard nobody (gossip may not reach us): a producer we know may have sealed this
            # round already, and leading with our packet alone would then apply another set
            await self._ask_better(step, state, ranked)
        if self.peer_id in eligible:
            self._spawn(self._lead(step, state, ranked.index(self.peer_id)))
        manifest = await self._await_manifest(step, state, ranked)
        state.decided, state.adopted = await self._fill(step, state, manifest), manifest
        self.alone.decided(alone, len(state.decided))
        return state.decided

    def _heard_others(self, state: RoundState) -> bool:
        return bool((set(state.announced) | set(state.frames)) - {self.peer_id})

    def _alone(self, step: int, state: RoundState) -> bool:
        """We know no other producer of this round or of the two before it, and other peers are in
        our announcement topic (module doc, "Hearing nobody")."""
        others = self._subscribed - {self.peer_id}
        return bool(others) and not self._heard_others(state) and not self._recent_producers(step)

    def _recent_producers(self, step: int) -> set[bytes]:
        """The peers that may lead ``step`` although their announcement of it has not reached us
        (yet): every producer heard in the two rounds before it (late ones included) or accepted
        in them, and — while either of those rounds was not decided here (a start, a resync) —
        every peer in our announcement topic."""
        out: set[bytes] = set()
        for prev in (step - 1, step - 2):
            held = self._rounds.get(prev)
            if held is None or held.decided is None:
                out.update(self._subscribed)
            if held is not None:
                out.update(held.announced, held.late)
                if held.decided is not None:  # accepted without being heard: we are deaf to it
                    out.update(held.decided)
        out.discard(self.peer_id)
        return out

    def _check_behind(self, step: int) -> None:
        """Raise ``FellBehind`` when peers announced steps past our window for ``step``."""
        lead = self.config.limits.max_step_lead
        ahead = [s for s in self._early_notes.newest().values() if s > step + lead]
        if ahead:
            raise FellBehind(
                f"step {step}: no other producer in this round while {len(ahead)} peer(s) announce "
                f"steps up to {max(ahead)}; this replica fell behind the swarm",
                max(ahead),
            )

    async def _lead(self, step: int, state: RoundState, position: int) -> None:
        """Seal our manifest for ``step`` after ``position`` grace periods, unless a better-ranked
        one arrived. When a worse-ranked manifest is already here, we are late (the others froze
        and may have adopted it): we seal *its* entries unchanged rather than our own view, so
        whichever of the two a replica adopts, it applies the same accepted set."""
        await asyncio.sleep(position * self.config.manifest_grace_s)
        mine = self._rank(step, self.peer_id)
        if state.decided is not None or any(
            self._rank(step, m.leader) < mine for m in state.manifests.values()
        ):
            return
        entries: list[Entry]
        if state.manifests:
            entries = list(min(state.manifests.values(), key=lambda m: self._rank(step, m.leader)).entries)
            self.followed += 1
        else:
            masked = state.warm if set(state.frames) - state.warm else set()
            entries = [(p, sha, len(fr)) for p, (sha, fr) in state.frames.items() if p not in masked]
        data = seal_manifest(self.swarm.identity, self.swarm.run_id, step, entries)
        state.sealed = data
        state.manifests[self.peer_id] = open_manifest(
            data,
            run_id=self.swarm.run_id,
            max_entries=len(entries),
            max_size=self.config.limits.max_frame_bytes,
        )
        state.changed.set()
        await self._gossip(self._manifest_gossip, manifest_topic(self.swarm.run_id), data)

    async def _await_manifest(self, step: int, state: RoundState, ranked: list[bytes]) -> RoundManifest:
        give_up = time.monotonic() + self.config.manifest_wait_s + len(ranked) * self.config.manifest_grace_s
        while True:
            late = time.monotonic() >= give_up
            if late:  # gossip may have lost the leader's manifest: ask better-ranked producers directly
                await self._ask_better(step, state, ranked)
            if state.manifests:
                best = min(state.manifests.values(), key=lambda m: self._rank(step, m.leader))
                top = min([*ranked, best.leader], key=lambda p: self._rank(step, p))
                if best.leader == top or late:
                    log.info("round %d: manifest of %s (%d entries; %s; heard %d of %d known, %d manifests)",
                             step, peer_id_to_b58(best.leader)[-6:], len(best.entries),
                             "top" if best.leader == top else "late",
                             len(state.announced), len(ranked), len(state.manifests))  # fmt: skip
                    return best
            elif late:
                raise RoundUnavailable(f"step {step}: no manifest arrived (no live producer heard)")
            state.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(state.changed.wait(), max(0.01, give_up - time.monotonic()))

    async def _fill(self, step: int, state: RoundState, manifest: RoundManifest, also: bytes = b"") -> Round:
        """The manifest's frames: held ones as they are, the rest pulled concurrently by hash
        (from the producer, the leader, ``also``, then the other listed peers); a frame nobody
        holds (module doc) is left out."""
        for task in state.pulls.values():  # announced pulls are past their deadline by now
            task.cancel()
        listed = [p for p, _, _ in manifest.entries]

        async def one(peer: bytes, sha: bytes, size: int) -> bytes | None:
            have = state.frames.get(peer)
            if have is not None and have[0] == sha:
                return have[1]
            if have is not None:
                self._stats.repulled += 1  # we hold another frame of this peer: the manifest's wins
            cached = self.swarm.puller.store.get(sha)  # a pull that finished after the freeze
            if cached is not None:
                return cached
            first = [peer, manifest.leader, *([also] if also else [])]
            sources = [
                p
                for p in dict.fromkeys([*first, *listed])
                if p == manifest.leader or self.admission.admits(p)
            ]
            try:
                frame = await self.swarm.puller.pull(
                    sha, [peer_id(p) for p in sources], max_bytes=size, size=size,
                    timeout=self.config.pull_timeout_s, step=step,
                )  # fmt: skip
            except PullError as e:  # a dead frame (module doc, "A frame nobody holds")
                origins = [peer_id_to_b58(p) for p in {peer, manifest.leader} - {self.peer_id}]
                if not (nobody_holds(e, origins) or await self._alone_after(e)):
                    raise
                log.warning("round %d: the frame of %s is held by no live peer: applied without it (%s)",
                            step, peer_id_to_b58(peer)[-6:], e)  # fmt: skip
                self.dead_frames += 1
                return None
            self._stats.count_down(len(frame))
            return frame

        tasks = [asyncio.ensure_future(one(*entry)) for entry in manifest.entries]
        try:
            got = await asyncio.gather(*tasks)
        except PullError as e:
            raise RoundUnavailable(f"step {step}: cannot fetch a manifest frame: {e}") from e
        finally:
            for fetching in tasks:
                fetching.cancel()
        return Round(step, {p: f for p, f in zip(listed, got, strict=True) if f is not None})

    async def close(self) -> None:
        """Stop listening; later calls raise PeerDead. Does not close the swarm itself."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for state in self._rounds.values():
            for pull in state.pulls.values():
                pull.cancel()
            if state.deciding is not None:
                state.deciding.cancel()
        await self._manifest_gossip.close()
        for sub in self._subs:
            await sub.close()
        if self._asks is not None:
            await self._asks.close()
