"""The engine of `distro-node bench hostile` (``bench/hostile.py``): one hostile peer of eight,
attack by attack, through the real code.

Eight in-process peers (real ``DistroOptimizer``s over a ``MemoryHub``: packets built by
``build_packet``, sealed and signed, opened by ``open_round``) train a small MLP on a noisy
teacher task. Peer 7 trains honestly too, but its exchange rewrites every packet it publishes
before it goes out, signed with its own (admitted) key: one row per attack (``ATTACKS``).
``ground_leader_key`` instead signs with a fresh key that was never admitted (the run's admitted
set is passed to every replica's round opener: UNKNOWN_PEER). The ``none`` row is the clean run;
it also carries ``plain_mean_val_loss``, the same clean run with the plain mean (``robust="none"``).
Every row also carries ``seven_honest_val_loss``: the run where peer 7's packets never count
(from step 1 it only replays its step-0 packet), i.e. the seven honest peers' data alone, the
best any defence can do once it has shut the hostile peer out.

The workload is a benchmark design choice, made so that a final-loss comparison means
something: a swarm that shuts one peer out loses that peer's data, and while the loss is still
falling steeply that alone costs a few per cent (150 steps at lr 2e-3, noise 0.1: the seven
honest peers alone ended 3.6 % above the eight). So every row, clean and attacked alike, runs the
same ``HostileSetting``: 200 steps with the learning rate (1e-2, ``ours_k32``'s update rules)
warmed up over 10 and decayed to zero at the end (cosine), 64 samples per peer and step, and
label noise 0.2, whose floor (0.04) is most of the final loss, as the entropy floor is most of
a language model's. Then the seven-honest reference ends within ~1 % of the eight-peer run and a
ratio to the clean row measures the hostile peer's influence, not the missing batch.

Per row: the honest peer 0's validation loss, whether a non-finite value ever reached an honest
replica's weights, the step the hostile peer was neutralised (or first detected / rejected),
credit (each round's final credit, ``Guard.final_credit``, settled ``robust.credit_delay`` rounds
late: a packet earns its batch's tokens; a peer neutralised at any step, or any of whose packets
a replica rejected by rule (STALE_STEP, OFF_PLAN, UNKNOWN_PEER, ...), is caught cheating and
forfeits all of it, its genuine packets included, so the hostile credit is 0 in every attacked
row; no honest packet is ever rejected here, a real node must tell a late packet from a replay;
honest credit is the mean over the seven honest peers) and the share of the swarm's compute
spent judging rounds. ``copy`` re-signs a different honest peer's packet each step;
``copy_one_victim`` always peer 0's (symmetric in the bytes: every replica's ``_BatchAuditor``
reproduces each member's leased batch, ``optim/provenance.py``, and the audit gives the copied
rounds to the victim; a copier it convicts forfeits all, as a neutralised one does). Rows run
in up to two processes (``run_all``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from distronet.kernels.coding import EncodedTensor, ValueCoding, decode_payload, encode_payload, encode_tensor
from distronet.node.exchange.base import Exchange, Forwarding
from distronet.node.exchange.memory import MemoryHub
from distronet.node.optim.config import DistroConfig, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.packets import DecodeCache, TensorPlan
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.identity import Identity
from distronet.protocol.packet import open_packet, seal_packet

__all__ = ["ATTACKS", "QUICK", "HostileSetting", "run_all", "run_attack"]

ATTACKS = (
    "none",
    "scale_1e6",
    "max_float",
    "sign_flip",
    "random_indices",
    "stale_replay",
    "copy",
    "copy_one_victim",
    "zeros",
    "off_plan",
    "ground_leader_key",
)
N_PEERS = 8
HOSTILE = N_PEERS - 1
MAX_FLOAT = 3.4e38


@dataclasses.dataclass(frozen=True)
class HostileSetting:
    """The run every row shares (module docstring: why these): steps, per-peer batch, model widths,
    label noise, peak lr, warm-up steps, the lr's floor at the end (share of peak), seed."""

    steps: int = 200
    batch: int = 64
    d_in: int = 32
    hidden: int = 64
    d_out: int = 16
    noise: float = 0.2
    lr: float = 1e-2
    warmup: int = 10
    min_lr_ratio: float = 0.0
    seed: int = 0


