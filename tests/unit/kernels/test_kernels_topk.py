"""Per-chunk top-k: sorted indices, the largest magnitudes, fused path equals the plain one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.kernels import numpy_ref, topk
from distronet.kernels.coding import warm
from distronet.kernels.dct import dct_chunks
from distronet.kernels.encode import dct_topk_groups
from distronet.kernels.layout import plan_layout
from distronet.kernels.topk import dct_topk, segment_length, topk_chunks
from distronet.protocol.errors import KernelError

# Up to two batch dims of 1..3, then up to two dims of 1..40: every rank 0..4, kept small.
SMALL_SHAPES = st.tuples(
    st.lists(st.integers(1, 3), max_size=2), st.lists(st.integers(1, 40), max_size=2)
).map(lambda t: tuple(t[0] + t[1]) if t[1] else tuple(t[1]))


def _assert_valid_topk(c: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, k: int) -> None:
    assert idx.dtype == torch.int64 and idx.shape == (c.shape[0], k) and val.shape == (c.shape[0], k)
    assert bool((idx[:, 1:] > idx[:, :-1]).all())  # sorted ascending, no duplicates
    torch.testing.assert_close(val, torch.gather(c, 1, idx), atol=0, rtol=0)  # signed values at idx
    # The k largest magnitudes: the smallest kept |c| is >= every dropped |c|.
    kept = torch.zeros_like(c, dtype=torch.bool).scatter_(1, idx, True)
    dropped_max = c.abs().masked_fill(kept, -1).amax(1)
    assert bool((val.abs().amin(1) >= dropped_max).all())


def _assert_close_values(got: torch.Tensor, want: torch.Tensor) -> None:
    """Coefficients of two DCTs of one tensor (float32 rounding apart: module topk_jit)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize("k", [1, 4, 32, 64])
def test_topk_contract(k: int) -> None:
    c = torch.randn(50, 64, generator=torch.Generator().manual_seed(k))
    _assert_valid_topk(c, *topk_chunks(c, k), k)


@pytest.mark.parametrize("k", [1, 4, 32])
@pytest.mark.parametrize("ties", [False, True])
def test_two_stage_selection(k: int, ties: bool) -> None:
    """Chunks of 64 x 64 take the two-stage path; it must stay exact, ties included."""
    assert segment_length(64, 4096, k) is not None
    g = torch.Generator().manual_seed(k)
    x = torch.randn(128, 192, generator=g)
    c = torch.randint(-3, 4, (12, 4096), generator=g).float() if ties else torch.randn(12, 4096, generator=g)
    _assert_valid_topk(c, *topk_chunks(c, k), k)
    lay = plan_layout((128, 192), 64)
    idx, val = dct_topk(x, lay, k)  # the compiled DCT + top-k once warm: coefficients to rounding
    c = dct_chunks(x, lay)
    i_np, _ = numpy_ref.topk_chunks(c.numpy(), k)
    np.testing.assert_array_equal(idx.numpy(), i_np)
    _assert_close_values(val, torch.gather(c, 1, idx))


def test_topk_matches_numpy() -> None:
    c = np.random.default_rng(3).standard_normal((30, 48)).astype(np.float32)
    i_np, v_np = numpy_ref.topk_chunks(c, 5)
    i_t, v_t = topk_chunks(torch.from_numpy(c), 5)
    np.testing.assert_array_equal(i_t.numpy(), i_np)
    np.testing.assert_array_equal(v_t.numpy(), v_np)


@settings(max_examples=30, deadline=None)
@given(
    shape=SMALL_SHAPES,
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


@pytest.mark.parametrize("k", [1, 4, 32, 64])
@pytest.mark.parametrize(
    ("shape", "chunk"), [((4096,), 64), ((128, 192), 64), ((2, 70, 50), 16), ((700,), 64)]
)
def test_compiled_selection_equals_the_torch_path(
    k: int, shape: tuple[int, ...], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled top-k (topk_jit) picks what the torch two-stage / plain top-k picks: same
    indices, same values, on spatial-order (dct_topk, the batched encode) and chunk-order
    (topk_chunks) coefficients; with ties it keeps a valid top-k (the lowest indices)."""
    assert warm(), "numba is a dependency: the compiled selection must be available"
    monkeypatch.setattr(topk, "JIT_MIN_K", 1)  # every k through the compiled selection
    lay = plan_layout(shape, chunk)
    k = min(k, lay.chunk_numel)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(k))
    c = dct_chunks(x, lay)
    ties = torch.randint(-2, 3, c.shape, generator=torch.Generator().manual_seed(1)).float()
    got = [dct_topk(x, lay, k), topk_chunks(c, k), dct_topk_groups([x, x], [lay, lay], [k, k])[0]]
    _assert_valid_topk(ties, *topk_chunks(ties, k), k)
    monkeypatch.setattr(topk, "use_jit", lambda: False)
    want = [dct_topk(x, lay, k), topk_chunks(c, k), dct_topk_groups([x, x], [lay, lay], [k, k])[0]]
    (i0, v0), (i1, v1), g2 = got
    for (j0, w0), (j1, w1), h2 in [want]:
        assert torch.equal(i1, j1) and torch.equal(v1, w1)  # same coefficients: the same selection
        # From the tensor: the compiled DCT (64 x 64 blocks) agrees with the products to rounding.
        assert torch.equal(i0, j0) and torch.equal(g2.idx, h2.idx)
        _assert_close_values(v0, w0)
        _assert_close_values(g2.val, h2.val)


def test_compiled_selection_leaves_nan_to_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    warm()
    monkeypatch.setattr(topk, "JIT_MIN_K", 1)
    c = torch.randn(3, 4096)
    c[1, 7] = float("nan")
    idx, _ = topk_chunks(c, 4)
    assert 7 in idx[1].tolist()  # torch.topk ranks NaN first


@pytest.mark.parametrize("k", [1, 4, 32])
def test_compiled_selection_of_mostly_zero_chunks(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero rows (an embedding's unused tokens): a valid top-k, every nonzero value kept first,
    then the zeros of lowest index."""
    warm()
    monkeypatch.setattr(topk, "JIT_MIN_K", 1)
    c = torch.zeros(5, 4096)
    c[1, [3, 700, 4000]] = torch.tensor([1.0, -2.0, 0.5])
    c[2, :100] = torch.randn(100, generator=torch.Generator().manual_seed(2))
    c[3, 64:128] = 1.0  # one segment, ties
    idx, val = topk_chunks(c, k)
    _assert_valid_topk(c, idx, val, k)
    assert idx[0].tolist() == list(range(k))
    if k >= 3:
        assert set(idx[1].tolist()) >= {3, 700, 4000}
