"""The chunking rule of kernels/layout.py (part of the wire contract)."""

from __future__ import annotations

import pytest

from distronet.kernels.layout import MAX_CHUNK, block_size, plan_layout
from distronet.protocol.errors import KernelError


@pytest.mark.parametrize(
    ("n", "s", "b"),
    [
        (1, 64, 1),  # smaller than s: whole dim
        (64, 64, 64),
        (128, 64, 64),
        (96, 64, 48),  # a divisor in [s/2, s]
        (200, 64, 50),
        (67, 64, 64),  # prime > s: padded, not cut in runs of 1
        (134, 64, 64),  # 2 * 67: divisors 2 and 67 are not near 64
        (4096, 64, 64),
        (10, 3, 2),  # ceil(3/2) = 2 <= 2
        (7, 3, 3),  # prime: padded to 9
    ],
)
def test_block_size(n: int, s: int, b: int) -> None:
    assert block_size(n, s) == b


def test_layout_2d_padded() -> None:
    lay = plan_layout((2, 3, 67, 130), 64)
    assert lay.block == (64, 64)
    assert lay.grid == (2, 3)
    assert lay.batch == 6
    assert lay.n_chunks == 36
    assert lay.chunk_numel == 4096
    assert lay.padded == (128, 192)
    assert lay.is_padded
    assert lay.n_coefficients == 36 * 4096


def test_layout_scalar_and_1d() -> None:
    assert plan_layout((), 64).block == (1,)
    assert plan_layout((), 64).n_chunks == 1
    lay = plan_layout((200,), 64)
    assert (lay.block, lay.grid, lay.chunk_numel, lay.is_padded) == ((50,), (4,), 50, False)


def test_layout_is_a_function_of_shape_and_chunk() -> None:
    assert plan_layout((96, 128), 64) == plan_layout((96, 128), 64)
    assert plan_layout((96, 128), 64) != plan_layout((96, 128), 32)


@pytest.mark.parametrize(
    ("shape", "chunk"),
    [((4, 4), 0), ((4, 4), MAX_CHUNK + 1), ((0, 4), 8), ((4, -1), 8), ((1,) * 9, 8), ((4,), True)],
)
def test_bad_layout_raises(shape: tuple[int, ...], chunk: int) -> None:
    with pytest.raises(KernelError):
        plan_layout(shape, chunk)


def test_public_surface_resolves() -> None:
    import distronet.kernels as kernels

    for name in kernels.__all__:
        assert getattr(kernels, name) is not None
    assert kernels.plan_layout is plan_layout
    with pytest.raises(AttributeError):
        _ = kernels.no_such_name
