"""Real training steps of a run's model on this machine: `distro-node doctor`'s step time.

The model is built from the run's ``ModelSpec`` exactly as a node builds it (seeded weights, no
download), trained by the node's own ``Trainer`` with the run's ``DistroOptimizer`` on random
tokens of the model's vocabulary. A step is what a node's step is: ``zero_grad``, forward and
backward in passes of ``micro_batch`` windows, then ``optimizer.step()`` — the gradient DCT into
the momentum, top-k, coding and sealing of the packet, then the round (the packet opened,
verified, decoded and applied) over an in-memory exchange. The round holds, besides this node's
packet, the packets of ``min(peers, MAX_GHOSTS)`` others: real packets of the run's plan, sealed
by identities of their own before the timed steps, so each step opens, verifies and decodes them
as a node's step in such a round does.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import torch

from distronet.node.backends import ComputeBackend
from distronet.node.daemon.trainer import Trainer
from distronet.node.doctor.machine import PeakMemory, usable_bytes
from distronet.node.doctor.verdict import StepPlan, StepTime
from distronet.node.exchange.memory import MemoryHub
from distronet.node.models.build import build_model, set_checkpointing
from distronet.node.models.fit import estimate
from distronet.node.models.spec import ModelSpec
from distronet.node.optim.config import DistroConfig
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.packets import build_packet
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.identity import Identity

__all__ = ["MAX_GHOSTS", "measure_steps", "node_batch"]

MAX_GHOSTS = 8  # the others' packets decoded in each timed step, at most (each costs an encode first)


def node_batch(spec: ModelSpec, peers: int) -> int:
    """The windows this node trains on a step: the run's ``batch``, or with ``global_batch`` its
    share among ``peers`` others and itself (rounded up)."""
    if spec.global_batch:
        return max(1, math.ceil(spec.global_batch / (peers + 1)))
    return spec.batch


def measure_steps(
    spec: ModelSpec, dcfg: DistroConfig, backend: ComputeBackend, plan: StepPlan, *, peers: int, source: str
) -> StepTime:
    """Train ``plan.warmup + plan.steps`` real steps of ``spec``'s model on ``backend``; their
    times (median), peak memory against what is usable, and the packet's size. Raises
    ``ConfigError`` for a model this node cannot build (e.g. ``hf`` without transformers)."""
    device = backend.device
    model = build_model(spec, device)
    if plan.checkpointing or spec.checkpointing:
        set_checkpointing(model)
    identity = Identity.generate()
    exchange_hub = MemoryHub()
    exchange = exchange_hub.join(identity.peer_id)
    optimizer = DistroOptimizer(model.named_parameters(), dcfg, exchange, identity, roles=tensor_roles(model))
    rows = node_batch(spec, peers)
    rng = np.random.default_rng(spec.seed)

    def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = rng.integers(0, spec.vocab, size=(rows, spec.seq_len + 1), dtype=np.int64)
        return tokens[:, :-1], tokens[:, 1:]

    micro = spec.micro_batch_for(plan.micro_batch)
    trainer = Trainer(model, optimizer, batches, backend, micro)
    peak = PeakMemory(device)
    peak.start()
    for step in range(plan.warmup):
        trainer.step(step)
    warm_peak = peak.peak()
    ghosts = min(peers, MAX_GHOSTS)
    timed = range(plan.warmup, plan.warmup + plan.steps)
    frames = _ghost_frames(optimizer, dcfg, ghosts, timed, spec.seed)  # before the timed steps' peak
    peak.start()
    times: list[float] = []
    for step in timed:
        for ghost, frame in frames[step]:
            exchange_hub.upload(step, ghost, frame)  # the others' packets of this round
        t0 = time.perf_counter()
        trainer.step(step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    arch = "gpt" if spec.gpt is not None else f"hf:{spec.hf_config()['model_type']}"
    return StepTime(
        model=arch,
        source=source,
        params=sum(p.numel() for p in model.parameters()),
        batch=rows,
        seq_len=spec.seq_len,
        micro_batch=micro if micro and micro < rows else 0,
        warmup=plan.warmup,
        times_s=tuple(times),
        decoded_peers=len(optimizer.reports[-1].accepted) - 1,  # the others the last round counted
        median_s=statistics.median(times),
        packet_bytes=round(exchange.stats.bytes_up_by_step[plan.warmup]),
        peak_bytes=max(warm_peak, peak.peak()),
        peak_kind=peak.kind,
        usable_bytes=usable_bytes(device),
        estimate_bytes=estimate(
            spec,
            dcfg,
            micro_batch=micro if micro and micro < rows else 0,
            checkpointing=bool(plan.checkpointing or spec.checkpointing),
            device=device.type,
            precision=backend.precision,
        ).total,
    )


def _ghost_frames(
    optimizer: DistroOptimizer, dcfg: DistroConfig, ghosts: int, steps: range, seed: int
) -> dict[int, list[tuple[bytes, bytes]]]:
    """``ghosts`` other peers' sealed packets for each of ``steps``: real packets of the run's
    plan, each from its own identity, coded from this node's momentum times ``1 + 0.2 N(0, 1)``
    (so indices and values differ as between peers). Made before the timed steps, untimed."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = [Identity.generate() for _ in range(ghosts)]
    out: dict[int, list[tuple[bytes, bytes]]] = {s: [] for s in steps}
    with torch.no_grad():
        for step in steps:
            for ident in ids:
                momenta = [
                    m * (1 + 0.2 * torch.randn(m.shape, generator=gen).to(m.device))
                    for m in optimizer._momenta()
                ]
                frame = build_packet(optimizer.plans, momenta, dcfg, step, ident, optimizer.digest)[0]
                out[step].append((ident.peer_id, frame))
    return out