QUICK = HostileSetting(steps=12, noise=0.1, lr=2e-3, min_lr_ratio=0.1)
"""A wiring check for tests (< 30 s): 12 steps at a small lr, where one missing batch barely
moves the loss; the issue's bounds are measured on the default ``HostileSetting``."""


def _model(s: HostileSetting) -> nn.Module:
    torch.manual_seed(s.seed)
    return nn.Sequential(nn.Linear(s.d_in, s.hidden), nn.Tanh(), nn.Linear(s.hidden, s.d_out))


class _Task:
    """A fixed random teacher network plus noise; per (peer, step) batches and a held-out set."""

    def __init__(self, s: HostileSetting) -> None:
        g = torch.Generator().manual_seed(10_000 + s.seed)
        self.s = s
        self.w1 = torch.randn(s.d_in, s.hidden, generator=g) / math.sqrt(s.d_in)
        self.w2 = torch.randn(s.hidden, s.d_out, generator=g) / math.sqrt(s.hidden)
        self.val = self._draw(torch.Generator().manual_seed(20_000 + s.seed), 1024)

    def _draw(self, g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, self.s.d_in, generator=g)
        y = torch.tanh(x @ self.w1) @ self.w2 + self.s.noise * torch.randn(n, self.s.d_out, generator=g)
        return x, y

    def batch(self, peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(torch.Generator().manual_seed(1_000_003 * (peer + 1) + step), self.s.batch)

    def val_loss(self, model: nn.Module) -> float:
        with torch.no_grad():
            return float(nn.functional.mse_loss(model(self.val[0]), self.val[1]))


class _BatchAuditor:
    """A replica's ``provenance.Auditor``: peer i's leased batch for a step is ``_Task.batch(i, step)``
    (the bench's lease schedule), its gradient taken at this replica's model as it stands."""

    def __init__(self, model: nn.Module, task: _Task, peers: list[bytes]) -> None:
        self.model = model
        self.task = task
        self.index = {p: i for i, p in enumerate(peers)}

    def gradients(self, peer: bytes, step: int) -> list[torch.Tensor] | None:
        i = self.index.get(peer)
        if i is None:
            return None
        x, y = self.task.batch(i, step)
        params = list(self.model.parameters())
        return list(torch.autograd.grad(nn.functional.mse_loss(self.model(x), y), params))


class _Recording(Forwarding):
    """An exchange that remembers what it published (the copy attack reads a victim's frames) and
    can rewrite each frame before it leaves (``rewrite``)."""

    def __init__(self, inner: Exchange, sent: dict[tuple[bytes, int], bytes]) -> None:
        super().__init__(inner)
        self.sent = sent
        self.rewrite: Callable[[int, bytes], bytes] | None = None

    def publish(self, step: int, frame: bytes) -> None:
        if self.rewrite is not None:
            frame = self.rewrite(step, frame)
        self.sent[(self.peer_id, step)] = frame
        self.inner.publish(step, frame)


def _recode(
    frame: bytes,
    ident: Identity,
    plans: list[TensorPlan],
    cfg: DistroConfig,
    digest: bytes,
    change: Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    coding: ValueCoding | None = None,
) -> bytes:
    """Open ``frame``, change each tensor's (idx, val), code it again with the plan's codings (or
    ``coding``) and seal it with ``ident``: a well-formed, validly signed packet."""
    pkt = open_packet(frame, run_id=cfg.run_id, layout_digest=digest)
    shapes = [(p.layout.n_chunks, p.layout.chunk_numel) for p in plans]
    flat = decode_payload(pkt.payload, shapes)
    ex = cfg.extraction
    out: list[EncodedTensor] = []
    for t in flat.tensors():
        plan = plans[t.tensor_id]
        idx, val = change(t.tensor_id, t.idx.copy(), t.val.copy())
        vc = coding or (ex.dense_value_coding if plan.dense else ex.value_coding)
        enc, _ = encode_tensor(
            t.tensor_id, idx, val.astype(np.float32), plan.layout.chunk_numel, vc, ex.index_coding
        )
        out.append(enc)
    return seal_packet(ident, cfg.run_id, pkt.step, pkt.layout_digest, encode_payload(out))


def _attack(
    name: str,
    ident: Identity,
    plans: list[TensorPlan],
    cfg: DistroConfig,
    sent: dict[tuple[bytes, int], bytes],
    victims: list[bytes],
    digest: bytes,
) -> Callable[[int, bytes], bytes] | None:
    """The rewrite the hostile peer applies to each of its frames for attack ``name``."""
    rng = np.random.default_rng(7)

    def vals(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[int, bytes], bytes]:
        return lambda step, fr: _recode(fr, ident, plans, cfg, digest, lambda t, i, v: (i, f(v)))

    def rand_idx(t: int, i: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cn = plans[t].layout.chunk_numel
        j = np.argsort(rng.random((i.shape[0], cn)), axis=1)[:, : i.shape[1]]
        w = rng.standard_normal(v.shape).astype(np.float32)
        return j, w * (np.linalg.norm(v) / max(float(np.linalg.norm(w)), 1e-30))

    if name == "scale_1e6":
        return vals(lambda v: v * 1e6)
    if name == "max_float":
        return vals(lambda v: np.where(v < 0, -MAX_FLOAT, MAX_FLOAT).astype(np.float32))
    if name == "sign_flip":
        return vals(lambda v: -v)
    if name == "zeros":
        return vals(np.zeros_like)
    if name == "random_indices":
        return lambda step, fr: _recode(fr, ident, plans, cfg, digest, rand_idx)
    if name == "off_plan":  # fp32 values (the run codes int8), scaled up: more influence per packet
        return lambda step, fr: _recode(
            fr, ident, plans, cfg, digest, lambda t, i, v: (i, v * 1e3), ValueCoding.FP32
        )
    if name == "stale_replay":  # its own packet of the step before (step 0: the honest one)
        return lambda step, fr: sent.get((ident.peer_id, step - 1), fr)
    if name == "silent":  # the reference: the hostile peer's packets never count (stale from step 1)
        return lambda step, fr: sent.get((ident.peer_id, 0), fr) if step else fr
    if name in ("copy", "copy_one_victim"):  # re-signs an honest packet: the next victim's, or peer 0's

        def copy(step: int, fr: bytes) -> bytes:
            victim = victims[step % len(victims)] if name == "copy" else victims[0]
            return _recode(sent[(victim, step)], ident, plans, cfg, digest, lambda t, i, v: (i, v))

        return copy
    if name == "ground_leader_key":
        return vals(lambda v: v * 1e6)
    return None


def run_attack(
    attack: str,
    s: HostileSetting,
    *,
    combine: str = "clip",
    share_rounds: bool = True,
    keep_models: bool = False,
    audit: bool = True,
) -> dict[str, Any]:
    """One row: eight peers, peer 7 hostile under ``attack`` (module docstring). ``share_rounds=False``
    makes every replica combine each round on its own (the strict determinism test);
    ``keep_models`` adds the models under ``"_models"``."""
    cfg = preset(
        "ours_k32",
        lr=s.lr,
        total_steps=s.steps,
        warmup_steps=s.warmup,
        min_lr_ratio=s.min_lr_ratio,
        robust=combine,
    )
    task = _Task(s)
    hub = MemoryHub()
    cache = DecodeCache(max_entries=4 * N_PEERS, max_rounds=2 if share_rounds else 0)
    sent: dict[tuple[bytes, int], bytes] = {}
    idents = [
        Identity.from_seed(hashlib.sha256(f"hostile/{s.seed}/{i}".encode()).digest()) for i in range(N_PEERS)
    ]
    admitted = frozenset(i.peer_id for i in idents)
    if attack == "ground_leader_key":
        idents[HOSTILE] = Identity.from_seed(hashlib.sha256(b"hostile/fresh-never-admitted").digest())
    models, opts, exs = [], [], []
    leases = [i.peer_id for i in idents]
    for ident in idents:
        ex = _Recording(hub.join(ident.peer_id), sent)
        model = _model(s)
        opt = DistroOptimizer(
            model.named_parameters(),
            cfg,
            ex,
            ident,
            decode_cache=cache,
            admitted=admitted,
            roles=tensor_roles(model),
            auditor=_BatchAuditor(model, task, leases) if audit else None,
        )
        models.append(model)
        opts.append(opt)
        exs.append(ex)
    exs[HOSTILE].rewrite = _attack(
        attack,
        idents[HOSTILE],
        opts[0].plans,
        cfg,
        sent,
        [i.peer_id for i in idents[:HOSTILE]],
        opts[0].digest,
    )
    nonfinite = False
    t0 = time.perf_counter()
    for step in range(s.steps):
        for i, (model, opt) in enumerate(zip(models, opts, strict=True)):
            opt.zero_grad(set_to_none=True)
            x, y = task.batch(i, step)
            nn.functional.mse_loss(model(x), y).backward()
            opt.begin_step()
        for opt in opts:
            opt.finish_step()
        nonfinite = nonfinite or any(
            not bool(torch.isfinite(p).all()) for m in models[:HOSTILE] for p in m.parameters()
        )
    seconds = time.perf_counter() - t0
    row = _row(attack, task, models, opts, idents, s, nonfinite, seconds)
    if keep_models:
        row["_models"] = models
    return row


def _row(
    attack: str,
    task: _Task,
    models: list[nn.Module],
    opts: list[DistroOptimizer],
    idents: list[Identity],
    s: HostileSetting,
    nonfinite: bool,
    seconds: float,
) -> dict[str, Any]:
    hostile = idents[HOSTILE].peer_id
    guard = opts[0].guard
    guard.flush()
    credit = dict.fromkeys((i.peer_id for i in idents), 0)
    for _, peers in guard.final_credit:
        for p in peers:
            credit[p] += s.batch
    detected = None
    for rep in opts[0].reports:
        caught = hostile in rep.rejected or hostile in rep.flagged or hostile not in rep.combined
        if detected is None and caught:
            detected = rep.step
    cheats = set(guard.neutralised) | set(guard.provenance.convicted)
    cheats |= {p for rep in opts[0].reports for p in rep.rejected}
    for p in cheats:  # caught cheating (neutralised, or a packet rejected by rule): all credit is forfeit
        credit[p] = 0
    honest = [credit[i.peer_id] for i in idents[:HOSTILE]]
    return {
        "attack": attack,
        "val_loss": task.val_loss(models[0]),
        "nonfinite_applied": nonfinite,
        "neutralised_at_step": opts[0].guard.neutralised.get(hostile),
        "detected_at_step": detected,
        "rejected_as": sorted({r.rejected[hostile].name for r in opts[0].reports if hostile in r.rejected}),
        "hostile_credit": credit[hostile],
        "honest_credit": sum(honest) / len(honest),
        "verify_cost_share": sum(o.verify_seconds for o in opts) / seconds,
        "seconds": seconds,
    }


def _row_job(job: tuple[str, HostileSetting, str]) -> dict[str, Any]:
    torch.set_num_threads(1)
    return run_attack(job[0], job[1], combine=job[2])


def run_all(
    s: HostileSetting, attacks: tuple[str, ...] = ATTACKS, *, workers: int = 0
) -> list[dict[str, Any]]:
    """Every row; ``clean_val_loss`` and the ratios against the clean row are filled in. Rows are
    independent and deterministic, so they run in ``workers`` processes (0: up to 2, one per
    core; 1: in this process), each on one thread; the rows do not depend on it."""
    jobs = [("none", s, "clip"), ("none", s, "none"), ("silent", s, "clip")]
    jobs += [(a, s, "clip") for a in attacks if a != "none"]
    n = workers or min(2, os.cpu_count() or 1)
    if n == 1:
        done = [_row_job(j) for j in jobs]
    else:
        with multiprocessing.get_context("spawn").Pool(n) as pool:
            done = pool.map(_row_job, jobs, chunksize=1)
    clean, plain, silent, rest = done[0], done[1], done[2], done[3:]
    clean["plain_mean_val_loss"] = plain["val_loss"]
    rows = [clean, *rest]
    for r in rows:
        r["clean_val_loss"] = clean["val_loss"]
        r["seven_honest_val_loss"] = silent["val_loss"]
        r["val_loss_ratio"] = r["val_loss"] / clean["val_loss"]
        r["val_loss_ratio_seven_honest"] = r["val_loss"] / silent["val_loss"]
        r["honest_credit_ratio"] = r["honest_credit"] / clean["honest_credit"]
    return rows
