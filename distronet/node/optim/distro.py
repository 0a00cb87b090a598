"""``DistroOptimizer``: DisTrO/DeMo as a ``torch.optim.Optimizer`` over an ``Exchange``.

One step ``t`` (ARCHITECTURE.md §3), per parameter, momentum kept in DCT coefficient space:

    m̂ ← β·m̂ + DCT(g)                    (× lr inside for the DeMo reference)
    send = quantise(top-k per chunk of m̂)  → sealed packet for step t → exchange.publish
    m̂ ← m̂ − dequantised(send)            (exact error feedback, quantisation error included)
    round = exchange.collect(t)            (accepted set, identical on every replica)
    D = IDCT(Σ_peers parts, peer-id order) / n_accepted      (aggregate.round_sums: one pass over
                                            every packet's entries, ONE inverse per block shape)
    θ ← θ·(1 − lr·λ) − lr·rule(D)          (decoupled weight decay; rule: sign / RMS / ortho)

Determinism: every replica decodes the same frames, sums them in ascending peer-id order and
runs the same kernels, so all replicas apply a bit-identical update (on CPU; CUDA's index_add_ uses
atomics). If this peer's own packet is not in the accepted set, what it sent is added back to
its momentum, so nothing is lost.

Overlap (``cfg.overlap.enabled``): ``step`` publishes step t's packet and applies round t − 1, so
the exchange of t runs while t + 1 computes (steps before ``overlap.start`` run synchronously). The
replicas keep a bit-identical *consensus* copy θ̄ that only ever receives aggregated updates; the
model's parameters are θ̄ − α·lr_{t}·Ĝ (``overlap.lookahead``, α = ``overlap.scale``): a guess Ĝ
stands in for the update U_t still in flight and is replaced (corrected) by the real one when it
arrives. Ĝ (``overlap.predict``): ``"last"`` the last applied update U_{t−1}, ``"ema"`` a running
mean of the applied updates (replicated state), ``"own"`` the rule applied to this peer's own
packet for step t (through the outer-momentum buffer when there is one; the parameters then
differ between replicas by their guesses, the consensus never does).
Consecutive DisTrO updates are nearly uncorrelated (top-k extraction drains what was sent), so
``"last"`` predicts U_t poorly (cosine ≈ 0.05 on the default GPT) and ``"own"`` best (≈ 0.45;
docs/decisions/overlap.md). ``flush()`` applies the last round and sets θ = θ̄.

Replicas sharing a ``DecodeCache`` (the in-process swarm) also share each round's aggregate and
stateless update directions, computed once per round instead of once per replica.

The split ``begin_step()`` / ``finish_step()`` lets a single-threaded simulation publish every
peer's packet before any peer collects; ``step()`` is both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from distronet.kernels.dct import dct_accumulate
from distronet.kernels.decode import decode_sum
from distronet.node.exchange.base import Exchange, Round
from distronet.node.optim import robust
from distronet.node.optim.aggregate import round_sums
from distronet.node.optim.config import DistroConfig, UpdateRule, lr_at
from distronet.node.optim.packets import (
    DecodeCache,
    DecodedRound,
    SentTensor,
    TensorPlan,
    build_packet,
    feed_back_all,
    make_plans,
    momentum_buffers,
    momentum_chunks,
    open_round,
    run_digest,
    to_momentum,
)
from distronet.node.optim.provenance import Auditor
from distronet.node.optim.roles import Role
from distronet.node.optim.update import ADAM_BETA2, ADAM_EPS, apply_rule
from distronet.node.optim.verify import Guard, Verdict
from distronet.protocol.errors import ConfigError, RejectCode
from distronet.protocol.identity import Identity

__all__ = ["MOMENTUM_LAYOUT", "DistroOptimizer", "StepReport"]

MOMENTUM_LAYOUT = 2
"""The optimizer state's ``momentum_layout`` (a param-group key): 2 = each 2-D tensor sent top-k
keeps its momentum in spatial coefficient order (``packets.TensorPlan.momentum_shape``); a state
without the key (saved before) kept every momentum in chunk order."""

_EMA = 0.9
"""The ``"ema"`` guess's factor: a mean over the last ~10 applied updates."""


