"""The compiled DCT + top-k of 64 x 64 chunks (topk_jit.dct_select, topk.dct_select_compiled)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distronet.kernels import numpy_ref, topk
from distronet.kernels.coding import warm
from distronet.kernels.dct import basis_numpy
from distronet.kernels.encode import dct_topk_groups
from distronet.kernels.layout import ChunkLayout, plan_layout
from distronet.kernels.topk import dct_select_compiled, dct_topk
from distronet.kernels.topk_jit import B, factors


@pytest.fixture(autouse=True, scope="module")
def _warm() -> None:
    assert warm(), "numba is a dependency: the compiled DCT + top-k must be available"


def _exact(x: torch.Tensor, lay: ChunkLayout) -> np.ndarray:
    """Chunk-order DCT coefficients of ``x`` in float64 (the zero-padded blocks times the basis)."""
    (gr, gc), (br, bc) = lay.grid, lay.block
    r, c = lay.core
    x3 = np.zeros((lay.batch, gr * br, gc * bc))
    x3[:, :r, :c] = x.double().numpy().reshape(lay.batch, r, c)
    blocks = x3.reshape(lay.batch, gr, br, gc, bc).transpose(0, 1, 3, 2, 4).reshape(-1, br, bc)
    d = basis_numpy(B)
    return (d @ blocks @ d.T).reshape(lay.n_chunks, -1)


@pytest.mark.parametrize("k", [1, 4, 32, 100])
@pytest.mark.parametrize("shape", [(64, 64), (256, 192), (127, 128), (3, 67, 64), (2, 71, 130), (321, 199)])
def test_matches_the_exact_transform(shape: tuple[int, ...], k: int) -> None:
    """Indices of the exact top-k (random data has no near-ties at these sizes), values within
    float32 rounding of the float64 coefficients; zero-padded and batched layouts included."""
    lay = plan_layout(shape, 64)
    assert lay.block == (B, B) and (lay.is_padded or shape[0] % B == 0)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(k)) * 3.0
    got = dct_select_compiled([x], [lay], k)
    assert got is not None
    idx, val = got
    exact = _exact(x, lay)
    want_idx, _ = numpy_ref.topk_chunks(exact.astype(np.float32), k)
    np.testing.assert_array_equal(idx.numpy(), want_idx)
    np.testing.assert_allclose(
        val.numpy(), np.take_along_axis(exact, want_idx, 1), rtol=1e-5, atol=1e-6 * np.abs(exact).max()
    )


def test_factors_are_the_orthonormal_dct() -> None:
    """The factored transform's constants: the cosine split factors and the output scales."""
    cs, sc = factors()
    assert cs.dtype == sc.dtype == np.float32 and cs.size == B - 1 and sc.size == B
    np.testing.assert_allclose(sc[0], np.sqrt(1 / B), rtol=1e-7)
    np.testing.assert_allclose(sc[1:], np.sqrt(2 / B), rtol=1e-7)
    np.testing.assert_allclose(cs[0], 1 / (2 * np.cos(np.pi / (2 * B))), rtol=1e-6)


def test_zero_blocks_keep_the_lowest_indices() -> None:
    """A zero chunk takes its zeros of lowest index (topk_jit's contract); a chunk of one column
    of ones has a DCT nonzero in its first row only, largest at columns 1.. (``D[j, 0]`` for
    ``j >= 1`` is ``sqrt(2)`` times ``D[0, 0]`` times a cosine near 1)."""
    x = torch.zeros(64, 128)
    x[:, 64] = 1.0
    idx, val = dct_topk(x, plan_layout((64, 128), 64), 4)
    assert idx[0].tolist() == [0, 1, 2, 3] and not val[0].any()
    assert idx[1].tolist() == [1, 2, 3, 4] and bool((val[1] > 0).all())
    many, vals = dct_topk(x, plan_layout((64, 128), 64), 70)  # more than the 64 nonzeros
    assert many[1].tolist() == list(range(64)) + list(range(64, 70)) and not vals[1, 64:].any()


