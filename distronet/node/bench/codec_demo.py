"""The DeMo reference compression (bloc97/DeMo, as published), re-implemented as our baseline.

Written from the published algorithm, not copied; it keeps the reference's formulation on
purpose, inefficiencies included, because benchmarks measure ours against it:

* chunk size per dim = the largest divisor of the dim that is <= the target (so a prime dim
  is cut in runs of 1), basis matrices built per chunk size;
* encode: rearrange ``(y h) (x w) -> y h x w`` (a view), then one 3-operand ``einsum`` with the
  DCT basis on both sides (``...ijkl, jb, ld -> ...ikbd``); 1-D tensors: ``(x w)`` and a
  2-operand ``einsum``;
* compress: flatten each block (``y x h w -> y x (h w)``), ``topk`` of ``|c|`` (unsorted),
  ``gather`` the values; int64 indices, fp32 values (96 bits per coefficient);
* decode: scatter the values into zeros with ``scatter_reduce_(..., "mean",
  include_self=False)`` (several peers' packets are concatenated first), then the inverse basis
  on both sides with ``einsum`` and the rearrange back.

The basis matrices are the orthonormal DCT-II (the reference derives them by running its
FFT-based DCT over an identity matrix; the matrices are the same up to rounding).
Only tensors of rank 1 and 2 are handled, as in the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distronet.kernels.dct import basis_numpy
from distronet.protocol.errors import KernelError

__all__ = ["DemoReference", "smaller_split"]


def smaller_split(n: int, target: int) -> int:
    """The reference's chunk size for a dim of ``n``: the largest divisor of ``n`` <= ``target``."""
    best = 1
    for d in range(1, min(n, target) + 1):
        if n % d == 0:
            best = d
    return best


class DemoReference:
    """DeMo's TransformDCT + CompressDCT for one tensor shape (rank 1 or 2) and target chunk.

    Bases live on ``device`` in ``dtype`` (fp32 in the reference). ``encode`` returns the
    reference's packet ``(idx int64, val fp32)`` of shape ``(y, x, k)`` (2-D) or ``(x, k)`` (1-D).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        target_chunk: int = 64,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if len(shape) not in (1, 2) or any(n < 1 for n in shape):
            raise KernelError(f"the DeMo reference handles rank-1 and rank-2 tensors, got {shape}")
        self.shape = tuple(shape)
        self.split = tuple(smaller_split(n, target_chunk) for n in shape)
        # f[j, b]: basis function b at position j (the reference's `_dct(eye)`); b = its inverse.
        self.fwd = {n: torch.tensor(basis_numpy(n).T, dtype=dtype, device=device) for n in set(self.split)}
        self.inv = {n: f.T.contiguous() for n, f in self.fwd.items()}
        self.dtype, self.device = dtype, torch.device(device)

    @property
    def chunk_numel(self) -> int:
        """Coefficients per chunk."""
        return int(np.prod(self.split))

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """DCT per chunk: ``(y, x, h, w)`` for 2-D, ``(x, w)`` for 1-D."""
        if len(self.shape) == 2:
            h, w = self.split
            xb = x.reshape(self.shape[0] // h, h, self.shape[1] // w, w)  # "(y h) (x w) -> y h x w"
            return torch.einsum("...ijkl, jb, ld -> ...ikbd", xb, self.fwd[h], self.fwd[w])
        (w,) = self.split
        return torch.einsum("...ij, jb -> ...ib", x.reshape(-1, w), self.fwd[w])

    def inverse(self, c: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`transform`, back to ``shape``."""
        if len(self.shape) == 2:
            h, w = self.split
            xb = torch.einsum("...ijkl, kb, ld -> ...ibjd", c, self.inv[h], self.inv[w])
            return xb.reshape(self.shape)  # "y h x w -> (y h) (x w)"
        (w,) = self.split
        return torch.einsum("...ij, jb -> ...ib", c, self.inv[w]).reshape(self.shape)

    def compress(self, c: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k by magnitude per chunk (unsorted), the reference's clamp of ``k`` to [1, numel]."""
        flat = c.reshape(*c.shape[:-2], -1) if c.dim() > 2 else c  # "y x h w -> y x (h w)"
        k = max(1, min(k, flat.shape[-1]))
        idx = torch.topk(flat.abs(), k=k, dim=-1, largest=True, sorted=False).indices
        return idx, torch.gather(flat, -1, idx)

    def decompress(self, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
        """Scatter (mean of duplicates) into zero coefficients shaped as :meth:`transform` returns."""
        if len(self.shape) == 2:
            h, w = self.split
            cshape: tuple[int, ...] = (self.shape[0] // h, self.shape[1] // w, h, w)
        else:
            cshape = (self.shape[0] // self.split[0], self.split[0])
        c = torch.zeros(cshape, dtype=self.dtype, device=self.device)
        flat = c.reshape(*cshape[:-2], -1) if len(cshape) > 2 else c
        flat.scatter_reduce_(-1, idx, val, reduce="mean", include_self=False)
        return c

    def encode(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensor to the reference packet ``(idx, val)``."""
        return self.compress(self.transform(x), k)

    def decode(self, packets: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Packets (concatenated along k, as the reference's batch decompress) to a dense tensor."""
        idx = torch.cat([p[0] for p in packets], dim=-1)
        val = torch.cat([p[1] for p in packets], dim=-1)
        return self.inverse(self.decompress(idx, val))

    @staticmethod
    def to_bytes(idx: torch.Tensor, val: torch.Tensor) -> bytes:
        """The reference's wire form: raw int64 indices then raw fp32 values."""
        return idx.to(torch.int64).numpy().tobytes() + val.to(torch.float32).numpy().tobytes()

    def from_bytes(self, data: bytes, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inverse of :meth:`to_bytes` for this shape and ``k``."""
        lead = (
            (self.shape[0] // self.split[0], self.shape[1] // self.split[1])
            if len(self.shape) == 2
            else (self.shape[0] // self.split[0],)
        )
        n = int(np.prod(lead)) * k
        if len(data) != 12 * n:
            raise KernelError(f"reference packet of {len(data)} bytes, expected {12 * n}")
        idx = torch.from_numpy(np.frombuffer(data, dtype=np.int64, count=n).copy()).view(*lead, k)
        val = torch.from_numpy(np.frombuffer(data, dtype=np.float32, offset=8 * n).copy()).view(*lead, k)
        return idx, val
