"""``DistroConfig``: every knob of the DisTrO optimizer, frozen, with named presets.

Presets (``preset(name, **overrides)``):

* ``demo_reference`` — DeMo as published (``bloc97/DeMo``): β 0.999, chunk 64, k 32, fp32 values,
  fixed-width indices, the learning rate inside the momentum (``m ← β·m + lr·g``), sign of the
  inverse-transformed aggregate.
* ``psyche`` — Psyche's production settings: β 0.995, k 4, 1-bit values, sign update.
* ``ours_k32`` / ``ours_k4_1bit`` — our configurations (chosen side by side on the convergence
  benchmark, docs/decisions/): β 0.95, exact error feedback, 1-D tensors (norms, biases)
  sent dense (k=32) / target chunk 48 with 1-D tensors top-k like the rest (k=4), Muon-style
  orthogonalised update of the hidden matrices and an Adam-normalised update (second moment of
  the aggregate, identical on every replica) for embeddings, the output head and 1-D tensors.

Update rules (``UpdateRule``), applied to the mean aggregate ``D`` of one tensor:

* ``SIGN``: ``sign(D)`` (DeMo).
* ``RMS``: ``D / rms(D)`` — keeps relative magnitudes, same RMS (1) as sign.
* ``ADAM``: ``D / (sqrt(v̂) + ε)`` with ``v ← β₂·v + (1 − β₂)·D²`` kept per element (identical on
  every replica, since every replica sees the same ``D``): Adam's normalisation of the aggregate.
* ``ORTHO``: for hidden 2-D matrices Newton–Schulz orthogonalisation (Muon) scaled to RMS 1;
  tensors whose name contains one of ``ortho_skip`` (embeddings, output head) and tensors of
  rank != 2 use ``fallback``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

from distronet.kernels.coding import IndexCoding, ValueCoding
from distronet.protocol.errors import ConfigError

__all__ = ["PACKET_BYTES_DEFAULT_GPT", "PRESETS", "DistroConfig", "UpdateRule", "lr_at", "preset"]


class UpdateRule(str, enum.Enum):
    """How the aggregated direction becomes the parameter update (module docstring)."""

    SIGN = "sign"
    RMS = "rms"
    ADAM = "adam"
    ORTHO = "ortho"


@dataclasses.dataclass(frozen=True)
class DistroConfig:
    """The DisTrO optimizer's configuration. Invalid values raise ``ConfigError``.

    Learning rate: ``lr`` is the peak; linear warm-up over ``warmup_steps``, then ``decay``
    (``"cosine"``, ``"linear"`` or ``"constant"``) down to ``min_lr_ratio * lr`` at
    ``total_steps`` (0 = no decay).

    Extraction: each tensor is cut into chunks (``chunk``); momentum lives in DCT space; the
    ``k`` largest coefficients per chunk travel, coded with ``value_coding``/``index_coding``.
    Tensors with ``numel <= dense_max_numel`` (or of rank <= 1 when ``dense_1d``) travel dense
    (every coefficient, no index bits) with ``dense_value_coding``. ``k_start`` > ``k`` starts
    with a larger k and decays it linearly to ``k`` over ``k_decay_steps``.

    Overlap (``overlap``): rounds apply one step late from step ``overlap_start`` on (earlier
    steps run synchronously); ``overlap_lookahead`` stands in a guess of the update in flight,
    scaled by ``overlap_scale`` (in [0, 2]); ``overlap_predict`` says which: ``"last"`` (the
    previous update) or ``"own"`` (the rule applied to this peer's own packet for that step) or
    ``"ema"`` (a running mean of the applied updates with factor ``overlap_ema``) or ``"eager"``
    (the rule applied to the last round's aggregate with this peer's part swapped for its fresh
    packet: its own contribution fresh, the other peers' one step late; ``overlap_eager.py``).

    Outer momentum (``outer_momentum`` μ > 0): every replica keeps the same buffer of the mean
    aggregates, ``M ← μ·M + D`` (replicated state, parameter shape), and the update rule is
    applied to ``M`` — or, with ``outer_nesterov``, to ``D + μ·M`` — instead of ``D``. At small
    k each round's aggregate is sparse and noisy; ``M`` carries it across rounds.
    """

    lr: float = 1e-3
    beta: float = 0.999
    chunk: int = 64
    k: int = 32
    value_coding: ValueCoding = ValueCoding.FP32
    index_coding: IndexCoding = IndexCoding.FIXED
    lr_in_momentum: bool = False
    update: UpdateRule = UpdateRule.SIGN
    weight_decay: float = 0.0
    dense_1d: bool = False
    dense_max_numel: int = 0
    dense_value_coding: ValueCoding = ValueCoding.FP32
    k_start: int = 0
    k_decay_steps: int = 0
    warmup_steps: int = 0
    total_steps: int = 0
    decay: str = "cosine"
    min_lr_ratio: float = 0.1
    overlap: bool = False
    overlap_lookahead: bool = True
    overlap_predict: str = "last"
    overlap_ema: float = 0.9
    overlap_scale: float = 1.0
    overlap_start: int = 0
    outer_momentum: float = 0.0
    outer_nesterov: bool = False
    ns_steps: int = 5
    beta2: float = 0.99
    adam_eps: float = 1e-8
    fallback: UpdateRule = UpdateRule.RMS
    ortho_skip: tuple[str, ...] = ("wte", "wpe", "lm_head", "embed", "head")
    eps: float = 1e-12
    run_id: str = "local"

    def __post_init__(self) -> None:
        _check(math.isfinite(self.lr) and self.lr > 0, f"lr must be a positive number, got {self.lr}")
        _check(0.0 <= self.beta < 1.0, f"beta must be in [0, 1), got {self.beta}")
        _check(1 <= self.chunk <= 4096, f"chunk must be in [1, 4096], got {self.chunk}")
        _check(self.k >= 1, f"k must be >= 1, got {self.k}")
        _check(self.k_start == 0 or self.k_start >= self.k, "k_start must be 0 or >= k")
        _check(self.k_decay_steps >= 0, "k_decay_steps must be >= 0")
        _check(self.weight_decay >= 0.0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _check(self.dense_max_numel >= 0, "dense_max_numel must be >= 0")
        _check(self.warmup_steps >= 0 and self.total_steps >= 0, "warmup_steps/total_steps must be >= 0")
        _check(self.decay in ("cosine", "linear", "constant"), f"unknown decay {self.decay!r}")
        _check(
            self.overlap_predict in ("last", "own", "ema", "eager"),
            f"unknown overlap_predict {self.overlap_predict!r}",
        )
        _check(0.0 <= self.overlap_ema < 1.0, f"overlap_ema must be in [0, 1), got {self.overlap_ema}")
        _check(0.0 <= self.overlap_scale <= 2.0, f"overlap_scale must be in [0, 2], got {self.overlap_scale}")
        _check(self.overlap_start >= 0, f"overlap_start must be >= 0, got {self.overlap_start}")
        _check(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _check(0.0 <= self.outer_momentum < 1.0, f"outer_momentum not in [0, 1): {self.outer_momentum}")
        _check(1 <= self.ns_steps <= 20, f"ns_steps must be in [1, 20], got {self.ns_steps}")
        _check(self.eps > 0 and self.adam_eps > 0, "eps and adam_eps must be > 0")
        _check(0.0 <= self.beta2 < 1.0, f"beta2 must be in [0, 1), got {self.beta2}")
        _check(bool(self.run_id), "run_id must not be empty")
        for name, enum_type in (
            ("value_coding", ValueCoding),
            ("index_coding", IndexCoding),
            ("dense_value_coding", ValueCoding),
            ("update", UpdateRule),
            ("fallback", UpdateRule),
        ):
            value = getattr(self, name)
            if not isinstance(value, enum_type):
                try:
                    object.__setattr__(
                        self,
                        name,
                        enum_type[value]
                        if isinstance(value, str) and value in enum_type.__members__
                        else enum_type(value),
                    )
                except (KeyError, ValueError) as e:
                    raise ConfigError(f"{name}: unknown value {value!r}") from e
        _check(self.fallback is not UpdateRule.ORTHO, "fallback cannot be ORTHO")

    def k_at(self, step: int) -> int:
        """The top-k per chunk used at ``step`` (the k schedule)."""
        if not self.k_start or step >= self.k_decay_steps:
            return self.k
        frac = step / max(1, self.k_decay_steps)
        return max(self.k, round(self.k_start + (self.k - self.k_start) * frac))


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(f"DistroConfig: {msg}")


def lr_at(cfg: DistroConfig, step: int) -> float:
    """The learning rate at ``step`` (0-based): linear warm-up, then the configured decay."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if not cfg.total_steps or cfg.decay == "constant":
        return cfg.lr
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    frac = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    floor = cfg.min_lr_ratio
    if cfg.decay == "linear":
        return cfg.lr * (1.0 - (1.0 - floor) * frac)
    return cfg.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * frac)))


