"""Per-chunk top-k by magnitude, torch backend, and the fused DCT + top-k used to encode.

Contract of every function here: ``idx`` is int64 ``(n_chunks, k)``, sorted ascending within
each chunk, no duplicates; ``val`` holds the coefficients at ``idx`` (with their sign), and they
are the ``k`` largest by ``|c|`` in the chunk (ties broken arbitrarily).
"""

from __future__ import annotations

import torch

from distronet.kernels.dct import dct_spatial, spatial_index, work_dtype
from distronet.kernels.layout import ChunkLayout
from distronet.protocol.errors import KernelError

__all__ = ["check_k", "dct_topk", "topk_chunks", "topk_magnitude"]


def check_k(k: int, chunk_numel: int) -> None:
    """Raise :class:`KernelError` unless ``1 <= k <= chunk_numel``."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= chunk_numel:
        raise KernelError(f"k must be an int in [1, {chunk_numel}], got {k!r}")


def topk_magnitude(a: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(rows, k)`` of the ``k`` largest entries of each row of ``a`` (``a >= 0``), sorted.

    Cost: one partial selection per row plus a sort of ``k`` per row.
    """
    if k == a.shape[1]:
        return torch.arange(k, device=a.device).expand(a.shape[0], k).contiguous()
    idx = torch.topk(a, k, dim=1, largest=True, sorted=False).indices
    return idx.sort(dim=1).values


def topk_chunks(c: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest-magnitude coefficients of each chunk of ``c`` ``(n_chunks, chunk_numel)``.

    Returns ``(idx, val)`` as the module contract says; ``val`` has ``c``'s dtype.

    Raises:
        KernelError: ``c`` is not 2-D floating, or ``k`` is outside ``[1, chunk_numel]``.
    """
    if c.dim() != 2:
        raise KernelError(f"coefficients must be (n_chunks, chunk_numel), got shape {tuple(c.shape)}")
    work_dtype(c.dtype)
    check_k(k, c.shape[1])
    idx = topk_magnitude(c.abs(), k)
    return idx, torch.gather(c, 1, idx)


def dct_topk(x: torch.Tensor, layout: ChunkLayout, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_chunks(dct_chunks(x, layout), k)`` without materialising chunk-order coefficients.

    The magnitudes are written straight into chunk order (the permute and the ``abs`` share
    one pass) and the values are gathered from the spatial-order coefficients.

    Raises:
        KernelError: as :func:`dct_chunks` and :func:`topk_chunks`.
    """
    check_k(k, layout.chunk_numel)
    y = dct_spatial(x, layout)
    if len(layout.block) == 1:
        return topk_chunks(y, k)
    (gr, gc), (br, bc) = layout.grid, layout.block
    mag = torch.empty((layout.batch, gr, gc, br, bc), dtype=y.dtype, device=y.device)
    torch.abs(y.view(layout.batch, gr, br, gc, bc).permute(0, 1, 3, 2, 4), out=mag)
    idx = topk_magnitude(mag.view(layout.n_chunks, layout.chunk_numel), k)
    val = y.reshape(-1)[spatial_index(idx, layout)]
    return idx, val
