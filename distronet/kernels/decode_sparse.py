"""The sparse inverse of :func:`decode.decode_flat`: tensors whose summed ``k`` is small are
rebuilt from their few coefficients, not by a dense inverse of their whole buffer region.

A chunk with ``K`` coefficients is ``X_n = sum_j val_j * outer(D_r[u_j, :], D_c[v_j, :])``
(``u_j, v_j`` = row and column of coefficient ``j``; for 1-D chunks ``u_j = 0``, a row of 1):
one batched matrix product ``A_n^T B_n`` over the chunks, ``2 * K * chunk_numel`` flops per
chunk where the dense inverse takes ``2 * chunk_numel * (br + bc)``. At chunk 64 and ``K = 4``
that is 32x fewer; :func:`decode.choose_method` says where it pays.

:func:`sparse_tensors` applies it where :func:`decode.decode_sum` would: per tensor, when
``choose_method`` says ``sparse`` for its summed ``k`` and every payload that carries it carries
it at one common ``k``. The small tensors of one block shape that all qualify go through ONE
product (their chunks side by side), a big tensor through its own. The entries of chunk ``n``
are laid out as ``decode_sum`` stacks its parts (payload by payload, each payload's ``k`` in
its order) and the product is the same one per chunk, so every tensor comes out bit for bit as
``decode_sum`` gives it (``test_kernels_decode_flat.py`` holds this).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distronet.kernels.coding_payload import FlatPayload
from distronet.kernels.dct import dct_basis, tensor_from_blocks
from distronet.kernels.decode_plan import BatchPlan, _Group, split_1d
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch

__all__ = ["SPARSE_SMALL_COEFFICIENTS", "sparse_blocks", "sparse_limit", "sparse_tensors"]

SPARSE_MAX_K_BIG = 1 / 16
SPARSE_MAX_K_SMALL = 1 / 2
SPARSE_SMALL_COEFFICIENTS = 1 << 22
"""The sparse inverse is taken while the total ``K`` per chunk is at most ``SPARSE_MAX_K_SMALL *
bc`` for tensors of at most ``SPARSE_SMALL_COEFFICIENTS`` coefficients and ``SPARSE_MAX_K_BIG *
bc`` above. Measured on CPU (AMD EPYC, 1 thread, chunk 64, the 212 chunks of the built-in GPT's
matrices): the batched product takes 0.23 ms at K = 4, 0.41 at K = 16, 0.74 at K = 32 and 1.7 at
K = 64, the dense inverse 3.3 ms at any K. Machine D (docs/benchmarks.md, 2 threads, K = 32,
one part): sparse against dense 2.1 / 3.3 ms at 8192 x 256, 5.2 / 9.8 at 16384 x 256 (2^22
coefficients), 3.9 / 8.8 at 2048 x 2048, but 31.4 / 24.6 at 8192 x 1024 and 76 / 62 at
4096 x 4096, where both are memory-bound (equal at K = 4, dense ahead from K = 32). The bound
was 2^20 coefficients until 2^22 measured faster sparse (decisions/codec-in-step.md)."""


def sparse_limit(layout: ChunkLayout) -> int:
    """The largest summed ``K`` per chunk that :func:`decode.choose_method` inverts sparsely."""
    small = layout.n_coefficients <= SPARSE_SMALL_COEFFICIENTS
    return int((SPARSE_MAX_K_SMALL if small else SPARSE_MAX_K_BIG) * layout.block[-1])


def sparse_blocks(
    block: tuple[int, ...], idx: torch.Tensor, val: torch.Tensor, *, into_scratch: bool = False
) -> torch.Tensor:
    """Chunks ``(N, *block)`` (chunk order) from their coefficients: ``idx`` int64 ``(N, K)``
    (chunk-order positions), ``val`` ``(N, K)``; entries at one position add up.

    ``into_scratch``: the factors and the product live in this thread's scratch buffers
    (``workspace.scratch`` slots 3-5: no fresh memory, whose page faults cost a single packet's
    decode more than its product), valid until the next such call; the caller copies out."""
    n, kk = idx.shape
    dt, dev = val.dtype, val.device
    bc = block[-1]
    basis_c = dct_basis(bc, dt, dev)

    def buffer(slot: int, shape: tuple[int, ...]) -> torch.Tensor | None:
        return scratch(slot, shape, dt, dev) if into_scratch else None

    if len(block) == 1:
        a = val.unsqueeze(-1)  # (N, K, 1)
    else:
        rows = (idx // bc).reshape(-1)
        a = torch.index_select(dct_basis(block[0], dt, dev), 0, rows, out=buffer(3, (n * kk, block[0])))
        a = a.view(n, kk, -1).mul_(val.unsqueeze(-1))
    b = torch.index_select(basis_c, 0, (idx % bc).reshape(-1), out=buffer(4, (n * kk, bc))).view(n, kk, bc)
    out = buffer(5, (n, a.shape[2], bc))
    return torch.bmm(a.transpose(1, 2), b, out=out)  # (N, br, bc) or (N, 1, b)


def _entries(
    payloads: Sequence[FlatPayload], where: Sequence[np.ndarray], members: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(idx, val)`` ``(N, K)`` of ``members``' chunks (member by member), payload after payload
    along ``K``; None unless each payload carries all members or none, at one ``k`` in all of
    them, with ``0 < K <= limit``."""
    common, sel = 0, []
    for flat, w in zip(payloads, where, strict=True):
        js = w[members]
        if (js < 0).all():
            continue
        if (js < 0).any():
            return None
        ks = flat.k[js]
        k = int(ks[0])
        if common not in (0, k) or (ks != k).any():
            return None
        common = k
        sel.append((flat, js))
    if not sel or common * len(sel) > limit:
        return None
    idx, val = [], []
    for flat, js in sel:
        lens = flat.n[js] * common
        starts = flat.offsets[js]
        ends = np.cumsum(lens)
        pos = np.repeat(starts - (ends - lens), lens) + np.arange(int(ends[-1]))
        idx.append(flat.idx[pos].reshape(-1, common))
        val.append(flat.val[pos].reshape(-1, common))
    if len(sel) == 1:
        return idx[0], val[0]
    return np.concatenate(idx, axis=1), np.concatenate(val, axis=1)


