"""The codec's share of one real training step (`bench codec`'s step rows).

One peer trains the larger model (:func:`codec_tensors.llama_model`) with the real
``DistroOptimizer`` for a run of ``peers`` peers: each step is ``zero_grad`` + forward + backward
+ ``optimizer.step()`` (gradient DCT into the momentum, top-k, coding and sealing of its packet,
then the round: every frame opened and verified, judged, decoded and summed, the update rule
applied). The round's other ``peers - 1`` frames are real packets of the same step from other
identities, sealed before the step from this peer's momentum times ``1 + 0.2 * N(0, 1)`` noise
(so their indices and values differ as between peers); they are made outside the timed step.

The codec's time is measured inside that same step, by timing the optimizer's own calls to the
codec (``distro.dct_accumulate``, ``build_packet``, ``feed_back_all``, ``open_round``,
``round_sums``): encode = the gradient DCT into the momentum (``beta * m + DCT(g)``, one fused call)
+ ``build_packet`` (top-k, coding, sealing) + the error feedback (what was sent taken out of the
momentum), decode = ``open_round`` + ``round_sums``. (Until 2026-12-06 the error feedback, then a
per-tensor scatter outside these calls, was not counted.) Reported: medians over
the timed steps (after ``warmup`` untimed ones) of the step, the codec and their ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distronet.node.data import load_builtin_corpus
from distronet.node.exchange.base import Exchange, ExchangeStats, Round
from distronet.node.optim import distro
from distronet.node.optim.config import preset
from distronet.node.optim.packets import build_packet
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.identity import Identity

__all__ = ["StepShare", "step_share"]


@dataclass(frozen=True)
class StepShare:
    """Medians (ms) of one preset's training step and the codec's part of it."""

    config: str
    model: str
    params: int
    tensors: int
    tokens_per_step: int
    peers: int
    steps: int
    step_ms: float
    train_ms: float  # forward + backward
    codec_ms: float
    encode_ms: float
    decode_ms: float
    codec_share: float  # codec_ms / step_ms, per step, median


class _Round(Exchange):
    """This peer's exchange: its own frame plus the frames given for the step (no network)."""

    def __init__(self, me: bytes) -> None:
        self._me, self._stats = me, ExchangeStats()
        self.others: dict[bytes, bytes] = {}
        self._mine: dict[int, bytes] = {}

    @property
    def peer_id(self) -> bytes:
        return self._me

    @property
    def stats(self) -> ExchangeStats:
        return self._stats

    def publish(self, step: int, frame: bytes) -> None:
        self._mine[step] = frame
        self._stats.count_up(step, len(frame))

    def collect(self, step: int) -> Round:
        return Round(step, {self._me: self._mine.pop(step), **self.others})


@contextmanager
def _timing(sink: dict[str, float]) -> Iterator[None]:
    """Time the optimizer's calls to the codec into ``sink`` (seconds, summed per name)."""
    names = ("dct_accumulate", "build_packet", "feed_back_all", "open_round", "round_sums")
    saved = {n: getattr(distro, n) for n in names}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sink[name] = sink.get(name, 0.0) + time.perf_counter() - t0

        return timed

    for n, fn in saved.items():
        setattr(distro, n, wrap(n, fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(distro, n, fn)


def step_share(
    name: str,
    model: torch.nn.Module,
    *,
    presets: tuple[str, ...] = ("ours_k32", "ours_k4_1bit"),
    peers: int = 4,
    steps: int = 5,
    warmup: int = 2,
    batch: int = 8,
    seq_len: int = 128,
    seed: int = 0,
) -> list[StepShare]:
    """One row per preset (module doc); ``model`` is trained in place from its current weights."""
    from distronet.node.models.build import model_loss

    tokens = load_builtin_corpus().train
    rows = []
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for pname in presets:
        model.load_state_dict(initial)
        cfg = preset(pname)
        me = Identity.from_seed(bytes([1]) * 32)
        others = [Identity.from_seed(bytes([i + 2]) * 32) for i in range(peers - 1)]
        ex = _Round(me.peer_id)
        opt = distro.DistroOptimizer(model.named_parameters(), cfg, ex, me, roles=tensor_roles(model))
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        samples: dict[str, list[float]] = {}
        for step in range(warmup + steps):
            starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch)
            win = np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64)
            x, y = torch.from_numpy(win[:, :-1]), torch.from_numpy(win[:, 1:])
            with torch.no_grad():  # the other peers' frames of this step, untimed
                momenta = [m * (1 + 0.2 * torch.randn(m.shape, generator=gen)) for m in opt._momenta()]
                ex.others = {
                    o.peer_id: build_packet(opt.plans, momenta, cfg, opt.step_index, o, opt.digest)[0]
                    for o in others
                }
            sink: dict[str, float] = {}
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            model_loss(model, x, y).backward()
            t1 = time.perf_counter()
            with _timing(sink):
                opt.step()
            t2 = time.perf_counter()
            if step < warmup:
                continue
            enc = sum(sink.get(n, 0.0) for n in ("dct_accumulate", "build_packet", "feed_back_all"))
            dec = sink.get("open_round", 0.0) + sink.get("round_sums", 0.0)
            for key, v in (
                ("step", t2 - t0),
                ("train", t1 - t0),
                ("enc", enc),
                ("dec", dec),
                ("codec", enc + dec),
                ("share", (enc + dec) / (t2 - t0)),
            ):
                samples.setdefault(key, []).append(v)
        med = {k: statistics.median(v) for k, v in samples.items()}
        params = list(model.parameters())
        rows.append(
            StepShare(
                config=f"{name} step {pname} ({peers} peers)",
                model=name,
                params=sum(p.numel() for p in params),
                tensors=len(params),
                tokens_per_step=batch * seq_len,
                peers=peers,
                steps=steps,
                step_ms=1e3 * med["step"],
                train_ms=1e3 * med["train"],
                codec_ms=1e3 * med["codec"],
                encode_ms=1e3 * med["enc"],
                decode_ms=1e3 * med["dec"],
                codec_share=med["share"],
            )
        )
    model.load_state_dict(initial)
    return rows
