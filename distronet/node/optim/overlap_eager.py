"""The ``"eager"`` overlap lookahead: the last round with this peer's part swapped for its fresh one.

In overlap mode the round of step t is still in flight while step t + 1 computes, so the model
stands at the consensus minus a guess of that round's update (``DistroOptimizer._set_lookahead``).
``overlap_predict="own"`` guesses with the rule applied to this peer's own packet for step t
alone; ``"eager"`` (after the eager updates of overlapped DiLoCo, Kale et al. 2025) applies the
rule to the aggregate this peer would see if its own part were fresh and the other peers' parts
one step late:

    D_eager = (S_{t-1} − own_{t-1} + own_t) / n      S_{t-1}: sum of round t − 1's accepted packets

with n the number of parts in the sum (round t − 1's count, plus one when this peer's packet was
not in it). Every input is already on this replica: round t − 1's mean aggregate (shared, read
only) and this peer's packets of steps t − 1 and t. The guess only moves the parameters at which
the next gradient is taken; the consensus copy is untouched, so replicas stay bit-identical there.
"""

from __future__ import annotations

import dataclasses

import torch

from distronet.kernels.decode import decode_sum
from distronet.node.optim.packets import SentTensor, TensorPlan

__all__ = ["EagerBase"]


@dataclasses.dataclass(frozen=True)
class EagerBase:
    """The last applied round as the eager guess needs it.

    ``means``: per tensor (plan order) the round's mean aggregate, or ``None`` for an empty round;
    never modified (they may be shared with other in-process replicas). ``own``: this peer's
    packet in that round (empty when it did not count). ``n``: the round's accepted count.
    """

    means: tuple[torch.Tensor | None, ...]
    own: tuple[SentTensor, ...]
    n: int

    @classmethod
    def of(
        cls,
        plans: list[TensorPlan],
        shared: dict[tuple[int, str], torch.Tensor],
        own_sent: list[SentTensor],
        n: int,
    ) -> EagerBase:
        """From a just-applied round (``shared`` holds its ``(tensor_id, "d")`` aggregates)."""
        means = tuple(shared.get((pl.tensor_id, "d")) if n else None for pl in plans)
        return cls(means, tuple(own_sent), n)

    def mix(self, plan: TensorPlan, p: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        """``D_eager`` of one tensor (module docstring); ``fresh`` = this peer's decoded packet for
        the step in flight (same shape as the aggregate). Returns a new tensor. Cost: one sparse
        decode of the old own packet, three element-wise passes."""
        i = plan.tensor_id
        mean = self.means[i] if i < len(self.means) else None
        if mean is None:
            return fresh
        total = mean * float(self.n)
        count = self.n
        if self.own:
            old = self.own[i]
            total -= decode_sum(plan.layout, [(old.idx, old.val)], dtype=torch.float32, device=p.device)
            count -= 1
        out: torch.Tensor = (total + fresh) / float(count + 1)
        return out
