"""Whose packet a copy is: an audit of copy groups against each member's leased data (credit only).

``verify.Guard`` finds copies (the same indices, values within 1 %) but nothing in a round's bytes
says who copied whom; a copier bound to one victim is symmetric with it in every round. The data
is not symmetric: a packet is the top-k of its producer's momentum, and the newest gradient in
that momentum is the producer's own leased batch. So the audit recomputes, for each member of a
copy group, the gradient of *that member's* leased batch at this replica's current parameters
(``Auditor``: the caller knows how leases map to batches), takes it to coefficient space (the same
chunked DCT the packets are cut from), and scores the group's content by its cosine with it,
read at the content's positions and normalised by the gradient's whole norm. The producer's own
batch scores higher than the copier's, round after round; a copier cannot change that without
training on the victim's batch, which is the victim's work.

Evidence is kept per pair of members (a, b): each audited round adds d = score(a) − score(b). A
pair is decided once it has at least ``min_rounds`` audited rounds, the sign of d agrees in at
least ``majority`` of them, and the mean of d is at least ``t_min`` standard errors from zero (a
t statistic: an undistinguishable pair, whose d is noise around 0, passes it by chance about once
in a few hundred pairs, while a copier bound to one victim fails it by a wide margin: on
``bench hostile``'s workload the victim scored higher in 200 of 200 rounds). The member d favours
then owns the pair's copies and the other is **convicted** (a copier found by data). A pair still
undecided after ``max_rounds`` audits is given up: its copies earn nothing (as without an audit).
Decided and given-up pairs are not audited again, so a copier bound to one victim costs a
replica at most ``2 × max_rounds`` extra gradient passes, and an honest run, with no copy groups,
none.

Scope: this decides credit only. The sum already counts a copy once, so parameters never depend
on it, and replicas that score differently (other hardware, other float rounding, a replica that
could not reproduce a batch) differ only in the credit they log (``Guard.final_credit``, local by
design), never in state. What it does not catch: a copier that trains on its own batch and
blends in the victim's packet (a perturbed copy is no longer a copy: ``verify.py``'s cosine and
norm checks are what bound it); a copy of a peer whose batch this replica cannot reproduce (no
``Auditor`` answer: the pair stays undecided).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from distronet.kernels.dct import dct_chunks
from distronet.node.optim.packets import DecodedRound, TensorPlan
from distronet.node.optim.robust import fdot
from distronet.protocol.errors import ConfigError

__all__ = ["Audit", "Auditor", "Provenance"]


class Auditor(Protocol):
    """Reproduces a peer's training batch (from its lease) and its gradient."""

    def gradients(self, peer: bytes, step: int) -> Sequence[torch.Tensor] | None:
        """The gradient of ``peer``'s leased batch for ``step`` at this replica's current
        parameters, one tensor per parameter in the run's order (parameter shapes); ``None`` when
        this replica cannot reproduce that batch. Must not touch the parameters or their ``.grad``."""
        ...


@dataclasses.dataclass(frozen=True)
class Audit:
    """When a pair of copy-group members is decided (module docstring)."""

    min_rounds: int = 5
    max_rounds: int = 24
    majority: float = 0.8
    t_min: float = 5.0

    def __post_init__(self) -> None:
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ConfigError(
                f"audit: need 1 <= min_rounds <= max_rounds, got {self.min_rounds}, {self.max_rounds}"
            )
        if not 0.5 < self.majority <= 1.0:
            raise ConfigError(f"audit: majority must be in (0.5, 1], got {self.majority}")
        if not self.t_min > 0:
            raise ConfigError(f"audit: t_min must be > 0, got {self.t_min}")


@dataclasses.dataclass
class _Pair:
    """Members ``a < b`` and each audited round's score(a) − score(b)."""

    a: bytes
    b: bytes
    diffs: list[float] = dataclasses.field(default_factory=list)
    owner: bytes | None = None
    given_up: bool = False

    @property
    def open(self) -> bool:
        return self.owner is None and not self.given_up