def test_several_tensors_and_threads_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched encode (one group of tensors) cut in pieces over 1 or 2 threads writes the same
    rows, tensor after tensor, as each tensor alone."""
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(s, generator=gen) for s in [(64, 64), (320, 128), (127, 128), (64, 640)]]
    lays = [plan_layout(tuple(x.shape), 64) for x in xs]
    monkeypatch.setattr(topk, "DCT_PIECE_CHUNKS", 3)  # many pieces
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            got = dct_select_compiled(xs, lays, 8)
        finally:
            torch.set_num_threads(1)
        assert got is not None
        results.append(got)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    alone = [dct_select_compiled([x], [lay], 8) for x, lay in zip(xs, lays, strict=True)]
    assert torch.equal(results[0][0], torch.cat([a[0] for a in alone if a is not None]))
    group = dct_topk_groups(xs, lays, [8] * len(xs))
    assert len(group) == 1 and torch.equal(group[0].idx, results[0][0])


def test_what_it_leaves_to_the_matrix_products() -> None:
    """None for a NaN, another dtype, another block; dct_topk then still answers (torch path)."""
    lay = plan_layout((64, 64), 64)
    x = torch.randn(64, 64)
    x[3, 5] = float("nan")
    assert dct_select_compiled([x], [lay], 4) is None
    idx, _ = dct_topk(x, lay, 4)
    assert idx.shape == (1, 4)
    assert dct_select_compiled([torch.randn(64, 64, dtype=torch.float64)], [lay], 4) is None
    small = plan_layout((32, 32), 64)
    assert small.block != (B, B) and dct_select_compiled([torch.randn(32, 32)], [small], 4) is None


@pytest.mark.parametrize("k", [1, 4, 32, 100, 700])
@pytest.mark.parametrize("kind", ["ties", "few_nonzero", "all_zero", "random"])
def test_the_transposed_selection_chooses_as_select(k: int, kind: str) -> None:
    """dct_select selects from ``Y^T`` (topk_jit.select_transposed): the same indices, values and
    order as select on ``Y``, ties at the threshold included (magnitudes from a few integers:
    the lowest indices among the tied win), and chunks with fewer than ``k`` nonzero values."""
    from distronet.kernels.topk import _jit_segment
    from distronet.kernels.topk_jit import select, select_transposed

    rng = np.random.default_rng(k)
    cn = B * B
    for trial in range(20):
        if kind == "ties":
            y = rng.integers(-3, 4, size=(B, B)).astype(np.float32)
        elif kind == "few_nonzero":
            y = np.zeros((B, B), dtype=np.float32)
            y.flat[rng.choice(cn, size=max(0, k - 1 - trial % 3), replace=False)] = rng.standard_normal(
                max(0, k - 1 - trial % 3)
            )
        elif kind == "all_zero":
            y = np.zeros((B, B), dtype=np.float32)
        else:
            y = rng.standard_normal((B, B)).astype(np.float32)
        g = _jit_segment(1, cn, k)
        want_i, want_v = np.empty((1, k), np.int64), np.empty((1, k), np.float32)
        got_i, got_v = np.empty((1, k), np.int64), np.empty((1, k), np.float32)
        flat = y.reshape(cn)
        work = (
            np.empty(cn // g, np.uint32),
            np.empty(cn, np.uint32),
            np.empty(cn, np.int64),
            np.empty(cn, np.uint32),
        )
        # the chunk as one row of cn (select's own layout for a chunk-order buffer)
        assert select(flat.view(np.uint32), flat, 0x7F800000, 1, 1, 1, 1, cn, k, g, 0, 1, want_i, want_v) == 0
        yt = np.ascontiguousarray(y.T).reshape(cn)
        sel = (np.empty(cn, np.int64), np.empty(cn, np.int64))
        assert select_transposed(yt.view(np.uint32), yt, 0x7F800000, k, g, *work, *sel, got_i, got_v, 0) == 0
        np.testing.assert_array_equal(got_i, want_i)
        np.testing.assert_array_equal(got_v, want_v)