_OURS: dict[str, Any] = dict(
    lr=2e-3,
    beta=0.95,
    chunk=64,
    index_coding=IndexCoding.ENTROPY,
    update=UpdateRule.ORTHO,
    fallback=UpdateRule.ADAM,
    dense_1d=True,
    warmup_steps=20,
)
"""What our presets share: Muon-style orthogonalised update on hidden matrices, an Adam-normalised
aggregate elsewhere, 1-D tensors sent dense, entropy-coded indices (docs/decisions/optimizer-presets.md)."""

PRESETS: dict[str, dict[str, Any]] = {
    "demo_reference": dict(
        beta=0.999,
        chunk=64,
        k=32,
        value_coding=ValueCoding.FP32,
        index_coding=IndexCoding.FIXED,
        lr_in_momentum=True,
        update=UpdateRule.SIGN,
    ),
    "psyche": dict(
        beta=0.995,
        chunk=64,
        k=4,
        value_coding=ValueCoding.SIGN1,
        index_coding=IndexCoding.FIXED,
        update=UpdateRule.SIGN,
    ),
    # Ours: the two presets differ in k, β and the value coding (sent and dense tensors).
    "ours_k32": dict(_OURS, k=32, value_coding=ValueCoding.INT8, dense_value_coding=ValueCoding.INT8),
    # k=4 spends the 1,000x byte budget on density: target chunk 48 (32x32 and 48x32 blocks, ~4x
    # the coefficients of 64x64 ones) and 1-D tensors top-k too (sent dense at 1 bit they were a
    # third of the packet); the denser extraction drains the residual faster, so β 0.95 (4x600,
    # seed 0: 1.9578 vs 2.1064 for chunk 64 + dense 1-D + β 0.98; docs/decisions/k4-density.md).
    "ours_k4_1bit": dict(
        _OURS,
        k=4,
        beta=0.95,
        chunk=48,
        dense_1d=False,
        value_coding=ValueCoding.SIGN1,
        dense_value_coding=ValueCoding.SIGN1,
    ),
}
"""Named presets: field overrides on top of ``DistroConfig``'s defaults."""


def preset(name: str, **overrides: Any) -> DistroConfig:
    """The named preset with ``overrides`` applied. Raises ``ConfigError`` for an unknown name/field."""
    if name not in PRESETS:
        raise ConfigError(f"unknown optimizer preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    fields = {f.name for f in dataclasses.fields(DistroConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ConfigError(f"unknown DistroConfig field(s): {', '.join(bad)}")
    return DistroConfig(**{**PRESETS[name], **overrides})


PACKET_BYTES_DEFAULT_GPT: dict[str, int] = {
    "demo_reference": 50_386,
    "psyche": 2_259,
    "ours_k32": 21_691,
    "ours_k4_1bit": 4_951,
}
"""Sealed packet bytes per step of each preset on the default GPT (875,264 parameters, Gaussian
gradients; a test holds them within 10 %). A fp32 ring all-reduce over 4 peers uploads
5,251,584 bytes per peer per step: ``psyche`` is 2,325x smaller, ``ours_k4_1bit`` 1,061x
(about 1,055x in training, as ``bench converge`` measures it)."""
