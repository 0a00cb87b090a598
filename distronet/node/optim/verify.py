"""Cheap, deterministic checks of a round's packets: what to drop, clip, flag and neutralise.

``Guard.judge(dec)`` looks only at the round's accepted payloads (peer-id order) and its own
replicated history (flags so far), so every replica that applied the same rounds reaches the
same ``Verdict``. Flagged packets earn no credit (``Verdict.credited``); a peer flagged in
``neutralise_after`` rounds is neutralised: its packets are left out of every later round.

What each check catches, and what it does not:

* **dropped** (norm not finite, or over ``drop_multiple`` × median): ±max-float values, absurdly
  scaled packets. Never reaches the sum. Misses nothing the clip would not bound anyway.
* **flag "norm"** (norm over ``flag_multiple`` × median): scaled-up gradients (×1e6, ×−1e4).
  Misses a hostile packet of honest size.
* **flag "zero"** (norm under ``zero_ratio`` × median): free-riding with empty packets. Misses a
  free rider who sends small noise of honest size (that needs the credit side's data checks).
* **flag "copy"** (the same indices as another packet this round and values within 1 % of its
  norm): a peer re-signing another's packet, re-quantised or not. The copy counts once in the
  sum; every member of the copy group is flagged for that round (nothing in one round's bytes
  says who copied), so its credit is held back, not yet lost. Copy flags do not count toward
  ``neutralise_after``; instead, over the last W = ``credit_delay`` rounds, a peer in copy groups
  in more than W/2 of them, with at least two distinct partners, none of which is itself in
  copy groups in more than W/2 of them, is neutralised as a copier. A round's credit is final
  W rounds after it (``settle``): a copy-flagged packet gets its credit back when its content
  was summed (it or its twin) and every other member of its group has been neutralised as a
  copier by then. So a copier that rotates over victims is neutralised within W/2 + 1 rounds
  and its victims keep their credit. What the bytes cannot tell: a copier bound to one victim (the
  pair is symmetric in the bytes: two peers with the same packets every round and no other
  partner); neither is neutralised (that could evict an honest peer). With an ``Auditor`` (a
  replica that can reproduce peers' leased batches) ``audit`` scores each copy group against
  every member's batch (``provenance.py``): the owner gets the copied rounds' credit, the
  copier is convicted and earns nothing; without one, both forfeit the copied rounds.
  Colluding copiers that share a victim in one round at least once every W
  rounds shield each other from neutralisation (they still earn nothing for copies), and so
  does an honest peer copied in more than half the rounds (it shields its copier: no
  eviction is decided against it). Misses a copy perturbed by more than 1 %, or with indices
  changed.
* **flag "cosine"** (the peer's cosine with the combined packets of the others, averaged over its
  last ``cos_window`` rounds, is ≤ 0 and ``cos_gap`` below the round's median of those averages):
  sign-flipped gradients, random indices and values, while the honest peers still agree. Near
  convergence, where honest packets are mostly noise and their cosines near 0, nothing is far
  from the median and nothing is flagged (nor does a flipped packet of noise do much harm).
  Misses a hostile packet that is mostly honest (a small bias), and cannot tell a peer whose
  honest data disagrees with everyone's from an attacker.
* **stale replay** (an old packet of one's own) never gets here: ``open_round`` rejects a
  packet for another step (STALE_STEP), and one not in the run's plan (OFF_PLAN).

Credit (``settle``, ``final_credit``): round t's credited peers (combined, unflagged, plus the
copy-flagged ones given back as above or owned by the audit), less any peer neutralised by round
t + W or convicted by the audit, in peer-id order (a round whose copy group is still under audit
waits for its end, ``Audit.max_rounds`` rounds at most); ``flush`` settles the rounds still
pending (end of a run). Without an audit all of it is computed from the rounds' packets only, so
every replica settles the same credit; the audit's answers are floats of this replica's own
gradients, so credit may differ between replicas there (it is a log, never state).

Rounds of fewer than ``min_peers`` packets get only the finiteness rule: a median of two is no
statistic. The history (``flag_rounds``, ``cos_history``, ``neutralised``, ``copiers``,
``copy_window``, ``held``) is replicated state of the optimizer: it travels with the swarm's state
(``catchup/guard_state.py``, in the state blob and the local checkpoint), so a replica that adopts
the state mid-run judges the next rounds as the donors do. ``final_credit`` is this replica's log
of settled credit, not state (nothing later is computed from it), and so are the audit's
evidence (``provenance``) and the rounds ``awaiting`` its end.
Cost per round: one float64 pass over the values (norms), one hash per packet, one bincount,
and a pass over the copy groups of the last W rounds.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
from collections.abc import Sequence

import numpy as np

from distronet.kernels.coding import FlatPayload
from distronet.node.optim import robust
from distronet.node.optim.config import Robust
from distronet.node.optim.packets import DecodedRound, TensorPlan
from distronet.node.optim.provenance import Auditor, Provenance

__all__ = ["Guard", "Held", "Verdict"]

_COPY_TOL = 0.01
"""Two packets with the same indices whose values differ by at most this share of the first's
norm are copies (re-quantising a copied packet moves values by far less)."""


def _near(a: np.ndarray, b: np.ndarray) -> bool:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    d = a64 - b64
    return robust.fdot(d, d) <= _COPY_TOL**2 * robust.fdot(a64, a64)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One round's decision: the packets combined (``keep``, indices into ``dec.peers``) and their
    ``scales``; the ``dropped`` peers; per flagged peer, why; the peers neutralised so far."""

    keep: tuple[int, ...]
    scales: tuple[float, ...]
    dropped: tuple[bytes, ...]
    flagged: dict[bytes, str]
    neutralised: frozenset[bytes]
    norms: tuple[float, ...]
    copies: tuple[frozenset[bytes], ...] = ()

    def credited(self, peers: Sequence[bytes]) -> tuple[bytes, ...]:
        """Of the round's accepted ``peers``, those that earn credit: combined and not flagged."""
        kept = {peers[i] for i in self.keep}
        return tuple(p for p in peers if p in kept and p not in self.flagged)

    def salt(self) -> bytes:
        """What decided the selection and scales (mixed into the round's cache key)."""
        return repr((self.keep, self.scales)).encode()


