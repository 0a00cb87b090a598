"""Pure numeric kernels of the DisTrO/DeMo codec: chunked DCT, top-k, decode-sum (torch backend).

The plain numpy reference of the transforms lives in :mod:`distronet.kernels.numpy_ref`; the
payload codec (coefficients to wire bytes and back: one encoder, one ``decode_payload``) in
:mod:`distronet.kernels.coding`. Names here load lazily, so importing a numpy-only
submodule does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distronet.kernels.dct import dct_basis, dct_chunks, idct_chunks
    from distronet.kernels.decode import decode_flat, decode_sum, scatter_sum
    from distronet.kernels.layout import ChunkLayout, plan_layout
    from distronet.kernels.topk import dct_topk, topk_chunks

__all__ = [
    "ChunkLayout",
    "dct_basis",
    "dct_chunks",
    "dct_topk",
    "decode_flat",
    "decode_sum",
    "idct_chunks",
    "plan_layout",
    "scatter_sum",
    "topk_chunks",
]

_HOME = {
    "ChunkLayout": "layout",
    "plan_layout": "layout",
    "dct_basis": "dct",
    "dct_chunks": "dct",
    "idct_chunks": "dct",
    "dct_topk": "topk",
    "topk_chunks": "topk",
    "decode_sum": "decode",
    "decode_flat": "decode",
    "scatter_sum": "decode",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"distronet.kernels.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
