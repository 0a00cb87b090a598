"""The coordinator's operations on its in-memory state, each staging the rows it changes.

Every mutating method is synchronous: it checks, changes memory, stages rows on the group
committer and schedules its events after the commit. The HTTP layer then awaits
``committer.durable()`` before answering, so nothing is acknowledged before it is on disk.
``now`` is injectable so tests can drive time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distronet.coordinator.bootstrap import spread
from distronet.coordinator.events import EventBus
from distronet.coordinator.groupcommit import GroupCommitter
from distronet.coordinator.leases import DONE, LEASED, Unit
from distronet.coordinator.runs import ACTIVE, EVICTED, GONE, LEFT, NodeRecord, RunState
from distronet.coordinator.store import Snapshot
from distronet.protocol import identity
from distronet.protocol.coordinator_api import (
    API_PREFIX,
    ApiError,
    ApiErrorCode,
    join_message,
    receipt_message,
)
from distronet.protocol.credential import credential_ticket, seal_credential

__all__ = ["Coordinator", "load_signing_key"]

_RNG = random.SystemRandom()


CHALLENGE_TTL = 120.0
MAX_CHALLENGES = 100_000
LOSS_EMIT_EVERY = 0.5


def load_signing_key(path: Path) -> identity.Identity:
    """The coordinator's credential key in ``path``, made (0600) when the file does not exist.
    Raises IdentityError when it cannot be read or written."""
    if path.exists():
        return identity.Identity.load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = identity.Identity.generate()
    key.save(path)
    return key


class Coordinator:
    """All runs, with their leases and ledgers. Not thread-safe: one event loop owns it."""

    def __init__(
        self, committer: GroupCommitter, events: EventBus, *, clock: Callable[[], float] = time.time
    ):
        self.committer = committer
        self.events = events
        self.clock = clock
        self.runs: dict[str, RunState] = {}
        self.counters: dict[str, int] = {
            "leases_issued": 0, "leases_expired": 0, "shards_completed": 0, "receipts_accepted": 0,
            "receipts_rejected": 0, "joins": 0,
        }  # fmt: skip
        self.signer: identity.Identity | None = None  # signs membership credentials when set
        self.credential_ttl_s = 600.0
        self._ticket_secret = b""
        self._credentials: dict[tuple[str, str], tuple[str, float]] = {}  # (run, peer) -> (b64, renew at)

    def set_signer(self, signer: identity.Identity, credential_ttl_s: float) -> None:
        """Issue membership credentials signed by ``signer``, each valid ``credential_ttl_s``."""
        self.signer, self.credential_ttl_s = signer, credential_ttl_s
        self._ticket_secret = hashlib.sha256(b"distronet/ticket-secret\x00" + signer.to_bytes()).digest()
        self._credentials.clear()

    def credential(self, run: RunState, node: NodeRecord) -> str | None:
        """A fresh credential (base64) for an active ``node``; None without a signer or for a
        node that left or was evicted. Reissued once half its lifetime has passed, so most
        heartbeats cost no signature."""
        if self.signer is None or node.state in (LEFT, EVICTED):
            return None
        now = self.clock()
        held = self._credentials.get((run.id, node.peer))
        if held is not None and now < held[1]:
            return held[0]
        pid = identity.peer_id_from_b58(node.peer)
        ttl = max(1, int(self.credential_ttl_s))
        raw = seal_credential(
            self.signer, run.id, pid, issued_at=int(now), lifetime_s=ttl,
            ticket=credential_ticket(self._ticket_secret, run.id, pid),
        )  # fmt: skip
        b64 = base64.b64encode(raw).decode()
        self._credentials[(run.id, node.peer)] = (b64, now + ttl / 2)
        return b64

    # ---------------------------------------------------------------- restore

    def restore(self, snap: Snapshot) -> None:
        """Rebuild memory from a store snapshot (call once, before serving)."""
        for rid, cfg, state, created in snap.tables["runs"]:
            c = json.loads(cfg)
            self.runs[rid] = RunState(c["spec"], shard_root=c["shard_root"], created_at=created, state=state)
        units: dict[str, list[Unit]] = {}
        for rid, n, st, tok, holder, la, exp, cb, ca, issues in snap.tables["units"]:
            units.setdefault(rid, []).append(Unit(int(n), int(st), tok, holder, la, exp, cb, ca, int(issues)))
        for rid, lst in units.items():
            if rid in self.runs:
                self.runs[rid].book.restore(lst)
        for row in snap.tables["nodes"]:
            rid, peer, st, maddrs, agent, joined, seen, up, tok, sh, steps, speed, last = row
            run = self.runs.get(rid)
            if run is not None:
                node = NodeRecord(
                    peer, int(st), json.loads(maddrs), agent, joined, seen, up, int(tok), int(sh)
                )
                node.steps, node.speed, node.last_step = int(steps), float(speed), int(last)
                run.nodes[peer] = node
                run.max_step = max(run.max_step, node.last_step)
        for rid, producer, step, acc, _h, t in sorted(snap.tables["receipts"], key=lambda r: r[5]):
            run = self.runs.get(rid)
            prod = run.nodes.get(producer) if run is not None else None
            if run is not None and prod is not None:
                prod.credited.add(int(step))
                prod.acceptors.setdefault(int(step), set()).add(acc)
                prod.receipt_log.append((float(t), int(step), acc))
                prod.max_credited = max(prod.max_credited, int(step))
                run.max_credited = max(run.max_credited, int(step))
        for rid, th, uses, exp in snap.tables["join_tokens"]:
            if rid in self.runs:
                self.runs[rid].tokens[th] = [float(uses), float(exp)]

    # ---------------------------------------------------------------- runs (operator)

    def create_run(self, spec: dict[str, Any], *, shard_root: str | None = None) -> tuple[RunState, bool]:
        """Create a run from a validated CreateRun dict; ``(run, False)`` if an identical one exists.

        Raises ApiError(CONFLICT) when a run with this id exists with another definition.
        """
        old = self.runs.get(spec["id"])
        if old is not None:
            if old.spec == spec and old.shard_root == shard_root:
                return old, False
            raise ApiError(ApiErrorCode.CONFLICT, f"run {spec['id']!r} exists with another definition")
        run = RunState(spec, shard_root=shard_root, created_at=self.clock(), state="open")
        self.runs[run.id] = run
        self.committer.put("runs", run.config_row())
        self._emit(run.id, "run_created", units=run.book.n_units)
        return run, True

    def run(self, run_id: str) -> RunState:
        run = self.runs.get(run_id)
        if run is None:
            raise ApiError(ApiErrorCode.NOT_FOUND, f"no run {run_id[:64]!r}")
        return run

    def set_run_state(self, run: RunState, state: str) -> None:
        run.state = state
        self.committer.put("runs", run.config_row())

    def create_join_tokens(self, run: RunState, count: int, uses: int, expires_in: float) -> list[str]:
        """Mint ``count`` join tokens (shown once; stored hashed)."""
        out = []
        exp = self.clock() + expires_in
        for _ in range(count):
            tok = secrets.token_urlsafe(24)
            th = run.hash_token(tok)
            run.tokens[th] = [float(uses), exp]
            self.committer.put("join_tokens", (run.id, th, uses, exp))
            out.append(tok)
        return out

    def evict(self, run: RunState, peer: str, reason: str) -> NodeRecord:
        """Evict ``peer`` and take back its credit: tokens, shards and steps are zeroed, and the
        receipts it signed no longer back anyone's leases (verified_steps skips evicted acceptors)."""
        node = run.nodes.get(peer)
        if node is None:
            raise ApiError(ApiErrorCode.NOT_FOUND, f"no node {peer[:64]} in run {run.id}")
        node.state = EVICTED
        self._credentials.pop((run.id, peer), None)
        self._release(run, node)
        forfeited = node.tokens
        node.forfeit()
        self.committer.put("nodes", node.row(run.id))
        self._emit(run.id, "peer_evicted", peer_id=peer, reason=reason, forfeited_tokens=forfeited)
        return node

    # ---------------------------------------------------------------- admission

    def challenge(self, run: RunState, peer: str) -> tuple[str, float]:
        """A fresh challenge for ``peer`` to sign (memory only; valid CHALLENGE_TTL seconds)."""
        now = self.clock()
        if len(run.challenges) >= MAX_CHALLENGES:
            run.challenges = {c: v for c, v in run.challenges.items() if v[1] > now}
            if len(run.challenges) >= MAX_CHALLENGES:
                raise ApiError(ApiErrorCode.RATE_LIMITED, "too many admissions in flight; retry shortly")
        ch = secrets.token_urlsafe(24)
        run.challenges[ch] = (peer, now + CHALLENGE_TTL)
        return ch, now + CHALLENGE_TTL

    def join(self, run: RunState, req: dict[str, Any]) -> dict[str, Any]:
        """Admit a node that signed its challenge (and shows a join token when the run needs one)."""
        now = self.clock()
        peer = req["peer_id"]
        entry = run.challenges.pop(req["challenge"], None)
        if entry is None or entry[0] != peer or entry[1] < now:
            raise ApiError(ApiErrorCode.CHALLENGE_EXPIRED, "unknown or expired challenge: request a new one")
        try:
            pid = identity.peer_id_from_b58(peer)
        except ValueError as e:
            raise ApiError(ApiErrorCode.BAD_SIGNATURE, str(e), field="body.peer_id") from None
        from distronet.protocol.coordinator_api import b64decode_sig

        sig = b64decode_sig(req["signature"])
        if not identity.verify(pid, join_message(run.id, peer, req["challenge"]), sig):
            raise ApiError(
                ApiErrorCode.BAD_SIGNATURE, "the challenge signature does not verify for this peer id"
            )
        if run.state != "open":
            raise ApiError(ApiErrorCode.RUN_CLOSED, f"run {run.id} is {run.state}")
        node = run.nodes.get(peer)
        if node is not None and node.state == EVICTED:
            raise ApiError(ApiErrorCode.EVICTED, "this peer was evicted from the run by its operator")
        if run.spec["admission"]["policy"] == "token" and (node is None or node.state == LEFT):
            self._use_token(run, req.get("join_token"), now)
        if node is None:
            node = NodeRecord(peer, ACTIVE, req["multiaddrs"], req["agent"], now, now)
            run.nodes[peer] = node
        else:
            node.state, node.multiaddrs, node.agent, node.last_seen = (
                ACTIVE,
                req["multiaddrs"],
                req["agent"],
                now,
            )
        self.committer.put("nodes", node.row(run.id))
        self.counters["joins"] += 1
        self._emit(run.id, "peer_joined", peer_id=peer, multiaddrs=node.multiaddrs)
        out = {
            "node": node.public(),
            "bootstrap_peers": self.bootstrap(run, exclude=peer),
            "relays": list(run.spec.get("relays") or []),
            "run": self.run_public(run),
            "heartbeat_interval_s": run.heartbeat_interval,
            "max_leases": run.allowance(node, now),
        }
        cred = self.credential(run, node)
        if cred is not None:
            out["credential"] = cred
        return out

    def _use_token(self, run: RunState, token: str | None, now: float) -> None:
        if token is None:
            raise ApiError(ApiErrorCode.BAD_JOIN_TOKEN, "this run needs a join token: ask its operator")
        th = run.hash_token(token)
        entry = run.tokens.get(th)
        if entry is None or entry[0] < 1 or entry[1] < now:
            raise ApiError(ApiErrorCode.BAD_JOIN_TOKEN, "join token unknown, used up or expired")
        entry[0] -= 1
        self.committer.put("join_tokens", (run.id, th, int(entry[0]), entry[1]))

    def bootstrap(self, run: RunState, *, exclude: str = "", limit: int = 16) -> list[dict[str, Any]]:
        """Up to ``limit`` live peers with multiaddrs, spread over networks (docs/protocol.md §11):
        one per /16 (IPv4) or /48 (IPv6) network first, then one per further IP address, then
        the rest, each round in random order, so Sybils crowded on one network cannot fill the
        list. Evicted, left and silent peers are never listed."""
        live = [n for n in run.live_nodes(self.clock()) if n.peer != exclude and n.multiaddrs]
        return [{"peer_id": n.peer, "multiaddrs": n.multiaddrs} for n in spread(live, limit, _RNG)]

    def node_for(self, run: RunState, peer: str) -> NodeRecord:
        """The admitted node behind a signed request; accounts its uptime. Raises ApiError(403)."""
        node = run.nodes.get(peer)
        if node is None or node.state == LEFT:
            raise ApiError(ApiErrorCode.NOT_ADMITTED, f"peer has not joined run {run.id}: join first")
        if node.state == EVICTED:
            raise ApiError(ApiErrorCode.EVICTED, "this peer was evicted from the run by its operator")
        now = self.clock()
        gap = now - node.last_seen
        if node.state == GONE:
            node.state = ACTIVE
            self._emit(run.id, "peer_joined", peer_id=peer, multiaddrs=node.multiaddrs, returned=True)
        elif 0 < gap <= run.node_timeout:
            node.uptime_s += gap
        node.last_seen = max(node.last_seen, now)
        return node

    # ---------------------------------------------------------------- leases

    def lease(self, run: RunState, node: NodeRecord, want: int) -> dict[str, Any]:
        """Up to ``want`` new leases, within the node's allowance. Stages the node row too.

        ``want == 0`` leases nothing and lists every lease the node holds (``held``), so a node
        that restarted, or lost an answer, can recover the leases the coordinator credits it with.
        """
        now = self.clock()
        self._expire(run, now)
        out = []
        if run.state == "open":
            room = run.allowance(node, now) - run.book.held_by(node.peer)
            for _ in range(max(0, min(want, room))):
                u = run.book.issue(node.peer, now)
                if u is None:
                    break
                self.committer.put("units", u.row(run.id))
                out.append(self.lease_public(run, u))
            self.counters["leases_issued"] += len(out)
        self.committer.put("nodes", node.row(run.id))
        held = sorted(run.book.held.get(node.peer, ()))
        return {
            "leases": out,
            "held": [self.lease_public(run, run.book.units[n]) for n in held] if want == 0 else len(held),
            "exhausted": run.book.remaining == 0,
            "max_leases": run.allowance(node, now),
        }

    def lease_public(self, run: RunState, u: Unit) -> dict[str, Any]:
        epoch, shard = run.shard_of(u.unit)
        url = shard.url if shard.url is not None else f"{API_PREFIX}/runs/{run.id}/shards/{shard.id}"
        return {
            "unit": u.unit,
            "epoch": epoch,
            "shard_id": shard.id,
            "lease_token": u.token,
            "expires_at": u.expires_at,
            "tokens": shard.tokens,
            "bytes": shard.bytes,
            "sha256": shard.sha256,
            "url": url,
        }

    def renew(self, run: RunState, node: NodeRecord, unit: int, token: str) -> dict[str, Any]:
        now = self.clock()
        self._expire(run, now)
        u = run.book.renew(unit, token, node.peer, now)
        self.committer.put("units", u.row(run.id))
        self.committer.put("nodes", node.row(run.id))
        return {"unit": unit, "expires_at": u.expires_at}

    def complete(self, run: RunState, node: NodeRecord, unit: int, token: str) -> dict[str, Any]:
        """Complete a lease; credits the node's ledger at most once per unit, and only for
        verified work (docs/decisions/verified-credit.md): ``credit.min_steps`` steps of its
        own with receipts received since the lease was issued. Without them the unit goes back
        to the queue, first in line, and the answer says ``credited: false``."""
        now = self.clock()
        self._expire(run, now)
        u = run.book.get(unit)
        _, shard = run.shard_of(unit)
        backing: set[int] | None = set()
        if run.credit["min_steps"] > 0 and u.state == LEASED and u.token == token and u.holder == node.peer:
            assert u.leased_at is not None
            backing = run.verified_steps(node, u.leased_at)
            if backing is None:
                run.book.give_back(unit, token, node.peer)
                self.committer.put("units", u.row(run.id))
                self.committer.put("nodes", node.row(run.id))
                self._emit(run.id, "shard_unverified", peer_id=node.peer, unit=unit, shard_id=shard.id)
                return {"unit": unit, "credited": False, "tokens": 0}
        u, credited = run.book.complete(unit, token, node.peer, now)
        if credited:
            node.spent |= backing or set()
            node.tokens += shard.tokens
            node.shards += 1
            node.speed = node.tokens / max(node.uptime_s, run.heartbeat_interval)
            self.counters["shards_completed"] += 1
            self.committer.put("units", u.row(run.id))
            self._emit(run.id, "shard_completed", peer_id=node.peer, unit=unit, shard_id=shard.id)
        self.committer.put("nodes", node.row(run.id))
        return {"unit": unit, "credited": credited, "tokens": shard.tokens if credited else 0}

    def heartbeat(self, run: RunState, node: NodeRecord, req: dict[str, Any]) -> dict[str, Any]:
        """Liveness, step and loss; renews every lease the node holds."""
        now = self.clock()
        self._expire(run, now)
        step = min(req["step"], run.step_bound(now))  # a claim never outruns what is observed
        node.last_step = max(node.last_step, step)
        if req["multiaddrs"] is not None:
            node.multiaddrs = req["multiaddrs"]
        if req["reach"] is not None:
            node.reach = req["reach"]
        renewed = 0
        for n in sorted(run.book.held.get(node.peer, ())):
            u = run.book.units[n]
            assert u.token is not None
            run.book.renew(n, u.token, node.peer, now)
            self.committer.put("units", u.row(run.id))
            renewed += 1
        self.committer.put("nodes", node.row(run.id))
        if step > run.max_step:
            run.max_step = step
            self._emit(run.id, "step_progress", step=run.max_step, peer_id=node.peer)
        if req["loss"] is not None:
            run.loss_sum += req["loss"]
            run.loss_n += 1
            if now - run.loss_last_emit >= LOSS_EMIT_EVERY:
                self._emit(
                    run.id, "loss", step=run.max_step, loss=run.loss_sum / run.loss_n, reports=run.loss_n
                )
                run.loss_sum, run.loss_n, run.loss_last_emit = 0.0, 0, now
        out: dict[str, Any] = {"renewed": renewed, "peers_live": run.live_count(now), "step": run.max_step}
        cred = self.credential(run, node)
        if cred is not None:
            out["credential"] = cred
        return out

    def receipts(
        self, run: RunState, submitter: NodeRecord, receipts: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Credit producers for steps that another member signed as accepted.

        Cost: one Ed25519 verify per receipt that would count; once a step has receipts from
        ``credit.min_acceptors`` distinct acceptors, further ones are answered as duplicates
        without verifying, so the many acceptors of one packet cost at most that many verifies.
        """
        now = self.clock()
        want = run.credit["min_acceptors"]
        accepted = duplicate = 0
        rejected: list[dict[str, Any]] = []
        for i, r in enumerate(receipts):
            why = self._receipt_form_problem(run, r)
            producer = run.nodes.get(r["producer"])
            if (
                why is None
                and producer is not None
                and not producer.may_credit(r["step"], r["acceptor"], want)
            ):
                duplicate += 1
                continue
            if why is None and not self._receipt_signed(run, r):
                why = "bad_signature"
            if why is not None or producer is None:
                rejected.append({"index": i, "code": why or "not_member"})
                continue
            producer.credit_step(r["step"], r["acceptor"], now, want)
            if len(producer.acceptors.get(r["step"], ())) >= want:  # fully vouched for
                run.max_credited = max(run.max_credited, r["step"])
            accepted += 1
            row = (run.id, producer.peer, r["step"], r["acceptor"], r["payload_sha256"], now)
            self.committer.put("receipts", row)
            self.committer.put("nodes", producer.row(run.id))
        self.counters["receipts_accepted"] += accepted
        self.counters["receipts_rejected"] += len(rejected)
        self.committer.put("nodes", submitter.row(run.id))
        return {"accepted": accepted, "duplicate": duplicate, "rejected": rejected}

    def _receipt_form_problem(self, run: RunState, r: dict[str, Any]) -> str | None:
        if r["producer"] == r["acceptor"]:
            return "self_receipt"
        for who in (r["producer"], r["acceptor"]):
            n = run.nodes.get(who)
            if n is None or n.state in (LEFT, EVICTED):
                return "not_member"
        if r["step"] > run.max_step + 1000:
            return "future_step"
        return None

    @staticmethod
    def _receipt_signed(run: RunState, r: dict[str, Any]) -> bool:
        from distronet.protocol.coordinator_api import b64decode_sig

        try:
            pid = identity.peer_id_from_b58(r["acceptor"])
            sig = b64decode_sig(r["signature"])
        except (ValueError, ApiError):
            return False
        return identity.verify(
            pid, receipt_message(run.id, r["step"], r["producer"], r["payload_sha256"]), sig
        )

    def leave(self, run: RunState, node: NodeRecord) -> dict[str, Any]:
        node.state = LEFT
        self._credentials.pop((run.id, node.peer), None)
        released = self._release(run, node)
        self.committer.put("nodes", node.row(run.id))
        self._emit(run.id, "peer_left", peer_id=node.peer, reason="leave")
        return {"released": released}

    def _release(self, run: RunState, node: NodeRecord) -> int:
        units = run.book.release(node.peer)
        for u in units:
            self.committer.put("units", u.row(run.id))
        return len(units)

    # ---------------------------------------------------------------- time

    def _expire(self, run: RunState, now: float) -> None:
        for u in run.book.expire_due(now):
            self.committer.put("units", u.row(run.id))
            self.counters["leases_expired"] += 1
            self._emit(run.id, "lease_expired", unit=u.unit)

    def sweep(self) -> None:
        """Expire due leases and mark silent nodes GONE (call about once a second)."""
        now = self.clock()
        for run in self.runs.values():
            self._expire(run, now)
            for node in run.nodes.values():
                if node.state == ACTIVE and now - node.last_seen > run.node_timeout:
                    node.state = GONE
                    self.committer.put("nodes", node.row(run.id))
                    self._emit(run.id, "peer_left", peer_id=node.peer, reason="timeout")

    def _emit(self, run_id: str, type_: str, **data: Any) -> None:
        def publish() -> None:
            self.events.publish(run_id, type_, **data)

        self.committer.after_commit(publish)

    # ---------------------------------------------------------------- views

    def run_public(self, run: RunState) -> dict[str, Any]:
        """What `distro-node join` reads: the run's definition (manifest summarised) and progress."""
        s = run.spec
        data = s["data"]
        now = self.clock()
        return {
            "id": run.id,
            "state": run.state,
            "created_at": run.created_at,
            "model": s["model"],
            "optimizer": s["optimizer"],
            "exchange": s["exchange"],
            "bandwidth": s["bandwidth"],
            "admission": s["admission"],
            "coordinator_key": self.signer.peer_id_b58 if self.signer is not None else None,
            "heartbeat_interval_s": run.heartbeat_interval,
            "node_timeout_s": run.node_timeout,
            "data": {
                "tokenizer": data["manifest"]["tokenizer"],
                "dtype": data["manifest"]["dtype"],
                **{  # version 2 manifests (a tokenizers JSON file): what nodes check shards against
                    k: data["manifest"][k]
                    for k in ("vocab_size", "eos_id", "tokenizer_sha256")
                    if data["manifest"].get(k) is not None
                },
                "shards": len(run.shards),
                "epochs": run.epochs,
                "tokens": run.tokens_total,
                "lease_ttl_s": run.book.ttl,
                "max_leases_per_node": run.max_leases,
            },
            "progress": {
                "units": run.book.n_units,
                "done": run.book.done,
                "leased": run.book.leased,
                "step": run.max_step,
                "peers_live": len(run.live_nodes(now)),
                "peers_total": len(run.nodes),
            },
        }

    def leaderboard(self, run: RunState, limit: int) -> list[dict[str, Any]]:
        nodes = sorted(run.nodes.values(), key=lambda n: (-n.tokens, -n.steps, -n.uptime_s, n.peer))
        return [{"rank": i + 1, **n.public()} for i, n in enumerate(nodes[:limit])]

    def lease_state(self, run: RunState, unit: int) -> dict[str, Any]:
        u = run.book.get(unit)
        names = {LEASED: "leased", DONE: "done"}
        return {
            "unit": unit,
            "state": names.get(u.state, "free"),
            "holder": u.holder if u.state == LEASED else None,
            "completed_by": u.completed_by,
            "issues": u.issues,
        }
