"""One run's in-memory state: its definition, shards, lease book, nodes (the ledger) and tokens.

Node states: ACTIVE (heard from within ``node_timeout_s``), GONE (timed out; comes back by
itself on its next signed request), LEFT (said goodbye; must join again), EVICTED (by the
operator; refused from then on). The ledger columns (tokens, shards, steps, uptime) only grow
from server-side facts: a completed lease, a receipt signed by another member, the time
between two of the node's own signed requests (capped at the node timeout).
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from distronet.coordinator.leases import LeaseBook
from distronet.protocol.coordinator_api import CREDIT

__all__ = ["ACTIVE", "EVICTED", "GONE", "LEFT", "STATE_NAMES", "NodeRecord", "RunState", "Shard"]

ACTIVE, LEFT, EVICTED, GONE = 1, 2, 3, 4
STATE_NAMES = {ACTIVE: "active", LEFT: "left", EVICTED: "evicted", GONE: "gone"}
RECEIPT_WINDOW = 4096  # steps behind a producer's newest credited step that still earn credit
RECEIPT_LOG = 2048  # receipts a node's record keeps (received_at, step, acceptor) to back its leases


@dataclass(frozen=True, slots=True)
class Shard:
    id: str
    path: str | None
    url: str | None
    sha256: str
    tokens: int
    bytes: int


@dataclass(slots=True)
class NodeRecord:
    """A node's record in one run (the store's ``nodes`` row, less the run id)."""

    peer: str
    state: int
    multiaddrs: list[str]
    agent: str
    joined_at: float
    last_seen: float
    uptime_s: float = 0.0
    tokens: int = 0
    shards: int = 0
    steps: int = 0
    speed: float = 0.0  # credited tokens per second of observed uptime
    last_step: int = 0  # its reported step, clamped (RunState.step_bound)
    credited: set[int] = field(default_factory=set)  # steps credited, within RECEIPT_WINDOW
    max_credited: int = -1
    # the acceptors (up to the run's min_acceptors) that vouched for each credited step
    acceptors: dict[int, set[str]] = field(default_factory=dict)
    # receipts for its packets, oldest first: (received_at, step, acceptor)
    receipt_log: deque[tuple[float, int, str]] = field(default_factory=lambda: deque(maxlen=RECEIPT_LOG))
    spent: set[int] = field(default_factory=set)  # steps that already backed a credited unit
    # its last heartbeat's ``reach`` (connected peers by route, the diagnosis cause); kept in
    # memory only: live state that the next heartbeat refreshes, None until one reports it
    reach: dict[str, Any] | None = None
    # (the multiaddrs list last encoded, its JSON): a row is staged on every node call
    _maddrs_json: tuple[object, str] = field(default=(None, ""), init=False, repr=False, compare=False)

    def row(self, run_id: str) -> tuple[object, ...]:
        src, text = self._maddrs_json
        if src is not self.multiaddrs:  # the list is replaced, never changed in place
            text = json.dumps(self.multiaddrs)
            self._maddrs_json = (self.multiaddrs, text)
        return (
            run_id, self.peer, self.state, text, self.agent, self.joined_at,
            self.last_seen, self.uptime_s, self.tokens, self.shards, self.steps, self.speed, self.last_step,
        )  # fmt: skip

    def public(self) -> dict[str, Any]:
        return {
            "peer_id": self.peer,
            "state": STATE_NAMES[self.state],
            "multiaddrs": self.multiaddrs,
            "agent": self.agent,
            "joined_at": self.joined_at,
            "last_seen": self.last_seen,
            "uptime_s": round(self.uptime_s, 3),
            "tokens": self.tokens,
            "shards": self.shards,
            "steps_acknowledged": self.steps,
            "tokens_per_s": round(self.speed, 3),
            "last_step": self.last_step,
            "reach": self.reach,
        }

    def may_credit(self, step: int, acceptor: str = "", want: int = 1) -> bool:
        """True when a receipt for ``step`` from ``acceptor`` would still count: not too old, and
        the step has fewer than ``want`` acceptors, this one not among them."""
        if step < self.max_credited - RECEIPT_WINDOW:
            return False
        got = self.acceptors.get(step)
        return got is None or (len(got) < want and acceptor not in got)

    def credit_step(self, step: int, acceptor: str = "", now: float = 0.0, want: int = 1) -> bool:
        """Record one receipt (see :meth:`may_credit`); the step's first counts in ``steps``."""
        if not self.may_credit(step, acceptor, want):
            return False
        self.acceptors.setdefault(step, set()).add(acceptor)
        self.receipt_log.append((now, step, acceptor))
        if step in self.credited:
            return True
        self.credited.add(step)
        self.steps += 1
        if step > self.max_credited:
            self.max_credited = step
            if len(self.credited) > 2 * RECEIPT_WINDOW:
                floor = step - RECEIPT_WINDOW
                self.credited = {s for s in self.credited if s >= floor}
                self.acceptors = {s: a for s, a in self.acceptors.items() if s >= floor}
                self.spent = {s for s in self.spent if s >= floor}
        return True

    def forfeit(self) -> None:
        """Lose every credit (the node was caught cheating)."""
        self.tokens = self.shards = self.steps = 0
        self.speed = 0.0
        self.credited, self.acceptors, self.spent = set(), {}, set()
        self.receipt_log.clear()
        self.max_credited = -1
        self.last_step = 0


