"""DCT + top-k of many tensors at once: one transform and one selection per block shape.

:func:`dct_topk_groups` is ``[dct_topk(x, layout, k) for each tensor]`` with the per-tensor
fixed costs paid once per block shape, as :func:`decode_plan.invert` does on the way back:
tensors of at most :data:`~distronet.kernels.decode_plan.SMALL_COEFFICIENTS` coefficients are
copied, chunk by chunk, into ONE chunk-order buffer per ``(block shape, k)`` (one permuted copy
each), transformed there by one pair of matrix products (``C_n = D_r X_n D_c^T`` for every chunk
``n``, :func:`~distronet.kernels.dct.forward_chunks`) and selected by one ``topk_chunks``; larger
tensors go alone through :func:`~distronet.kernels.topk.dct_topk` (the same transform and
selection, one tensor). The result is a list of
:class:`TopkGroup`, each a stacked ``(N, k)`` pair ready for the payload coder
(:func:`distronet.kernels.coding_batch.encode_groups`), with no per-tensor split or restack.

Same coefficients as the per-tensor transform up to float rounding (a product over a batch of
chunks may take another BLAS kernel than one over a tensor's slab), so the same selection except
where two coefficients are within rounding of each other; the wire format does not depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from distronet.kernels.dct import dct_basis, forward_chunks, work_dtype
from distronet.kernels.decode_plan import SMALL_COEFFICIENTS
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.topk import check_k, dct_select_compiled, dct_topk, topk_chunks
from distronet.protocol.errors import KernelError

__all__ = ["TopkGroup", "dct_topk_groups"]


@dataclass(frozen=True)
class TopkGroup:
    """Tensors ``members`` (positions in the caller's list) stacked: member ``j`` owns rows
    ``sum(rows[:j]) .. sum(rows[:j + 1])`` of ``idx`` int64 ``(N, k)`` and ``val`` ``(N, k)``
    (``dct_topk``'s contract per row)."""

    members: tuple[int, ...]
    rows: tuple[int, ...]
    chunk_numel: int
    idx: torch.Tensor
    val: torch.Tensor


def _group_topk(
    xs: Sequence[torch.Tensor], layouts: Sequence[ChunkLayout], block: tuple[int, ...], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the DCT of every chunk of tensors of one block shape, stacked ``(N, k)``.

    Rank <= 1: the chunks as rows, one product. Rank >= 2: every tensor's chunks side by side in
    one chunk-order buffer (:func:`dct.forward_chunks`: one product for the columns, one batched
    product for the rows), read in place by the selection.
    """
    dt, dev = work_dtype(xs[0].dtype), xs[0].device
    n = sum(lay.n_chunks for lay in layouts)
    if len(block) == 1:  # one concatenation (zeros where a tensor's last chunk is padded)
        flat: list[torch.Tensor] = []
        for x, lay in zip(xs, layouts, strict=True):
            flat.append(x.detach().reshape(-1).to(dt))
            if lay.is_padded:
                flat.append(torch.zeros(lay.grid[0] * block[0] - lay.numel, dtype=dt, device=dev))
        buf = torch.cat(flat).view(n, block[0])
        return topk_chunks(torch.mm(buf, dct_basis(block[0], dt, dev).T), k)
    fast = dct_select_compiled(xs, layouts, k)
    if fast is not None:
        return fast
    return topk_chunks(forward_chunks(xs, layouts).view(n, block[0] * block[1]), k)


def dct_topk_groups(
    tensors: Sequence[torch.Tensor], layouts: Sequence[ChunkLayout], ks: Sequence[int]
) -> list[TopkGroup]:
    """The top-``ks[i]`` DCT coefficients of every chunk of ``tensors[i]`` (``layouts[i].shape``),
    grouped (module doc). Every tensor is in exactly one group; groups are in order of their
    first member. Raises ``KernelError`` as :func:`dct_topk` does."""
    if not len(tensors) == len(layouts) == len(ks):
        raise KernelError(f"{len(tensors)} tensors, {len(layouts)} layouts, {len(ks)} k's")
    small: dict[tuple[tuple[int, ...], int], list[int]] = {}
    order: list[tuple[tuple[int, ...], int] | int] = []
    for i, (x, lay, k) in enumerate(zip(tensors, layouts, ks, strict=True)):
        check_k(k, lay.chunk_numel)
        if tuple(x.shape) != lay.shape:
            raise KernelError(f"tensor {i} has shape {tuple(x.shape)}, the layout expects {lay.shape}")
        if lay.n_coefficients > SMALL_COEFFICIENTS:
            order.append(i)
            continue
        key = (lay.block, k)
        if key not in small:
            small[key] = []
            order.append(key)
        small[key].append(i)
    out = []
    with torch.no_grad():
        for item in order:
            if isinstance(item, int):
                lay = layouts[item]
                idx, val = dct_topk(tensors[item], lay, ks[item])
                out.append(TopkGroup((item,), (lay.n_chunks,), lay.chunk_numel, idx, val))
                continue
            block, k = item
            members = small[item]
            lays = [layouts[i] for i in members]
            idx, val = _group_topk([tensors[i] for i in members], lays, block, k)
            rows = tuple(lay.n_chunks for lay in lays)
            out.append(TopkGroup(tuple(members), rows, lays[0].chunk_numel, idx, val))
    return out