@dataclasses.dataclass(frozen=True)
class Held:
    """A round whose credit is not final yet: who earned it now, what was summed, its copy groups."""

    step: int
    credited: tuple[bytes, ...]
    combined: frozenset[bytes]
    copies: tuple[frozenset[bytes], ...]


FINAL_KEPT = 4096
"""How many settled rounds ``Guard.final_credit`` keeps (a consumer reads them as they come)."""


class Guard:
    """One replica's checks and their replicated history (module docstring)."""

    def __init__(self, cfg: Robust, plans: Sequence[TensorPlan]) -> None:
        self.cfg = cfg
        self.bases, self.total = robust.coefficient_bases(plans)
        self.flag_rounds: dict[bytes, int] = collections.Counter()
        self.cos_history: dict[bytes, collections.deque[float]] = {}
        self.neutralised: dict[bytes, int] = {}
        self.copiers: dict[bytes, int] = {}  # neutralised as copiers, at the step
        self.copy_window: collections.deque[tuple[frozenset[bytes], ...]] = collections.deque(
            maxlen=cfg.credit_delay
        )
        self.held: collections.deque[Held] = collections.deque()
        self.awaiting: collections.deque[Held] = collections.deque()  # settled, audit open (local)
        self.final_credit: collections.deque[tuple[int, tuple[bytes, ...]]] = collections.deque(
            maxlen=FINAL_KEPT
        )
        self._patterns: dict[tuple[bytes, bytes], np.ndarray] = {}
        self.provenance = Provenance(plans, self.bases, self.total)  # local, not replicated

    def positions(self, flat: FlatPayload) -> np.ndarray:
        """``robust.global_index(flat)``, with the part that depends only on the payload's structure
        (tensors, k, chunks) computed once per structure."""
        key = (flat.structure, flat.n.tobytes())
        pat = self._patterns.get(key)
        if pat is None:
            zero = dataclasses.replace(flat, idx=np.zeros_like(flat.idx))
            pat = self._patterns[key] = robust.global_index(zero, self.bases)
            while len(self._patterns) > 8:
                del self._patterns[next(iter(self._patterns))]
        out: np.ndarray = pat + flat.idx
        return out

    def judge(self, dec: DecodedRound) -> tuple[Verdict, list[np.ndarray]]:
        """The round's ``Verdict`` (updating the history) and each packet's coefficient positions."""
        cfg = self.cfg
        v64 = [f.val.astype(np.float64) for f in dec.flats]  # each packet's values, widened once
        norms = [math.sqrt(robust.fdot(v, v)) for v in v64]  # = robust.packet_norms(dec.flats)
        live = [i for i, p in enumerate(dec.peers) if p not in self.neutralised]
        small = len(live) < cfg.min_peers
        med = robust.median([norms[i] for i in live])
        bound = cfg.drop_multiple * med
        dropped = [i for i in live if not np.isfinite(norms[i]) or (not small and norms[i] > bound)]
        keep = [i for i in live if i not in dropped]
        flagged: dict[bytes, str] = {}
        gidx: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(dec.flats)
        copies: list[frozenset[bytes]] = []
        if small or cfg.combine == "none":
            scales = [1.0] * len(keep)
        else:
            scales = robust.clip_scales([norms[i] for i in keep], med, cfg.clip_multiple)
            keep, scales = self._dedupe(dec, keep, scales, flagged, copies)
            for i in keep:
                gidx[i] = self.positions(dec.flats[i])
            self._flag_sizes(dec, keep, norms, med, flagged)
            self._flag_cosines(dec, keep, scales, gidx, v64, flagged)
        for p in dropped:
            flagged[dec.peers[p]] = "dropped"
        self._neutralise(dec.step, flagged)
        self._catch_copiers(dec.step, tuple(copies))
        verdict = Verdict(
            tuple(keep),
            tuple(scales),
            tuple(dec.peers[i] for i in dropped),
            flagged,
            frozenset(self.neutralised),
            tuple(norms),
            tuple(copies),
        )
        return verdict, gidx

    def _dedupe(
        self,
        dec: DecodedRound,
        keep: list[int],
        scales: list[float],
        flagged: dict[bytes, str],
        copies: list[frozenset[bytes]],
    ) -> tuple[list[int], list[float]]:
        """Copies (same tensors and indices, values within ``_COPY_TOL`` of the first's norm) count
        once (the first in peer-id order); every member of a copy group is flagged ``"copy"``, and
        the groups (each a first packet's peer and its copies) are appended to ``copies``."""
        first: dict[bytes, list[int]] = {}
        groups: dict[int, set[bytes]] = {}
        out_k, out_s = [], []
        for i, s in zip(keep, scales, strict=True):
            f = dec.flats[i]
            h = hashlib.sha256(f.tensor_ids.tobytes() + f.k.tobytes() + f.idx.tobytes()).digest()
            twin = next((j for j in first.get(h, []) if _near(dec.flats[j].val, f.val)), None)
            if twin is not None:
                flagged[dec.peers[i]] = flagged[dec.peers[twin]] = "copy"
                groups.setdefault(twin, {dec.peers[twin]}).add(dec.peers[i])
                continue
            first.setdefault(h, []).append(i)
            out_k.append(i)
            out_s.append(s)
        copies.extend(frozenset(groups[j]) for j in sorted(groups))
        return out_k, out_s

    def _flag_sizes(
        self, dec: DecodedRound, keep: list[int], norms: list[float], med: float, flagged: dict[bytes, str]
    ) -> None:
        for i in keep:
            if norms[i] > self.cfg.flag_multiple * med:
                flagged.setdefault(dec.peers[i], "norm")
            elif norms[i] <= self.cfg.zero_ratio * med:
                flagged.setdefault(dec.peers[i], "zero")

    def _flag_cosines(
        self,
        dec: DecodedRound,
        keep: list[int],
        scales: list[float],
        gidx: list[np.ndarray],
        v64: list[np.ndarray],
        flagged: dict[bytes, str],
    ) -> None:
        """Cosine of ``s_i·p_i`` with ``A − s_i·p_i`` (``A`` the clipped sum; float64, fixed order),
        averaged over each peer's last ``cos_window`` rounds; flag the averages ≤ 0 that lie
        ``cos_gap`` below the round's median average."""
        if len(keep) < self.cfg.min_peers:
            return
        pos = np.concatenate([gidx[i] for i in keep])
        scaled = [v64[i] * s for i, s in zip(keep, scales, strict=True)]
        agg = np.bincount(pos, weights=np.concatenate(scaled), minlength=self.total)
        agg_sq = robust.fdot(agg, agg)
        means: dict[int, float] = {}
        for i, v in zip(keep, scaled, strict=True):
            vv, dot = robust.fdot(v, v), robust.fdot(v, agg[gidx[i]])
            others_sq = max(agg_sq - 2.0 * dot + vv, 0.0)
            denom = np.sqrt(vv * others_sq)
            cos = (dot - vv) / denom if denom > 0 else 0.0
            hist = self.cos_history.setdefault(dec.peers[i], collections.deque(maxlen=self.cfg.cos_window))
            hist.append(float(cos))
            means[i] = sum(hist) / len(hist)
        mid = robust.median(list(means.values()))
        for i, m in means.items():
            if m <= 0.0 and m < mid - self.cfg.cos_gap:
                flagged.setdefault(dec.peers[i], "cosine")

    def _neutralise(self, step: int, flagged: dict[bytes, str]) -> None:
        for peer, why in sorted(flagged.items()):
            if why == "copy":
                continue
            self.flag_rounds[peer] += 1
            if self.flag_rounds[peer] >= self.cfg.neutralise_after and peer not in self.neutralised:
                self.neutralised[peer] = step

    def _catch_copiers(self, step: int, copies: tuple[frozenset[bytes], ...]) -> None:
        """Neutralise, as a copier, a peer in copy groups in more than W/2 of the last W rounds
        (``credit_delay``) with at least two distinct partners, none of them that often in groups."""
        self.copy_window.append(copies)
        rounds: collections.Counter[bytes] = collections.Counter()
        partners: dict[bytes, set[bytes]] = collections.defaultdict(set)
        for groups in self.copy_window:
            for peer in set().union(*groups) if groups else set():
                rounds[peer] += 1
            for g in groups:
                for peer in g:
                    partners[peer] |= g - {peer}
        heavy = {p for p, n in rounds.items() if 2 * n > self.cfg.credit_delay}
        for peer in sorted(heavy):
            if len(partners[peer]) >= 2 and not partners[peer] & heavy and peer not in self.neutralised:
                self.neutralised[peer] = step
                self.copiers[peer] = step

    def audit(self, dec: DecodedRound, verdict: Verdict, gidx: list[np.ndarray], auditor: Auditor) -> None:
        """Score this round's copy groups against their members' leased data
        (``provenance.py``): credit only, never the sum."""
        groups = [g for g in verdict.copies if not g & self.copiers.keys() and self.provenance.open(g)]
        reps = [next(i for i in verdict.keep if dec.peers[i] in g) for g in groups]
        content = [(gidx[i], dec.flats[i].val.astype(np.float64)) for i in reps]
        self.provenance.observe(dec, groups, content, auditor)

    def settle(
        self, verdict: Verdict, step: int, credited: Sequence[bytes], combined: Sequence[bytes]
    ) -> None:
        """Hold round ``step``'s credit (``credited``: combined and unflagged; ``combined``: what
        was summed) and settle every held round ``credit_delay`` or more rounds older. A settled
        round whose copy groups are still being audited waits (``awaiting``, local) until the
        audit ends, at most ``Audit.max_rounds`` rounds more; later rounds queue behind it."""
        self.held.append(Held(step, tuple(credited), frozenset(combined), verdict.copies))
        while self.held and self.held[0].step <= step - self.cfg.credit_delay:
            self.awaiting.append(self.held.popleft())
        oldest = step - self.cfg.credit_delay - self.provenance.cfg.max_rounds
        while self.awaiting and (self.awaiting[0].step <= oldest or not self._audited(self.awaiting[0])):
            self._final(self.awaiting.popleft())

    def _audited(self, h: Held) -> bool:
        """Whether a copy group of round ``h`` whose content was summed is still under audit."""
        return any(
            g & h.combined and not g & self.copiers.keys() and self.provenance.pending(g) for g in h.copies
        )

    def flush(self) -> None:
        """Settle every held round with what is known now (the end of a run)."""
        while self.awaiting:
            self._final(self.awaiting.popleft())
        while self.held:
            self._final(self.held.popleft())

    def _final(self, h: Held) -> None:
        """Round ``h``'s final credit: its credited peers plus copy-group members whose group's
        content was summed and whose every partner is a copier, or who own the group by the data
        audit (``provenance.py``), less the neutralised peers and the copiers the audit convicted."""
        earned = set(h.credited)
        for g in h.copies:
            if g & h.combined:
                earned |= {p for p in g if all(q in self.copiers for q in g - {p})}
                owner = self.provenance.owner(g)
                earned |= {owner} if owner is not None else set()
        out = self.neutralised.keys() | self.provenance.convicted.keys()
        self.final_credit.append((h.step, tuple(sorted(p for p in earned if p not in out))))
