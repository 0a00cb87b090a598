"""Chunked DCT: orthonormal basis, exact round trip for every rank, numpy/torch parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.kernels import numpy_ref
from distronet.kernels.dct import dct_accumulate, dct_basis, dct_chunks, dct_spatial, idct_chunks
from distronet.kernels.layout import plan_layout
from distronet.protocol.errors import KernelError

# Up to two batch dims of 1..3, then up to two dims of 1..40: every rank 0..4, kept small.
SMALL_SHAPES = st.tuples(
    st.lists(st.integers(1, 3), max_size=2), st.lists(st.integers(1, 40), max_size=2)
).map(lambda t: tuple(t[0] + t[1]) if t[1] else tuple(t[1]))

SHAPES = [
    (),
    (1,),
    (5,),
    (64,),
    (67,),
    (200,),
    (3, 5),
    (64, 64),
    (128, 96),
    (67, 131),
    (2, 3, 67, 130),
    (2, 1, 7, 70),
    (1, 1, 1, 1),
]


@pytest.mark.parametrize("n", [1, 2, 7, 48, 64])
def test_basis_orthonormal(n: int) -> None:
    d = dct_basis(n, torch.float64)
    torch.testing.assert_close(d @ d.T, torch.eye(n, dtype=torch.float64), atol=1e-13, rtol=0)


def test_basis_row_zero_is_constant() -> None:
    d = dct_basis(8, torch.float64)
    torch.testing.assert_close(d[0], torch.full((8,), 8**-0.5, dtype=torch.float64))


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_float64(shape: tuple[int, ...]) -> None:
    lay = plan_layout(shape, 64)
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    c = dct_chunks(x, lay)
    assert c.shape == (lay.n_chunks, lay.chunk_numel)
    torch.testing.assert_close(idct_chunks(c, lay), x, atol=1e-12, rtol=0)
    # Orthonormal: energy is preserved (padding adds zeros only).
    torch.testing.assert_close(c.square().sum(), x.square().sum(), atol=1e-10, rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_torch_parity(shape: tuple[int, ...], dtype: type) -> None:
    lay = plan_layout(shape, 16)
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    c_np = numpy_ref.dct_chunks(x, lay)
    c_t = dct_chunks(torch.from_numpy(np.array(x)), lay)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert c_np.dtype == dtype and c_t.numpy().dtype == dtype
    np.testing.assert_allclose(c_t.numpy(), c_np, atol=tol, rtol=0)
    np.testing.assert_allclose(idct_chunks(c_t, lay).numpy(), numpy_ref.idct_chunks(c_np, lay), atol=tol)


def test_chunk_order_matches_blocks() -> None:
    """Chunk (b, i, j) is the DCT of block (b, i, j), coefficient (u, v) at u * bc + v."""
    lay = plan_layout((2, 128, 96), 64)  # blocks 64 x 48, grid 2 x 2
    x = torch.randn(2, 128, 96, dtype=torch.float64)
    c = dct_chunks(x, lay)
    dr, dc = dct_basis(64, torch.float64), dct_basis(48, torch.float64)
    block = x[1, 64:128, 0:48]
    torch.testing.assert_close(c[1 * 4 + 1 * 2 + 0].view(64, 48), dr @ block @ dc.T)


def test_half_precision_computes_in_float32() -> None:
    lay = plan_layout((32, 32), 16)
    x = torch.randn(32, 32).to(torch.bfloat16)
    c = dct_chunks(x, lay)
    assert c.dtype == torch.float32
    torch.testing.assert_close(idct_chunks(c, lay), x.float(), atol=1e-5, rtol=0)


def test_non_contiguous_input() -> None:
    x = torch.randn(96, 128).T  # (128, 96), strided
    lay = plan_layout((128, 96), 64)
    torch.testing.assert_close(dct_chunks(x, lay), dct_chunks(x.contiguous(), lay))


@settings(max_examples=40, deadline=None)
@given(
    shape=SMALL_SHAPES,
    chunk=st.integers(1, 24),
)
def test_round_trip_property(shape: tuple[int, ...], chunk: int) -> None:
    lay = plan_layout(shape, chunk)
    x = torch.randn(shape, dtype=torch.float64)
    torch.testing.assert_close(idct_chunks(dct_chunks(x, lay), lay), x, atol=1e-12, rtol=0)
    np.testing.assert_allclose(numpy_ref.dct_chunks(x.numpy(), lay), dct_chunks(x, lay).numpy(), atol=1e-12)


def test_bad_arguments_raise() -> None:
    lay = plan_layout((8, 8), 4)
    with pytest.raises(KernelError):
        dct_chunks(torch.zeros(8, 9), lay)
    with pytest.raises(KernelError):
        dct_spatial(torch.zeros(8, 8, dtype=torch.int32), lay)
    with pytest.raises(KernelError):
        idct_chunks(torch.zeros(3, 16), lay)
    with pytest.raises(KernelError):
        numpy_ref.dct_chunks(np.zeros((8, 9)), lay)
    with pytest.raises(KernelError):
        numpy_ref.idct_chunks(np.zeros((4, 16), dtype=np.int64), lay)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("alpha", [1.0, 0.03])
def test_dct_accumulate_is_the_momentum_update_bit_for_bit(shape: tuple[int, ...], alpha: float) -> None:
    """``dct_accumulate`` reads the coefficients in spatial order, with no chunk-order copy: the
    same ``beta * m + alpha * c`` per element as through ``dct_chunks``'s copy, every layout."""
    g = torch.Generator().manual_seed(len(shape) + int(alpha * 100))
    lay = plan_layout(shape, 16)
    x = torch.randn(shape, generator=g)
    m = torch.randn(lay.n_chunks, lay.chunk_numel, generator=g)
    want = m.clone().mul_(0.9).add_(dct_chunks(x, lay), alpha=alpha)
    dct_accumulate(m, x, lay, 0.9, alpha)
    torch.testing.assert_close(m, want, rtol=0, atol=1e-6 * float(want.abs().max()))
    if alpha == 1.0:  # a plain add reads the same values: the very same bits
        assert torch.equal(m, want)


