"""Update rules: from the mean aggregate direction ``D`` of one tensor to its update ``U``.

Every rule returns a tensor of ``D``'s shape with RMS about 1 (sign has RMS exactly 1), so the
learning rates of different rules are comparable. All are deterministic on a given device.
"""

from __future__ import annotations

import math

import torch

from distronet.node.optim.config import UpdateRule

__all__ = [
    "ADAM_BETA2",
    "ADAM_EPS",
    "EPS",
    "NS_STEPS",
    "adam_normalise",
    "apply_rule",
    "newton_schulz",
    "rms_normalise",
]

# quintic Newton–Schulz coefficients (Muon): drive singular values towards ~1 in a few steps
_NS_A, _NS_B, _NS_C = 3.4445, -4.7750, 2.0315
NS_STEPS = 5
"""Newton–Schulz iterations of ``ORTHO``: Muon's choice, singular values within ~0.3 of 1."""
EPS = 1e-12
"""Guards the divisions of ``RMS`` and ``ORTHO`` against an all-zero aggregate."""
ADAM_BETA2 = 0.99
"""``ADAM``'s second-moment decay: forgets in ~100 rounds, short runs warm up quickly."""
ADAM_EPS = 1e-8
"""``ADAM``'s denominator floor (Adam's default)."""


def rms_normalise(d: torch.Tensor, eps: float) -> torch.Tensor:
    """``d / rms(d)``; zeros stay zeros."""
    rms = d.pow(2).mean().sqrt()
    return d / (rms + eps)


def newton_schulz(d: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    """Approximate orthogonalisation ``U Vᵀ`` of a 2-D ``d = U S Vᵀ`` (singular values ≈ 1).

    Cost: ``steps`` × three matrix products of the smaller side.
    """
    x = d / (d.norm() + eps)
    transpose = x.shape[0] > x.shape[1]
    if transpose:
        x = x.T
    for _ in range(steps):
        a = x @ x.T
        b = _NS_B * a + _NS_C * (a @ a)
        x = _NS_A * x + b @ x
    out: torch.Tensor = x.T if transpose else x
    return out


def adam_normalise(d: torch.Tensor, v: torch.Tensor, n: int, *, beta2: float, eps: float) -> torch.Tensor:
    """Update ``v`` in place (``v ← β₂·v + (1 − β₂)·d²``, the ``n``-th update) and return ``d / (√v̂ + ε)``."""
    v.mul_(beta2).addcmul_(d, d, value=1.0 - beta2)
    v_hat = v / (1.0 - beta2**n)
    return d / (v_hat.sqrt() + eps)


def apply_rule(
    rule: UpdateRule,
    d: torch.Tensor,
    *,
    ns_steps: int = NS_STEPS,
    eps: float = EPS,
    v: torch.Tensor | None = None,
    n: int = 1,
    beta2: float = ADAM_BETA2,
    adam_eps: float = ADAM_EPS,
) -> torch.Tensor:
    """The update for aggregate ``d`` under ``rule`` (RMS ≈ 1; ``ADAM`` needs ``v``, updated in place)."""
    if rule is UpdateRule.SIGN:
        return torch.sign(d)
    if rule is UpdateRule.ORTHO and d.dim() == 2 and min(d.shape) > 1:
        # an orthogonal (R, C) matrix has RMS 1/sqrt(max(R, C)): rescale to RMS 1
        return newton_schulz(d, ns_steps, eps) * math.sqrt(max(d.shape))
    if rule is UpdateRule.ADAM:
        if v is None:
            raise ValueError("the ADAM rule needs its second-moment buffer v")
        return adam_normalise(d, v, n, beta2=beta2, eps=adam_eps)
    return rms_normalise(d, eps)