class Provenance:
    """One replica's audit evidence and decisions (module docstring); not replicated state."""

    def __init__(
        self, plans: Sequence[TensorPlan], bases: np.ndarray, total: int, cfg: Audit | None = None
    ) -> None:
        self.plans = list(plans)
        self.bases = bases
        self.total = total
        self.cfg = cfg or Audit()
        self.pairs: dict[tuple[bytes, bytes], _Pair] = {}
        self.convicted: dict[bytes, int] = {}  # copiers found by data, at the step
        self.audits = 0  # gradient passes asked of the auditor

    def _pair(self, a: bytes, b: bytes) -> _Pair:
        key = (a, b) if a < b else (b, a)
        pair = self.pairs.get(key)
        if pair is None:
            pair = self.pairs[key] = _Pair(*key)
        return pair

    def open(self, group: frozenset[bytes]) -> bool:
        """Whether any pair of ``group``'s members is still being audited."""
        members = sorted(group)
        return any(self._pair(a, b).open for i, a in enumerate(members) for b in members[i + 1 :])

    def pending(self, group: frozenset[bytes]) -> bool:
        """Whether an audit of ``group`` has started and not ended (a pair with evidence, open)."""
        members = sorted(group)
        keys = [(a, b) for i, a in enumerate(members) for b in members[i + 1 :]]
        return any(k in self.pairs and self.pairs[k].diffs and self.pairs[k].open for k in keys)

    def owner(self, group: frozenset[bytes]) -> bytes | None:
        """The member that won its decided pair against every other member, if there is one."""
        for m in sorted(group):
            if all(self._pair(m, o).owner == m for o in group - {m}):
                return m
        return None

    def observe(
        self,
        dec: DecodedRound,
        copies: Sequence[frozenset[bytes]],
        content: Sequence[tuple[np.ndarray, np.ndarray]],
        auditor: Auditor,
    ) -> None:
        """Audit round ``dec.step``'s copy groups: ``content[g]`` is group g's summed packet as
        (coefficient positions, values). Members of open pairs are scored; pairs are decided."""
        for group, (pos, val) in zip(copies, content, strict=True):
            members = sorted(group)
            open_pairs = [
                (a, b) for i, a in enumerate(members) for b in members[i + 1 :] if self._pair(a, b).open
            ]
            if not open_pairs or len(pos) == 0:
                continue
            need = sorted({p for pair in open_pairs for p in pair})
            scores = {p: self._score(p, dec.step, pos, val, auditor) for p in need}
            for a, b in open_pairs:
                sa, sb = scores[a], scores[b]
                if sa is not None and sb is not None:
                    self._record(self._pair(a, b), sa - sb, dec.step)

    def _record(self, pair: _Pair, d: float, step: int) -> None:
        """Add a round's score difference; decide or give up the pair (module docstring)."""
        pair.diffs.append(d)
        cfg, n = self.cfg, len(pair.diffs)
        diffs = np.asarray(pair.diffs)
        mean, sd = float(diffs.mean()), float(diffs.std(ddof=1)) if n > 1 else 0.0
        agree = max(int((diffs > 0).sum()), int((diffs < 0).sum()))
        t = abs(mean) / (sd / np.sqrt(n)) if sd > 0 else (np.inf if mean else 0.0)
        if n >= cfg.min_rounds and agree >= cfg.majority * n and t >= cfg.t_min:
            pair.owner, other = (pair.a, pair.b) if mean > 0 else (pair.b, pair.a)
            self.convicted.setdefault(other, step)
        elif n >= cfg.max_rounds:
            pair.given_up = True

    def _score(
        self, peer: bytes, step: int, pos: np.ndarray, val: np.ndarray, auditor: Auditor
    ) -> float | None:
        """Cosine of the content with ``peer``'s batch gradient in coefficient space (module doc)."""
        self.audits += 1
        grads = auditor.gradients(peer, step)
        if grads is None:
            return None
        if len(grads) != len(self.plans):
            raise ConfigError(f"auditor gave {len(grads)} gradients for {len(self.plans)} parameters")
        coef = np.empty(self.total, dtype=np.float64)
        for plan, base, g in zip(self.plans, self.bases, grads, strict=True):
            c = dct_chunks(g.detach().float(), plan.layout).reshape(-1)
            coef[int(base) : int(base) + c.numel()] = c.cpu().double().numpy()
        norm = math.sqrt(fdot(coef, coef)) * math.sqrt(fdot(val, val))
        return fdot(val, coef[pos]) / norm if norm > 0 else 0.0
