"""How a tensor is cut into DCT chunks: a pure function of (shape, chunk), part of the wire contract.

The chunking rule (every implementation must follow it exactly, since a packet's coefficient
indices mean nothing without it):

* Rank 0 is treated as a 1-D tensor of length 1.
* Rank 1, shape ``(n,)``: the dim is cut in runs of ``b = block_size(n, s)``; chunk ``g`` holds
  elements ``g*b .. g*b+b-1`` (the last run zero-padded when the dim is padded).
* Rank >= 2, shape ``(*lead, R, C)``: the leading dims are a batch (``B = prod(lead)``, 1 when
  there are none); the last two dims are cut in ``br x bc`` blocks with ``br = block_size(R, s)``
  and ``bc = block_size(C, s)``. Chunks are numbered row-major over ``(batch, block row, block
  column)``; within a chunk the coefficient ``(u, v)`` (u along R, v along C) has index
  ``u * bc + v``.
* ``block_size(n, s)``:
    1. ``n <= s``: ``n`` (the whole dim is one block; nothing padded);
    2. else the largest divisor ``d`` of ``n`` with ``ceil(s / 2) <= d <= s`` (no padding);
    3. else ``s``, and the dim is zero-padded at its end up to ``ceil(n / s) * s``.
  So a dim is never cut into blocks smaller than half the target: a prime dim longer than
  ``s`` is padded instead.

``chunk_numel`` is ``br * bc`` for rank >= 2 (``s * s`` when both dims are multiples of ``s``)
and ``b`` for rank <= 1. Padding exists only in coefficient space: the inverse drops it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from distronet.protocol.errors import KernelError

__all__ = ["MAX_CHUNK", "MAX_RANK", "ChunkLayout", "block_size", "plan_layout"]

MAX_CHUNK = 4096
"""The largest chunk size ``s`` a layout accepts (a DCT basis is ``s x s``)."""

MAX_RANK = 8
"""The largest tensor rank a layout accepts."""


def block_size(n: int, s: int) -> int:
    """The block length for a dim of length ``n`` at target chunk ``s`` (rule in the module doc).

    Cost: O(s) integer divisions.
    """
    if n <= s:
        return n
    for d in range(s, (s + 1) // 2 - 1, -1):
        if n % d == 0:
            return d
    return s


@dataclass(frozen=True)
class ChunkLayout:
    """The chunking of one tensor shape at one target chunk size (derived sizes computed once: the
    decode reads them per tensor per round).

    Attributes:
        shape: the tensor's shape (``()`` for a scalar).
        chunk: the target chunk size ``s``.
        block: the block lengths: ``(b,)`` for rank <= 1, ``(br, bc)`` for rank >= 2.
        grid: blocks per chunked dim: ``(g,)`` or ``(gr, gc)``.
        batch: the product of the leading (batch) dims; 1 for rank <= 2.
        n_chunks: ``batch * prod(grid)``.
        chunk_numel: ``prod(block)``; coefficient indices are in ``[0, chunk_numel)``.
    """

    shape: tuple[int, ...]
    chunk: int
    block: tuple[int, ...]
    grid: tuple[int, ...]
    batch: int
    n_chunks: int
    chunk_numel: int

    @functools.cached_property
    def numel(self) -> int:
        """Elements of the tensor itself (1 for a scalar)."""
        return math.prod(self.shape)

    @functools.cached_property
    def padded(self) -> tuple[int, ...]:
        """The chunked dims after padding: ``(g*b,)`` or ``(gr*br, gc*bc)``."""
        return tuple(g * b for g, b in zip(self.grid, self.block, strict=True))

    @functools.cached_property
    def is_padded(self) -> bool:
        """True when some chunked dim is zero-padded."""
        return self.padded != self.core

    @functools.cached_property
    def core(self) -> tuple[int, ...]:
        """The chunked dims before padding: ``(n,)`` or ``(R, C)``."""
        if len(self.shape) == 0:
            return (1,)
        return self.shape[-2:] if len(self.shape) >= 2 else self.shape

    @functools.cached_property
    def n_coefficients(self) -> int:
        """``n_chunks * chunk_numel``: the size of the coefficient space."""
        return self.n_chunks * self.chunk_numel


def plan_layout(shape: tuple[int, ...], chunk: int) -> ChunkLayout:
    """Plan the chunking of a tensor of ``shape`` at target chunk size ``chunk``.

    Raises:
        KernelError: ``chunk`` outside ``[1, MAX_CHUNK]``, a dim < 1, or rank > ``MAX_RANK``.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise KernelError(f"chunk must be an int in [1, {MAX_CHUNK}], got {chunk!r}")
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise KernelError(f"shape must be a tuple of ints, got {shape!r}") from e
    if len(dims) > MAX_RANK:
        raise KernelError(f"rank {len(dims)} over the limit {MAX_RANK}")
    if any(d < 1 for d in dims):
        raise KernelError(f"every dim must be >= 1, got shape {dims}")
    core = dims[-2:] if len(dims) >= 2 else (dims or (1,))
    block = tuple(block_size(n, chunk) for n in core)
    grid = tuple(-(-n // b) for n, b in zip(core, block, strict=True))
    batch = math.prod(dims[:-2]) if len(dims) > 2 else 1
    return ChunkLayout(
        shape=dims,
        chunk=chunk,
        block=block,
        grid=grid,
        batch=batch,
        n_chunks=batch * math.prod(grid),
        chunk_numel=math.prod(block),
    )
