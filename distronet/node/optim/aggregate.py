"""A round's aggregate: every tensor's sum of the accepted packets, decoded in one pass.

``decode_sum`` per tensor (what the optimizer ran before) costs, per tensor and per accepted
packet, a few tensor views, a numpy conversion and a compiled call, and an inverse per tensor:
with the default GPT's 53 tensors that is ~200 small calls for a round of 4 packets.
:func:`round_sums` decodes the whole round with ``decode_flat`` instead: one compiled pass that
builds the first product of every tensor's inverse from all packets' entries (packet by packet,
peer-id order), and one second product per block shape. The sums are the same products and
additions in the same order and the second product the same one, so each tensor comes out bit
for bit as ``decode_sum`` gives it (tests hold this).

``decode_sum`` picks a sparse inverse when a tensor's summed k is small (``choose_method``), and
``decode_flat`` takes the same one for such tensors when every packet carries them at one k
(``decode_sparse``); any tensor whose inverse the two would not share, and every tensor on
another device than the CPU, still goes through ``decode_sum``, so results never change.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from distronet.kernels.decode import choose_method, decode_flat_methods, decode_sum
from distronet.node.optim.packets import DecodedRound, TensorPlan

__all__ = ["round_sums"]


def round_sums(dec: DecodedRound, plans: Sequence[TensorPlan], device: torch.device) -> list[torch.Tensor]:
    """Per plan (plans in tensor-id order, ids ``0..T-1``), the sum of the accepted packets' parts
    as a float32 tensor of the parameter's shape on ``device``: ``decode_sum(plan.layout,
    dec.parts[tid])`` bit for bit (module doc). Tensors of one call may share storage (disjoint
    views). Cost on the CPU: one pass over every packet's entries and one product per block
    shape (dense), or one batched product per block shape (sparse), plus ``decode_sum`` for a
    tensor whose inverse ``decode_flat`` would not share.
    """
    if any(p.tensor_id != i for i, p in enumerate(plans)):
        raise ValueError("plans must be in tensor-id order, ids 0..T-1")
    totals = dec.total_k()
    want = [choose_method(p.layout, totals.get(p.tensor_id, 0)) for p in plans]
    out: list[torch.Tensor | None] = [None] * len(plans)
    if device.type == "cpu" and dec.flats:
        batch, took = decode_flat_methods(
            [p.layout for p in plans], dec.flats, dtype=torch.float32, device=device
        )
        for i, x in enumerate(batch):
            if took[i] == want[i]:
                out[i] = x
    return [
        x
        if x is not None
        else decode_sum(p.layout, dec.parts.get(p.tensor_id, []), dtype=torch.float32, device=device)
        for p, x in zip(plans, out, strict=True)
    ]
