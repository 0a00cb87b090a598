"""Real training steps of a run's model on this machine: `distro-node doctor`'s step time.

The model is built from the run's ``ModelSpec`` exactly as a node builds it (seeded weights, no
download), trained by the node's own ``Trainer`` with the run's ``DistroOptimizer`` on random
tokens of the model's vocabulary. A step is what a node's step is: ``zero_grad``, forward and
backward in passes of ``micro_batch`` windows, then ``optimizer.step()`` — the gradient DCT into
the momentum, top-k, coding and sealing of the packet, then the round (the packet opened,
verified, decoded and applied). The round is this node's alone (an in-memory exchange of one
peer): the others' packets would add their decode, a scatter of theirs into the same buffer.
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
from distronet.node.models.spec import ModelSpec
from distronet.node.optim.config import DistroConfig
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.identity import Identity

__all__ = ["measure_steps", "node_batch"]


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
    exchange = MemoryHub().join(identity.peer_id)
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
    times: list[float] = []
    for step in range(plan.warmup + plan.steps):
        t0 = time.perf_counter()
        trainer.step(step)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= plan.warmup:
            times.append(time.perf_counter() - t0)
    total_steps = plan.warmup + plan.steps
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
        median_s=statistics.median(times),
        packet_bytes=round(exchange.stats.bytes_up / total_steps),
        peak_bytes=peak.peak(),
        peak_kind=peak.kind,
        usable_bytes=usable_bytes(device),
        estimate_bytes=None,  # FIT ESTIMATE: the lead wires models.fit.estimate(spec, ...) here
    )