def sparse_tensors(
    plan: BatchPlan, payloads: Sequence[FlatPayload], dt: torch.dtype, dev: torch.device
) -> dict[int, torch.Tensor]:
    """The tensors (by position in ``plan.layouts``) that :func:`decode.decode_sum` would invert
    sparsely and that qualify here (module doc), decoded; the others are left to the dense
    inverse. Results may share storage (disjoint views)."""
    out: dict[int, torch.Tensor] = {}
    if not payloads:
        return out
    where = []
    for flat in payloads:
        w = np.full(len(plan.layouts), -1, dtype=np.int64)
        w[flat.tensor_ids] = np.arange(flat.tensor_ids.size)
        where.append(w)
    units: list[tuple[tuple[int, ...], tuple[int, ...], _Group | None]]
    units = [(g.block, g.members, g if g.runs else None) for g in plan.groups]
    units += [(lay.block, (t,), None) for t, lay in enumerate(plan.layouts) if plan.big[t]]
    for block, members, group in units:
        got = _entries(
            payloads, where, np.array(members, dtype=np.int64), sparse_limit(plan.layouts[members[0]])
        )
        if got is None:
            continue
        idx = torch.from_numpy(got[0]).to(dev)
        val = torch.from_numpy(got[1]).to(device=dev, dtype=dt)
        one_d_group = len(block) == 1 and not plan.big[members[0]]
        blocks = sparse_blocks(block, idx, val, into_scratch=not one_d_group)
        if group is not None:
            _place_runs(plan, group, blocks, out)
        elif one_d_group:
            out.update(zip(members, split_1d(plan, members, blocks), strict=True))
        else:  # a big tensor: copied out of the scratch product
            (t,) = members
            x = tensor_from_blocks(blocks, plan.layouts[t])
            out[t] = x.clone() if x.untyped_storage().data_ptr() == blocks.untyped_storage().data_ptr() else x
    return out


def _place_runs(plan: BatchPlan, g: _Group, blocks: torch.Tensor, out: dict[int, torch.Tensor]) -> None:
    """The 2-D tensors of ``g`` from their chunk-order ``blocks`` (``(N, br, bc)``, member after
    member; may be scratch): per run (one padded column count) one permuted copy into fresh
    spatial-order memory, each result a view of it (padding sliced off): ``tensor_from_blocks``
    per tensor, without its per-tensor copy."""
    br, bc = g.block
    row = 0
    for run in g.runs:
        n = run.rows // br * (run.cols // bc)
        src = blocks[row : row + n].view(run.rows // br, run.cols // bc, br, bc).permute(0, 2, 1, 3)
        x = torch.empty((run.rows, run.cols), dtype=blocks.dtype, device=blocks.device)
        x.view(src.shape).copy_(src)  # always a copy: blocks may be scratch
        row += n
        at = 0
        for t in run.members:
            lay = plan.layouts[t]
            rows = lay.batch * lay.padded[0]
            y = x[at : at + rows].view(lay.batch, *lay.padded)
            if lay.is_padded:
                y = y[:, : lay.core[0], : lay.core[1]]
            out[t] = y.reshape(lay.shape)
            at += rows