class RunState:
    """A run: definition (validated CreateRun dict), shards, leases, nodes, join tokens."""

    def __init__(
        self, spec: dict[str, Any], *, shard_root: str | None, created_at: float, state: str
    ) -> None:
        self.spec = spec
        self.id: str = spec["id"]
        self.shard_root = shard_root
        self.created_at = created_at
        self.state = state
        data = spec["data"]
        self.shards = [
            Shard(s["id"], s["path"], s["url"], s["sha256"], s["tokens"], s["bytes"])
            for s in data["manifest"]["shards"]
        ]
        self.shard_index = {s.id: i for i, s in enumerate(self.shards)}
        self.epochs: int = data["epochs"]
        self.max_leases: int = data["max_leases_per_node"]
        self.book = LeaseBook(len(self.shards) * self.epochs, float(data["lease_ttl_s"]))
        self.nodes: dict[str, NodeRecord] = {}
        self.tokens: dict[str, list[float]] = {}  # sha256(token) -> [uses_left, expires_at]
        self.challenges: dict[str, tuple[str, float]] = {}  # challenge -> (peer, expires_at)
        self.node_timeout: float = spec["node_timeout_s"]
        self.heartbeat_interval: float = spec["heartbeat_interval_s"]
        self.credit: dict[str, Any] = spec.get("credit") or CREDIT.validate({}, "credit")
        self.max_step = 0  # the highest clamped step any node reported
        self.max_credited = -1  # the highest step any node has a receipt for
        self.loss_sum = 0.0
        self.loss_n = 0
        self.loss_last_emit = 0.0
        self._tokens_per_epoch = sum(s.tokens for s in self.shards)
        self._live = 0
        self._live_at = -1e18
        self._median_speed = 0.0
        self._median_at = -1e18

    def config_row(self) -> tuple[object, ...]:
        cfg = json.dumps({"spec": self.spec, "shard_root": self.shard_root}, sort_keys=True)
        return (self.id, cfg, self.state, self.created_at)

    @property
    def tokens_total(self) -> int:
        return self._tokens_per_epoch * self.epochs

    def live_count(self, now: float) -> int:
        """Live nodes, counted at most once a second (heartbeats ask for it on every call)."""
        if now - self._live_at >= 1.0:
            self._live = len(self.live_nodes(now))
            self._live_at = now
        return self._live

    def shard_of(self, unit: int) -> tuple[int, Shard]:
        """(epoch, shard) of a unit."""
        epoch, idx = divmod(unit, len(self.shards))
        return epoch, self.shards[idx]

    @staticmethod
    def hash_token(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def live_nodes(self, now: float) -> list[NodeRecord]:
        return [
            n for n in self.nodes.values() if n.state == ACTIVE and now - n.last_seen <= self.node_timeout
        ]

    def step_bound(self, now: float) -> int:
        """The highest step a heartbeat may report: the run's newest receipt-backed step plus
        ``credit.step_slack``, or ``credit.max_step_rate`` steps per second of the run's age if
        that is higher (so a run without receipts still shows progress, at a bounded rate)."""
        c = self.credit
        by_rate = int(c["max_step_rate"] * max(0.0, now - self.created_at))
        return max(self.max_credited + int(c["step_slack"]), by_rate)

    def verified_steps(self, node: NodeRecord, since: float) -> set[int] | None:
        """At least ``credit.min_steps`` unspent steps of ``node`` with receipts received since
        ``since`` from at least ``credit.min_acceptors`` distinct members (never evicted ones)
        in all; None when it has not that much verified work. Cost: the receipts since
        ``since``, newest first, until enough are found (at most RECEIPT_LOG)."""
        need, want = self.credit["min_steps"], self.credit["min_acceptors"]
        steps: list[int] = []  # distinct, newest first
        seen: set[int] = set()
        first_of: dict[str, int] = {}  # acceptor -> the newest usable step it vouched for
        for t, step, acceptor in reversed(node.receipt_log):
            if t < since:
                break
            a = self.nodes.get(acceptor)
            if step in node.spent or a is None or a.state == EVICTED:
                continue
            if step not in seen:
                seen.add(step)
                steps.append(step)
            first_of.setdefault(acceptor, step)
            if len(steps) >= need and len(first_of) >= want:
                # spend what it takes: one step of each of ``want`` acceptors, then the newest
                chosen = set(list(first_of.values())[:want])
                for s in steps:
                    if len(chosen) >= need:
                        break
                    chosen.add(s)
                return chosen
        return None

    def allowance(self, node: NodeRecord, now: float) -> int:
        """How many leases ``node`` may hold at once: 1 until measured, then 2x its speed ratio.

        The ratio is the node's measured tokens/s over the median of the measured live nodes
        (median refreshed at most every 2 s), clamped to [1, max_leases_per_node].
        """
        if node.speed <= 0:
            return 1
        if now - self._median_at > 2.0:
            speeds = [n.speed for n in self.nodes.values() if n.state == ACTIVE and n.speed > 0]
            self._median_speed = statistics.median(speeds) if speeds else 0.0
            self._median_at = now
        if self._median_speed <= 0:
            return 1
        return max(1, min(self.max_leases, int(2 * node.speed / self._median_speed)))