@dataclasses.dataclass(frozen=True)
class StepReport:
    """What one applied round looked like from this replica."""

    step: int
    lr: float
    accepted: tuple[bytes, ...]
    rejected: dict[bytes, RejectCode]
    own_accepted: bool
    combined: tuple[bytes, ...] = ()  # the packets that went into the sum (after drops, copies)
    credited: tuple[bytes, ...] = ()  # combined and not flagged (provisional: guard.final_credit)
    flagged: dict[bytes, str] = dataclasses.field(default_factory=dict)
    neutralised: frozenset[bytes] = frozenset()
    nonfinite_blocked: int = 0  # tensors whose update would have been non-finite (not applied)
    frame_sha256: dict[bytes, bytes] = dataclasses.field(default_factory=dict)  # of each credited frame


@dataclasses.dataclass
class _Pending:
    sent: list[SentTensor]
    lr: float


class DistroOptimizer(torch.optim.Optimizer):
    """DisTrO optimizer (module docstring). Parameters are given with names (the run's layout).

    ``named_params``: ``model.named_parameters()`` (tied weights appear once). All replicas of a
    run must pass the same names and shapes in the same order, and the same ``cfg``.
    ``roles``: each parameter's role by name, ``roles.tensor_roles(model)`` (decided from the
    model's structure; ``ORTHO`` orthogonalises ``HIDDEN`` tensors, every other role takes
    ``update.fallback``). Required when ``cfg.update.rule`` is ``ORTHO``, the one rule that treats
    tensors by role: ``None`` there raises ``ConfigError`` (no guess from names or shapes). With
    any other rule every tensor gets that rule and ``roles`` may be ``None``; when given it is
    checked all the same.
    ``decode_cache`` lets replicas of one process decode each frame once (``DecodeCache``).
    ``admitted``: the peers whose packets may count (others: UNKNOWN_PEER); None admits any signer.
    ``auditor`` reproduces peers' leased batches, so copy groups are told apart by data
    (``provenance.py``: credit only); without one, copied rounds earn nothing.
    ``verify_seconds`` sums the time spent judging rounds (``verify.Guard``) and combining them.
    Raises ``ConfigError`` for an empty or non-float parameter list, and for ``roles`` that do not
    name exactly these parameters or give ``VECTOR`` to a matrix or another role to a non-matrix.
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, nn.Parameter]],
        cfg: DistroConfig,
        exchange: Exchange,
        identity: Identity,
        *,
        decode_cache: DecodeCache | None = None,
        admitted: frozenset[bytes] | None = None,
        roles: Mapping[str, Role] | None = None,
        auditor: Auditor | None = None,
    ) -> None:
        named = list(named_params)
        if not named:
            raise ConfigError("DistroOptimizer needs at least one parameter")
        for name, p in named:
            if not p.is_floating_point():
                raise ConfigError(f"parameter {name} is not floating point ({p.dtype})")
        self.roles = _check_roles(named, roles, cfg.update.rule)
        super().__init__([p for _, p in named], {"lr": cfg.schedule.lr, "momentum_layout": MOMENTUM_LAYOUT})
        self.cfg = cfg
        self.exchange = exchange
        self.identity = identity
        self.decode_cache = decode_cache
        self.plans: list[TensorPlan] = make_plans([(n, tuple(p.shape)) for n, p in named], cfg)
        self.digest = run_digest(self.plans)
        self.admitted = admitted
        self.guard = Guard(cfg.robust, self.plans)
        self.auditor = auditor
        self.verify_seconds = 0.0
        self._params = [p for _, p in named]
        for p, m in zip(self._params, momentum_buffers(self.plans, self._params), strict=True):
            st = self.state[p]
            st["momentum"] = m
            if cfg.overlap.enabled:
                st["consensus"] = p.detach().clone()
        self._t = 0
        self._begun = False
        self._pending: dict[int, _Pending] = {}
        self._last_u: list[torch.Tensor] = []  # overlap: the last applied update of each parameter
        self.reports: list[StepReport] = []

    @property
    def step_index(self) -> int:
        """The next step to run (0-based)."""
        return self._t

    def resume_at(self, step: int) -> None:
        """Make ``step`` the next step to run: after loading a checkpoint or adopting the swarm's
        state for that step (the caller restores parameters and replicated state itself)."""
        self._t = int(step)

    def rounds_due(self) -> int:
        """The first round this replica has not applied: step ``t - 1`` when step ``t`` (the next
        to run) is overlapped and collects it, else ``t``."""
        t = self._t
        return t - 1 if self.overlapped(t) and t - 1 >= self.cfg.overlap.start else t

    @torch.no_grad()
    def apply_replayed(self, rnd: Round) -> None:
        """Apply round ``rnd.step == rounds_due()`` that the swarm decided while this replica
        computed nothing (``node/catchup/replay.py``), and move to the step a replica that applied it
        would run next; the parameters become the consensus (no lookahead). Raises
        ``ConfigError`` for another step. Bit-identical to the swarm's replicas: the same
        frames through the same ``_apply``."""
        if rnd.step != self.rounds_due():
            raise ConfigError(f"replayed round {rnd.step}, but round {self.rounds_due()} is due")
        self._apply(rnd, lookahead=False)
        u = rnd.step
        self._t = u + 2 if self.cfg.overlap.enabled and u + 1 >= self.cfg.overlap.start else u + 1
        self._begun = False

    def _momenta(self) -> list[torch.Tensor]:
        return [self.state[p]["momentum"] for p in self._params]

    def momentum_chunks(self) -> list[torch.Tensor]:
        """Each parameter's error-feedback momentum in chunk order ``(n_chunks, chunk_numel)``
        (copies where it is kept spatial: ``packets.TensorPlan.momentum_shape``)."""
        return [momentum_chunks(plan, m) for plan, m in zip(self.plans, self._momenta(), strict=True)]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``torch.optim.Optimizer.load_state_dict``, then every momentum copied into this
        optimizer's class buffers (``packets.momentum_buffers``: the in-place selection reads
        them). A state saved before ``momentum_layout`` 2 (every momentum in chunk order) has its
        spatial ones moved to spatial order; a momentum of another shape is refused.

        Raises:
            ValueError: a momentum does not fit its parameter's plan.
        """
        super().load_state_dict(state_dict)
        chunked = any(g.get("momentum_layout") != MOMENTUM_LAYOUT for g in self.param_groups)
        held = momentum_buffers(self.plans, self._params)
        for plan, p, h in zip(self.plans, self._params, held, strict=True):
            st = self.state[p]
            m = st.get("momentum")
            if m is not None:
                lay = plan.layout
                if chunked and tuple(m.shape) == (lay.n_chunks, lay.chunk_numel):
                    m = to_momentum(plan, m.to(h.device, torch.float32))
                if tuple(m.shape) != tuple(h.shape):
                    got, want = tuple(m.shape), tuple(h.shape)
                    raise ValueError(f"momentum of {plan.name} has shape {got}, expected {want}")
                h.copy_(m)
            st["momentum"] = h
        for g in self.param_groups:
            g["momentum_layout"] = MOMENTUM_LAYOUT

    @torch.no_grad()
    def begin_step(self) -> None:
        """Accumulate gradients into the momentum, extract, publish this step's packet.

        Raises ``PeerDead`` (from the exchange) when this peer is gone.
        """
        t, cfg, ex = self._t, self.cfg, self.cfg.extraction
        lr = lr_at(cfg, t)
        for group in self.param_groups:
            group["lr"] = lr
        momenta = self._momenta()
        for plan, p, m in zip(self.plans, self._params, momenta, strict=True):
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            alpha = lr if ex.lr_in_momentum else 1.0
            dct_accumulate(m, g.detach().float(), plan.layout, ex.beta, alpha, spatial=plan.spatial)
        frame, sent = build_packet(self.plans, momenta, cfg, t, self.identity, self.digest)
        feed_back_all(self.plans, momenta, sent, -1.0)
        self._pending[t] = _Pending(sent, lr)
        self._begun = True
        self.exchange.publish(t, frame)

    @torch.no_grad()
    def finish_step(self) -> None:
        """Collect and apply the due round (step t, or t − 1 when overlapped); advance to t + 1."""
        if not self._begun:
            raise ConfigError("finish_step() called without begin_step()")
        t, cfg = self._t, self.cfg
        if not self.overlapped(t):
            self._apply(self.exchange.collect(t), lookahead=False)
        elif t - 1 >= cfg.overlap.start:
            self._apply(self.exchange.collect(t - 1))
        elif t > 0 and cfg.overlap.lookahead:  # first overlapped step: round t - 1 already applied
            self._set_lookahead(t, self._last_u)
        self._begun = False
        self._t += 1

    def replicated_params(self) -> list[torch.Tensor]:
        """The tensors every replica holds bit-identical, in parameter order: the consensus copy
        θ̄ in overlap mode (the parameters themselves carry this peer's guess), else the parameters.
        Digest these to check agreement (with ``overlap.predict="own"`` the parameters differ)."""
        if self.cfg.overlap.enabled:
            return [self.state[p]["consensus"] for p in self._params]
        return list(self._params)

    def overlapped(self, step: int) -> bool:
        """Whether ``step``'s round is applied one step late (``overlap.enabled``, from ``overlap.start``)."""
        return self.cfg.overlap.enabled and step >= self.cfg.overlap.start

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One full step: ``begin_step()`` then ``finish_step()``. Returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.begin_step()
        self.finish_step()
        return loss

    @torch.no_grad()
    def flush(self) -> None:
        """Overlap mode: apply the last round still in flight and drop the lookahead (θ = θ̄)."""
        if not self.cfg.overlap.enabled or self._t == 0:
            return
        last = self._t - 1
        if last in self._pending and self.overlapped(last):
            self._apply(self.exchange.collect(last), lookahead=False)
        for p in self._params:
            p.copy_(self.state[p]["consensus"])

    def _rule_for(self, plan: TensorPlan) -> UpdateRule:
        up = self.cfg.update
        if up.rule is UpdateRule.ORTHO:
            assert self.roles is not None  # checked in __init__
            return UpdateRule.ORTHO if self.roles[plan.tensor_id] is Role.HIDDEN else up.fallback
        return up.rule

    def _direction(self, plan: TensorPlan, p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        st = self.state[p]
        rule = self._rule_for(plan)
        v = None
        if rule is UpdateRule.ADAM:
            v = st.setdefault("v", torch.zeros_like(d))
            st["n"] = st.get("n", 0) + 1
        return apply_rule(rule, d, v=v, n=st.get("n", 1))

    def _update(
        self,
        plan: TensorPlan,
        p: torch.Tensor,
        shared: dict[tuple[int, str], torch.Tensor],
    ) -> torch.Tensor:
        """This round's update of ``p`` (read-only: it may be shared with other in-process replicas)
        from its mean aggregate ``shared[(tensor id, "d")]``.

        The aggregate and a stateless rule's direction are pure functions of the round's frames,
        so replicas sharing a ``DecodeCache`` compute them once (bit-identical either way).
        """
        tid = plan.tensor_id
        d = shared[(tid, "d")]
        key = (tid, "u")
        if self.cfg.update.outer_momentum:  # the rule reads this replica's outer buffer: not shared
            return self._direction(plan, p, self._outer(p, d)).to(p.dtype)
        if self._rule_for(plan) is UpdateRule.ADAM:  # per-replica state: not shared
            return self._direction(plan, p, d).to(p.dtype)
        u = shared.get(key)
        if u is None:
            u = shared[key] = self._direction(plan, p, d).to(p.dtype)
        return u

    def _outer(self, p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Outer momentum: ``M ← μ·M + D`` (replicated state ``"outer"``, parameter shape); returns
        ``M``, or ``D + μ·M`` with ``outer_nesterov``. ``d`` is not modified (it may be shared)."""
        mu, st = self.cfg.update.outer_momentum, self.state[p]
        buf = st.get("outer")
        if buf is None:
            buf = st["outer"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        buf.mul_(mu).add_(d.reshape(p.shape))
        out: torch.Tensor = d.reshape(p.shape) + mu * buf if self.cfg.update.outer_nesterov else buf
        return out

    def _ema(self, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Overlap lookahead ``"ema"``: the running mean of the applied updates (replicated state,
        ``u_ema ← β·u_ema + (1 − β)·U``, seeded with the first update), β = ``_EMA``."""
        st = self.state[p]
        ema = st.get("u_ema")
        if ema is None:
            ema = st["u_ema"] = u.detach().clone()
        else:
            ema.mul_(_EMA).add_(u, alpha=1.0 - _EMA)
        out: torch.Tensor = ema
        return out

    def _predict(self, plan: TensorPlan, p: torch.Tensor, sent: SentTensor) -> torch.Tensor:
        """Overlap lookahead from this peer's own packet for the step in flight: the rule applied
        to what it sent (the Adam rule normalises with the current ``v``, leaving it unchanged)."""
        d = decode_sum(plan.layout, [(sent.idx, sent.val)], dtype=torch.float32, device=p.device)
        rule = self._rule_for(plan)
        st = self.state[p]
        mu, buf = self.cfg.update.outer_momentum, st.get("outer")
        if mu and buf is not None:  # the outer buffer the round in flight will meet: μ·M + D
            m_next = buf.reshape(d.shape) * mu + d
            d = d + mu * m_next if self.cfg.update.outer_nesterov else m_next
        if rule is UpdateRule.ADAM and "v" in st:
            v_hat: torch.Tensor = st["v"] / (1.0 - ADAM_BETA2 ** st.get("n", 1))
            return (d / (v_hat.sqrt() + ADAM_EPS)).to(p.dtype)
        if rule is UpdateRule.ADAM:
            rule = UpdateRule.RMS
        return apply_rule(rule, d).to(p.dtype)

    @torch.no_grad()
    def _apply(self, rnd: Round, *, lookahead: bool = True) -> None:
        cfg, wd, overlap = self.cfg, self.cfg.update.weight_decay, self.cfg.overlap.enabled
        # No pending entry: with overlap, the first step after adopting the swarm's state at step
        # t collects round t - 1, which the donor had not applied yet and we sent nothing to.
        pending = self._pending.pop(rnd.step, None) or _Pending([], lr_at(cfg, rnd.step))
        for old in [s for s in self._pending if s < rnd.step]:
            del self._pending[old]
        device = self._params[0].device
        dec = open_round(
            rnd.frames, self.plans, cfg, rnd.step, self.digest, device, self.decode_cache, self.admitted
        )
        own = self.identity.peer_id in dec.peers
        if not own and pending.sent:  # our packet did not count: give what we sent back to the momentum
            feed_back_all(self.plans, self._momenta(), pending.sent, 1.0)
        t0 = time.perf_counter()
        verdict, gidx = self.guard.judge(dec)
        if self.auditor is not None and verdict.copies:
            with torch.enable_grad():
                self.guard.audit(dec, verdict, gidx, self.auditor)
        comb = self._combine(dec, verdict, gidx)
        self.verify_seconds += time.perf_counter() - t0
        lr = pending.lr
        shared = (
            self.decode_cache.round_tensors(comb.key) if (self.decode_cache is not None and comb.key) else {}
        )
        if comb.peers and any((plan.tensor_id, "d") not in shared for plan in self.plans):
            self._mean_sums(comb, verdict, shared, device)
        used = shared.get((-1, "used"))
        n = 0 if used is None else int(used.numel())
        combined = tuple(comb.peers[i] for i in used.tolist()) if used is not None else ()
        credited = tuple(p for p in verdict.credited(dec.peers) if p in combined)
        self.guard.settle(verdict, rnd.step, credited, combined)  # final credit: guard.final_credit
        report = StepReport(
            rnd.step,
            lr,
            dec.peers,
            dec.rejected,
            own,
            combined,
            credited,
            verdict.flagged,
            verdict.neutralised,
            frame_sha256={p: hashlib.sha256(rnd.frames[p]).digest() for p in credited},
        )
        applied: list[torch.Tensor] = []
        blocked = 0
        for plan, p in zip(self.plans, self._params, strict=True):
            base = self.state[p]["consensus"] if overlap else p
            u = self._update(plan, p, shared) if n else torch.zeros_like(p)
            if n and not bool(torch.isfinite(u).all()):  # never reaches the weights (module doc)
                u, blocked = torch.zeros_like(p), blocked + 1
            if n:
                if wd:
                    base.mul_(1.0 - lr * wd)
                base.add_(u, alpha=-lr)
            if overlap:
                p.copy_(base)
            applied.append(u)
        self.reports.append(dataclasses.replace(report, nonfinite_blocked=blocked))
        if overlap:
            self._last_u = applied
        if lookahead and cfg.overlap.lookahead:
            self._set_lookahead(rnd.step + 1, applied)

    def _combine(self, dec: DecodedRound, verdict: Verdict, gidx: list[np.ndarray]) -> DecodedRound:
        """The round as it is summed: the verdict's packets, clipped, or one trimmed-mean payload."""
        mode = self.cfg.robust.combine
        if mode in ("trimmed_mean", "median") and len(verdict.keep) >= self.cfg.robust.min_peers:
            trim = self.cfg.robust.trim if mode == "trimmed_mean" else len(verdict.keep)
            salt = f"{mode}/{trim}".encode() + verdict.salt()
            return robust.trimmed_round(dec, verdict.keep, gidx, self.plans, trim, salt)
        return robust.scaled_round(dec, verdict.keep, verdict.scales, verdict.salt())

    def _mean_sums(
        self,
        comb: DecodedRound,
        verdict: Verdict,
        shared: dict[tuple[int, str], torch.Tensor],
        device: torch.device,
    ) -> None:
        """``shared[(tid, "d")]`` = the mean of the combined packets, and ``shared[(-1, "used")]``
        the indices (into ``comb.peers``) that went into it. While the sum is not finite
        (``robust.finite_sums``), the packet of the largest norm is dropped, by rule, the same on
        every replica; the whole round goes only when no packet is left."""
        used = list(range(len(comb.peers)))
        one_payload = len(comb.flats) != len(comb.peers)  # a trimmed round: one synthetic payload
        while used:
            part = (
                comb
                if len(used) == len(comb.peers)
                else robust.scaled_round(comb, used, [1.0] * len(used), b"")
            )
            sums = round_sums(part, self.plans, device)
            if robust.finite_sums([d / len(used) for d in sums]):
                for plan, d in zip(self.plans, sums, strict=True):
                    shared[(plan.tensor_id, "d")] = d.div_(len(used))
                break
            if one_payload:
                used = []
                break
            norms = robust.packet_norms([comb.flats[i] for i in used])
            used.pop(max(range(len(used)), key=lambda j: (norms[j], -j)))
        shared[(-1, "used")] = torch.tensor(used, dtype=torch.int64)

    @torch.no_grad()
    def _set_lookahead(self, step: int, last: list[torch.Tensor]) -> None:
        """Overlap: the model's parameters become ``θ̄ − overlap.scale·lr(step)·guess`` for round
        ``step`` still in flight (``overlap.predict``: ``last`` update, ``ema`` of the updates,
        or the rule on this peer's ``own`` packet for that step)."""
        cfg = self.cfg
        predict = cfg.overlap.predict
        own = self._pending.get(step) if predict == "own" else None
        alpha = -lr_at(cfg, step) * cfg.overlap.scale
        for i, (plan, p) in enumerate(zip(self.plans, self._params, strict=True)):
            if own is not None:
                guess = self._predict(plan, p, own.sent[i])
            elif not last:
                continue
            elif predict == "ema":
                guess = self._ema(p, last[i])
            else:
                guess = last[i]
            p.add_(guess, alpha=alpha)


def _check_roles(
    named: list[tuple[str, nn.Parameter]], roles: Mapping[str, Role] | None, rule: UpdateRule
) -> tuple[Role, ...] | None:
    """``roles`` in parameter order, checked against the parameters (``DistroOptimizer``'s doc)."""
    if roles is None:
        if rule is UpdateRule.ORTHO:
            raise ConfigError(
                "the ORTHO update treats tensors by role: pass roles=tensor_roles(model) "
                "(distronet.node.optim.roles)"
            )
        return None
    names = [n for n, _ in named]
    if set(roles) != set(names):
        missing, extra = sorted(set(names) - set(roles)), sorted(set(roles) - set(names))
        raise ConfigError(f"roles do not match the parameters: missing {missing}, unknown {extra}")
    out = []
    for name, p in named:
        role = Role(roles[name])
        if (role is Role.VECTOR) != (p.dim() != 2):
            raise ConfigError(f"parameter {name} of shape {tuple(p.shape)} cannot have role {role.value}")
        out.append(role)
    return tuple(out)
