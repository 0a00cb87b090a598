"""Per-chunk top-k by magnitude, torch backend, and the fused DCT + top-k used to encode.

Contract of every function here: ``idx`` is int64 ``(n_chunks, k)``, sorted ascending within
each chunk, no duplicates; ``val`` holds the coefficients at ``idx`` (with their sign), and they
are the ``k`` largest by ``|c|`` in the chunk (ties broken arbitrarily).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from distronet.kernels.dct import forward_chunks, forward_spatial, work_dtype
from distronet.kernels.fanout import map_in_order
from distronet.kernels.jit_state import use_jit
from distronet.kernels.layout import ChunkLayout
from distronet.kernels.workspace import scratch
from distronet.protocol.errors import KernelError

__all__ = [
    "SEGMENTS",
    "check_k",
    "dct_select_compiled",
    "dct_topk",
    "segment_length",
    "select_compiled",
    "topk_chunks",
    "topk_magnitude",
]

SEGMENTS = (4, 8, 16, 32, 64, 128, 256)
"""Segment lengths the two-stage selection may use."""


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


def segment_length(bc: int, chunk_numel: int, k: int) -> int | None:
    """The segment length of the two-stage selection, or None when a plain top-k is as cheap.

    The two stages select among ``chunk_numel / g`` segment maxima, then among ``k * g``
    candidates; ``g`` (a power of two dividing ``bc``) minimises their sum.
    """
    best: tuple[int, int] | None = None
    for g in SEGMENTS:
        if bc % g == 0 and chunk_numel // g >= k:
            cost = chunk_numel // g + k * g
            if best is None or cost < best[0]:
                best = (cost, g)
    return best[1] if best is not None and 2 * best[0] <= chunk_numel else None


@functools.lru_cache(maxsize=256)
def _segment_tables(
    shape: tuple[int, int, int, int, int], g: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``y5.view(-1, g)``: segment number = base[chunk] + local[segment id within the chunk]."""
    _b, _gr, br, gc, bc = shape
    nb = bc // g
    n = torch.arange(_b * _gr * gc, device=device)
    s = torch.arange(br * nb, device=device)
    base = ((n // gc) * br * gc + n % gc) * nb
    return base.unsqueeze(1), (s // nb) * (gc * nb) + s % nb


def _two_stage(
    y5: torch.Tensor, k: int, g: int, chunk_tables: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of ``|y|`` per chunk of spatial coefficients ``y5`` ``(B, gr, br, gc, bc)`` (contiguous).

    Stage 1 keeps the ``k`` segments (runs of ``g`` along ``bc``) with the largest ``max |y|``;
    every one of the chunk's ``k`` largest ``|y|`` lies in one of them (a value outside would be
    <= the k-th segment maximum <= the k-th largest value: only a tie). Stage 2 is a top-k over
    those ``k * g`` candidates. Costs one pass writing ``|y|`` (into scratch) and one reading it,
    plus selections over ``chunk_numel / g + k * g`` values per chunk instead of all of them.
    Within a chunk, segment ``s`` holds coefficient indices ``s * g .. s * g + g - 1``;
    ``chunk_tables`` (``base``, ``local``) map a chunk's coefficient index to its position in ``y5``.
    """
    b, gr, br, gc, bc = y5.shape
    nb, n_chunks = bc // g, b * gr * gc
    mag = scratch(0, tuple(y5.shape), y5.dtype, y5.device)
    torch.abs(y5, out=mag)
    smax = mag.view(b, gr, br, gc, nb, g).amax(-1).permute(0, 1, 3, 2, 4).reshape(n_chunks, br * nb)
    sidx = torch.topk(smax, k, dim=1, sorted=False).indices  # (N, k) segment ids within a chunk
    base, local = _segment_tables((b, gr, br, gc, bc), g, y5.device)
    seg_pos = base + local[sidx]  # (N, k) segment numbers in mag.view(-1, g)
    j = torch.topk(mag.view(-1, g)[seg_pos].view(n_chunks, k * g), k, dim=1, sorted=False).indices
    # Candidate (s, t) is coefficient s * g + t of its chunk; keep the k chosen, in order.
    cand_idx = (sidx * g).unsqueeze(-1) + torch.arange(g, device=y5.device)
    idx = cand_idx.view(n_chunks, k * g).gather(1, j).sort(dim=1).values
    base, local = chunk_tables
    return idx, y5.reshape(-1)[base + local[idx]]


JIT_SEGMENTS = (64, 32, 16, 8, 4, 2, 1)
"""Segment lengths of the compiled selection, longest first. It takes the longest with at least
``4 k`` segments per chunk (else the longest with ``k``): measured on the Llama's and the built-in
GPT's real momentum in chunk order (chunks of 64 x 64, one thread, machine B), segments of 64 at
k = 4 (3.3-3.7 us a chunk; 8: 6.4-6.7) and of 32 at k = 32 (5.8; 64: 6.3-6.7, 8: 7.8-7.9)."""

JIT_MIN_K = 1
"""The compiled selection runs from this k up: every k. Measured in chunk order (the DCT's output
since :func:`dct.forward_chunks`), 2 torch threads, machine B while shared, medians of 7: the
Llama's 1,332 chunks of 64 x 64 6.3 ms against the torch two-stage's 7.3 at k = 4, 8.1 against
15.5 at k = 32; the built-in GPT's 320 1.15 against 1.36 at k = 4, 0.99 against 2.27 at k = 32."""


JIT_PIECE = 64
"""Chunks per piece of a compiled selection handed to the helper threads (fewer run inline)."""


def _jit_segment(br: int, bc: int, k: int) -> int:
    """The compiled selection's segment length (:data:`JIT_SEGMENTS`): it divides ``bc``."""
    fits = [g for g in JIT_SEGMENTS if bc % g == 0 and br * bc // g >= k]
    return next((g for g in fits if br * bc // g >= 4 * k), fits[0])


def _select_compiled(y5: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`topk_jit.select` of a CPU float32 ``y5`` once the compiled code is warm
    (:func:`jit_state.use_jit`), else None; None too for a NaN (the torch path then runs).

    The chunks are cut into pieces of about :data:`JIT_PIECE` run on this thread and torch's
    other threads' worth of helpers (:func:`fanout.map_in_order`; the compiled loop holds no GIL).
    Each piece writes only its own rows of the result, and a piece computed twice (the caller
    redoing one a helper has not finished) writes the same values there."""
    if k < JIT_MIN_K or not use_jit() or y5.device.type != "cpu" or y5.dtype != torch.float32:
        return None
    if not y5.is_contiguous():
        return None
    from distronet.kernels.topk_jit import OK, select

    b, gr, br, gc, bc = y5.shape
    g = _jit_segment(br, bc, k)
    y = y5.detach().numpy().reshape(-1)
    bits = y.view(np.uint32)
    n = b * gr * gc
    idx, val = np.empty((n, k), dtype=np.int64), np.empty((n, k), dtype=np.float32)
    pieces = max(1, min(n // JIT_PIECE, 4 * torch.get_num_threads()))

    def piece(p: int) -> int:
        lo, hi = n * p // pieces, n * (p + 1) // pieces
        return int(select(bits, y, 0x7F800000, b, gr, br, gc, bc, k, g, lo, hi, idx, val))

    if any(code != OK for code in map_in_order(piece, pieces, torch.get_num_threads())):
        return None
    return torch.from_numpy(idx), torch.from_numpy(val)


def select_compiled(y5: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top-``k`` of every chunk of a spatial ``(b, gr, br, gc, bc)`` float32 CPU buffer, chunk
    order (chunk ``n = (b * gr + r) * gc + c``), by the compiled selection; None where it does
    not run (not warm, another device or dtype, a NaN): the caller then takes
    :func:`topk_chunks` of the chunk-order coefficients, which decides what a NaN gives."""
    return _select_compiled(y5, k)


DCT_PIECE_CHUNKS = 64
"""About this many chunks (whole block rows) per piece of :func:`dct_select_compiled`."""


def dct_select_compiled(
    xs: Sequence[torch.Tensor], layouts: Sequence[ChunkLayout], k: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``topk_chunks`` of the DCT of every chunk of ``xs`` (tensor after tensor, chunk order) by
    :func:`topk_jit.dct_select` (transform and selection in one compiled loop), or None where it
    does not apply: the compiled code not warm, a tensor not float32 on the CPU, a block other
    than ``topk_jit.B`` square, or a NaN among the coefficients (the caller then takes the matrix
    products, which decide what a NaN gives).

    Block rows are cut into pieces of about :data:`DCT_PIECE_CHUNKS` chunks run on this thread
    and torch's other threads' worth of helpers (:func:`fanout.map_in_order`; the compiled loop
    holds no GIL); each piece writes only its own rows of the result, the same values whoever
    runs it."""
    from distronet.kernels.topk_jit import OK, B, dct_select, factors

    if not use_jit() or any(lay.block != (B, B) for lay in layouts):
        return None
    if any(x.device.type != "cpu" or x.dtype != torch.float32 for x in xs):
        return None
    n = sum(lay.n_chunks for lay in layouts)
    idx, val = np.empty((n, k), dtype=np.int64), np.empty((n, k), dtype=np.float32)
    g = _jit_segment(1, B * B, k)
    cs, sc = factors()
    pieces: list[tuple[np.ndarray, int, int, int, int, int]] = []
    row = 0
    for x, lay in zip(xs, layouts, strict=True):
        x3 = x.detach().contiguous().numpy().reshape(lay.batch, *lay.core)
        (gr, gc), blocks = lay.grid, lay.n_chunks // lay.grid[1]
        step = max(1, DCT_PIECE_CHUNKS // gc)
        pieces += [(x3, gr, gc, q, min(q + step, blocks), row) for q in range(0, blocks, step)]
        row += lay.n_chunks

    def piece(p: int) -> int:
        x3, gr, gc, q0, q1, r0 = pieces[p]
        return int(dct_select(x3, gr, gc, cs, sc, k, g, q0, q1, r0, idx, val))

    if any(code != OK for code in map_in_order(piece, len(pieces), torch.get_num_threads())):
        return None
    return torch.from_numpy(idx), torch.from_numpy(val)


def _select(
    y5: torch.Tensor, k: int, chunk_numel: int, chunk_tables: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    fast = _select_compiled(y5, k)
    if fast is not None:
        return fast
    g = segment_length(y5.shape[-1], chunk_numel, k)
    if g is None:
        return None
    if chunk_tables is None:  # chunk order: position = chunk * chunk_numel + index
        n = y5.shape[0] * y5.shape[1] * y5.shape[3]
        rows = torch.arange(n, device=y5.device).unsqueeze(1) * chunk_numel
        chunk_tables = (rows, torch.arange(chunk_numel, device=y5.device))
    return _two_stage(y5, k, g, chunk_tables)


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
    with torch.no_grad():
        c = c.contiguous()
        fast = _select(c.view(c.shape[0], 1, 1, 1, c.shape[1]), k, c.shape[1])
        if fast is not None:
            return fast
        idx = topk_magnitude(c.abs(), k)
        return idx, torch.gather(c, 1, idx)


def dct_topk(x: torch.Tensor, layout: ChunkLayout, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk_chunks(dct_chunks(x, layout), k)`` with the coefficients in a scratch buffer: a rank
    >= 2 tensor is transformed straight into chunk order (:func:`dct.forward_chunks`), where the
    selection reads each chunk contiguously.

    Raises:
        KernelError: as :func:`dct_chunks` and :func:`topk_chunks`.
    """
    check_k(k, layout.chunk_numel)
    with torch.no_grad():
        if len(layout.block) == 1:
            return topk_chunks(forward_spatial(x, layout, into_scratch=True), k)
        if tuple(x.shape) == layout.shape and (fast := dct_select_compiled([x], [layout], k)) is not None:
            return fast
        return topk_chunks(forward_chunks([x], [layout]).view(layout.n_chunks, layout.chunk_numel), k)
