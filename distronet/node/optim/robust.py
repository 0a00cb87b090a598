"""Bounded influence: a round's accepted packets combined so that no one packet steers it.

Everything here is a pure function of the round's accepted payloads (peer-id order) and the
run's ``Robust`` options, in a fixed order of float operations, so every replica computes the
same thing bit for bit.

* ``packet_norms``: each packet's coefficient-space L2 norm, in float64 (a ±3.4e38 value squares
  to 1e77, finite in float64, so the norm of any decodable packet is finite or flagged as such).
* ``clip_scales``: per packet ``min(1, clip_multiple · median / norm)``. A packet at most
  ``clip_multiple`` × the median is left alone (scale exactly 1.0, its payload untouched: a clean
  round aggregates bit for bit as the plain mean), a larger one is scaled down to that bound. With
  ``n`` packets and ``h`` hostile ones, the hostile share of the sum is at most ``h·c`` medians.
  Catches: scaled-up, ±max-float and any over-long packet. Does not catch: a packet inside the
  bound that points the wrong way (``verify.py`` flags those over a window).
* ``trimmed``: coordinate-wise trimmed mean (or median) in coefficient space, for runs that ask
  for it. A coefficient a peer did not send counts as 0, so with sparse top-k packets the median
  of most coordinates is 0: it bounds influence hard but slows honest training (decision doc).
* ``scaled_round``: the round with each packet's values multiplied by its scale, ready for
  ``aggregate.round_sums`` (linear in the values, so scaling payloads scales contributions).
* ``finite_sums``: whether every summed tensor, and its sum of squares in float32, is finite: the
  condition under which the update rules (RMS, Adam, Newton–Schulz) stay finite.

Cost per round: one pass over every accepted value (norms), one float64 bincount over the
round's coefficients (cosines, trimmed modes), a few scalar operations per packet.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch

from distronet.kernels.coding import FlatPayload
from distronet.node.optim.packets import DecodedRound, TensorPlan

__all__ = [
    "clip_scales",
    "coefficient_bases",
    "fdot",
    "finite_sums",
    "global_index",
    "median",
    "packet_norms",
    "scaled_round",
    "trimmed_round",
]


def fdot(a: np.ndarray, b: np.ndarray) -> float:
    """``sum(a * b)`` of two 1-D float64 arrays by numpy's own pairwise summation, never BLAS.

    ``np.dot`` hands long vectors to OpenBLAS, which splits them over its threads (so the sum's
    order, and its last bits, follow the machine's core count: replicas must agree) and whose
    idle workers then spin for up to ~0.1 s on the cores torch computes on (measured: the Llama
    step's round decode 33 -> 15 ms once they stopped; docs/decisions/codec-in-step.md)."""
    return float(np.add.reduce(a * b))


def packet_norms(flats: Sequence[FlatPayload]) -> list[float]:
    """Each packet's coefficient-space L2 norm (float64 accumulation; ``inf`` only on overflow)."""
    out = []
    for f in flats:
        v = f.val.astype(np.float64)
        out.append(math.sqrt(fdot(v, v)))
    return out


def median(values: Sequence[float]) -> float:
    """The median of finite ``values`` (mean of the two middle ones for an even count); 0 when none."""
    xs = sorted(v for v in values if math.isfinite(v))
    if not xs:
        return 0.0
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def clip_scales(norms: Sequence[float], med: float, multiple: float) -> list[float]:
    """Per packet ``min(1, multiple · med / norm)``; exactly 1.0 when not clipped."""
    bound = multiple * med
    return [1.0 if n <= bound or n == 0.0 else bound / n for n in norms]


def scaled_round(
    dec: DecodedRound, keep: Sequence[int], scales: Sequence[float], salt: bytes
) -> DecodedRound:
    """``dec`` restricted to packets ``keep`` (indices, ascending), each packet's values multiplied
    by its scale in float32 (a scale of 1.0 leaves the payload object itself). The key mixes
    ``salt`` (what decided the selection) so rounds combined differently never share a cache slot."""
    flats = []
    for i, s in zip(keep, scales, strict=True):
        f = dec.flats[i]
        flats.append(
            f if s == 1.0 else dataclasses.replace(f, val=(f.val * np.float32(s)).astype(np.float32))
        )
    key = hashlib.sha256(dec.key + salt).digest() if dec.key else b""
    peers = tuple(dec.peers[i] for i in keep)
    return DecodedRound(dec.step, peers, tuple(flats), dec.rejected, key, dec.tensor_ids, dec.device)


def coefficient_bases(plans: Sequence[TensorPlan]) -> tuple[np.ndarray, int]:
    """Per tensor id, where its coefficients start in one flat coefficient vector; and its length."""
    sizes = [p.layout.n_chunks * p.layout.chunk_numel for p in plans]
    bases = np.zeros(len(plans), dtype=np.int64)
    if sizes:
        bases[1:] = np.cumsum(sizes[:-1])
    return bases, int(sum(sizes))


def global_index(flat: FlatPayload, bases: np.ndarray) -> np.ndarray:
    """Each value's position in the flat coefficient vector (``coefficient_bases``), int64."""
    reps = flat.n * flat.k
    base = np.repeat(bases[flat.tensor_ids], reps)
    tensor_start = np.repeat(flat.offsets[:-1], reps)
    pos = np.arange(len(flat.idx), dtype=np.int64) - tensor_start  # entry within its tensor
    row = pos // np.repeat(flat.k, reps)
    out: np.ndarray = base + row * np.repeat(flat.cn, reps) + flat.idx
    return out


def trimmed_round(
    dec: DecodedRound,
    keep: Sequence[int],
    gidx: Sequence[np.ndarray],
    plans: Sequence[TensorPlan],
    trim: int,
    salt: bytes,
) -> DecodedRound:
    """One dense payload whose values are ``len(keep)`` × the coordinate-wise trimmed mean of the
    kept packets (``trim`` largest and smallest dropped per coefficient; a coefficient a packet
    did not send is 0), so that ``round_sums / len(keep)`` is the trimmed mean. Sorting along the
    packet axis is deterministic, so replicas agree. Cost: a dense (packets, coefficients) matrix."""
    bases, total = coefficient_bases(plans)
    dense = np.zeros((len(keep), total), dtype=np.float32)
    for row, i in enumerate(keep):
        dense[row, gidx[i]] = dec.flats[i].val
    dense.sort(axis=0)
    t = min(trim, (len(keep) - 1) // 2)
    body = dense[t : len(keep) - t] if t else dense
    agg = (body.astype(np.float64).mean(axis=0) * len(keep)).astype(np.float32)
    n = np.array([p.layout.n_chunks for p in plans], dtype=np.int64)
    cn = np.array([p.layout.chunk_numel for p in plans], dtype=np.int64)
    offsets = np.concatenate([bases, [total]]).astype(np.int64)
    idx = np.concatenate([np.tile(np.arange(c, dtype=np.int64), int(m)) for m, c in zip(n, cn, strict=True)])
    flat = FlatPayload(np.arange(len(plans), dtype=np.int64), n, cn.copy(), cn, offsets, idx, agg)
    key = hashlib.sha256(dec.key + salt).digest() if dec.key else b""
    peers = tuple(dec.peers[i] for i in keep)
    return DecodedRound(dec.step, peers, (flat,), dec.rejected, key, dec.tensor_ids, dec.device)


def finite_sums(sums: Sequence[torch.Tensor]) -> bool:
    """Whether every tensor and its float32 sum of squares is finite (so RMS, Adam and
    Newton–Schulz stay finite on it)."""
    return all(bool(torch.isfinite(s.float().pow(2).sum())) for s in sums)
