"""Per-chunk top-k: sorted indices, the largest magnitudes, fused path equals the plain one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.kernels import numpy_ref
from distronet.kernels.dct import dct_chunks
from distronet.kernels.layout import plan_layout
from distronet.kernels.topk import dct_topk, topk_chunks
from distronet.protocol.errors import KernelError


@pytest.mark.parametrize("k", [1, 4, 32, 64])
def test_topk_contract(k: int) -> None:
    c = torch.randn(50, 64, generator=torch.Generator().manual_seed(k))
    idx, val = topk_chunks(c, k)
    assert idx.dtype == torch.int64 and idx.shape == (50, k) and val.shape == (50, k)
    assert bool((idx[:, 1:] > idx[:, :-1]).all())  # sorted ascending, no duplicates
    torch.testing.assert_close(val, torch.gather(c, 1, idx))  # signed values at idx
    # The k largest magnitudes: the smallest kept |c| is >= every dropped |c|.
    kept = torch.zeros_like(c, dtype=torch.bool).scatter_(1, idx, True)
    dropped_max = c.abs().masked_fill(kept, -1).amax(1)
    assert bool((val.abs().amin(1) >= dropped_max).all())


def test_topk_matches_numpy() -> None:
    c = np.random.default_rng(3).standard_normal((30, 48)).astype(np.float32)
    i_np, v_np = numpy_ref.topk_chunks(c, 5)
    i_t, v_t = topk_chunks(torch.from_numpy(c), 5)
    np.testing.assert_array_equal(i_t.numpy(), i_np)
    np.testing.assert_array_equal(v_t.numpy(), v_np)


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=0, max_size=4).map(tuple),
    chunk=st.integers(2, 16),
    k=st.integers(1, 8),
)
def test_fused_equals_plain(shape: tuple[int, ...], chunk: int, k: int) -> None:
    lay = plan_layout(shape, chunk)
    k = min(k, lay.chunk_numel)
    x = torch.randn(shape, dtype=torch.float64)
    i1, v1 = topk_chunks(dct_chunks(x, lay), k)
    i2, v2 = dct_topk(x, lay, k)
    # Random data has no ties, so both pick the same set.
    torch.testing.assert_close(i2, i1)
    torch.testing.assert_close(v2, v1)


def test_k_equal_chunk_numel_sends_everything() -> None:
    c = torch.randn(3, 16)
    idx, val = topk_chunks(c, 16)
    assert bool((idx == torch.arange(16)).all())
    torch.testing.assert_close(val, c)


@pytest.mark.parametrize("k", [0, 17, -1, 2.0, True])
def test_bad_k_raises(k: int) -> None:
    with pytest.raises(KernelError):
        topk_chunks(torch.randn(3, 16), k)
    with pytest.raises(KernelError):
        dct_topk(torch.randn(4, 4), plan_layout((4, 4), 4), k)


def test_bad_coefficients_raise() -> None:
    with pytest.raises(KernelError):
        topk_chunks(torch.randn(16), 2)
    with pytest.raises(KernelError):
        topk_chunks(torch.arange(16).view(2, 8), 2)
    with pytest.raises(KernelError):
        numpy_ref.topk_chunks(np.zeros((2, 8)), 9)