def test_dct_accumulate_checks_the_momentum_shape() -> None:
    lay = plan_layout((64, 64), 16)
    with pytest.raises(KernelError, match="momentum"):
        dct_accumulate(torch.zeros(lay.n_chunks + 1, lay.chunk_numel), torch.zeros(64, 64), lay, 0.9, 1.0)


@pytest.mark.parametrize("shape", [s for s in SHAPES if len(s) >= 2])
@pytest.mark.parametrize("alpha", [1.0, 0.03])
def test_dct_accumulate_spatial_is_the_chunk_order_update(shape: tuple[int, ...], alpha: float) -> None:
    """A momentum kept in spatial order (``spatial=True``: the update folded into the second
    product) holds, chunk by chunk, ``beta * m + alpha * c`` as the chunk-order update does."""
    from distronet.kernels.dct import chunks_from_spatial, spatial_from_chunks, spatial_shape

    g = torch.Generator().manual_seed(len(shape) + int(alpha * 100))
    lay = plan_layout(shape, 16)
    x = torch.randn(shape, generator=g)
    m = torch.randn(lay.n_chunks, lay.chunk_numel, generator=g)
    ms = spatial_from_chunks(m, lay).reshape(spatial_shape(lay)).contiguous()
    dct_accumulate(m, x, lay, 0.9, alpha)
    dct_accumulate(ms, x, lay, 0.9, alpha, spatial=True)
    got = chunks_from_spatial(ms.view(lay.batch, *lay.padded), lay)
    torch.testing.assert_close(got, m, rtol=0, atol=1e-6 * float(m.abs().max()))


def test_dct_accumulate_spatial_checks_its_shapes() -> None:
    from distronet.kernels.dct import spatial_shape

    lay = plan_layout((70, 64), 16)
    assert spatial_shape(lay) == lay.padded and lay.batch == 1
    with pytest.raises(KernelError, match="momentum"):
        dct_accumulate(
            torch.zeros(lay.n_chunks, lay.chunk_numel), torch.zeros(70, 64), lay, 0.9, 1.0, spatial=True
        )
    with pytest.raises(KernelError, match="2-D"):
        dct_accumulate(torch.zeros(1, 40), torch.zeros(40), plan_layout((40,), 16), 0.9, 1.0, spatial=True)


@pytest.mark.parametrize("shape", [(200,), (67, 131), (3, 40, 70)])
def test_both_first_products_invert_the_sum_of_parts(shape: tuple[int, ...]) -> None:
    """The entries' rows (the CPU) and one product of scattered coefficients (other devices)
    build the same first product up to rounding; with the rest of the inverse, the coefficients'
    sum (entries at one position in two parts add up) goes back to the tensor it came from."""
    from distronet.kernels.dct import idct_rows, spread_by_product, spread_rows

    lay = plan_layout(shape, 16)
    g = torch.Generator().manual_seed(3)
    c = dct_chunks(torch.randn(shape, generator=g, dtype=torch.float64), lay)
    full = torch.arange(lay.chunk_numel).expand(lay.n_chunks, -1)
    half = c / 2  # two parts that each carry half of every coefficient
    built = []
    for spread in (spread_rows, spread_by_product):
        z = torch.zeros(lay.n_coefficients, dtype=torch.float64)
        spread(z, lay, full, half)
        spread(z, lay, full, half)
        built.append(z)
    torch.testing.assert_close(built[0], built[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(idct_rows(built[0], lay), idct_chunks(c, lay), rtol=1e-10, atol=1e-10)
