"""Decode-sum: equals the dense top-k reconstruction, is linear, dense == sparse, numpy parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distronet.kernels import numpy_ref
from distronet.kernels.dct import dct_chunks, idct_chunks
from distronet.kernels.decode import choose_method, decode_sum, scatter_sum
from distronet.kernels.layout import plan_layout
from distronet.kernels.topk import dct_topk
from distronet.protocol.errors import KernelError

SHAPES = [(), (7,), (200,), (67,), (3, 5), (128, 96), (67, 131), (2, 3, 20, 70)]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("method", ["dense", "sparse", "auto"])
def test_decode_encode_is_dense_topk_reconstruction(shape: tuple[int, ...], method: str) -> None:
    lay = plan_layout(shape, 16)
    k = min(4, lay.chunk_numel)
    x = torch.randn(shape, generator=_gen(5))
    idx, val = dct_topk(x, lay, k)
    # The dense top-k reconstruction: keep the k largest |c| per chunk, zero the rest, invert.
    c = dct_chunks(x.double(), lay)
    keep = c.abs() >= c.abs().topk(k, dim=1).values[:, -1:]
    expected = idct_chunks(c * keep, lay)
    got = decode_sum(lay, [(idx, val)], method=method)  # type: ignore[arg-type]
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got.double(), expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("shape", [(200,), (128, 96), (2, 3, 20, 70)])
def test_decode_sum_is_sum_of_decodes(shape: tuple[int, ...]) -> None:
    lay = plan_layout(shape, 16)
    parts = [dct_topk(torch.randn(shape, generator=_gen(i)), lay, 1 + i % 5) for i in range(6)]
    singles = sum(decode_sum(lay, [p]) for p in parts)
    for method in ("dense", "sparse"):
        torch.testing.assert_close(decode_sum(lay, parts, method=method), singles, atol=1e-5, rtol=0)  # type: ignore[arg-type]
    # Coefficient space too, and numpy agrees.
    want = numpy_ref.scatter_sum(lay, [(i.numpy(), v.numpy()) for i, v in parts])
    np.testing.assert_allclose(scatter_sum(lay, parts).numpy(), want, atol=1e-6)
    np_dec = numpy_ref.decode_sum(lay, [(i.numpy(), v.numpy()) for i, v in parts])
    np.testing.assert_allclose(decode_sum(lay, parts).numpy(), np_dec, atol=1e-5)


def test_overlapping_indices_add() -> None:
    lay = plan_layout((16, 16), 16)
    idx = torch.tensor([[3, 7]])
    val = torch.tensor([[1.0, 2.0]])
    buf = scatter_sum(lay, [(idx, val), (idx, val)])
    assert buf[0, 3] == 2.0 and buf[0, 7] == 4.0
    torch.testing.assert_close(decode_sum(lay, [(idx, val)] * 2), 2 * decode_sum(lay, [(idx, val)]))


def test_no_parts_decodes_to_zeros() -> None:
    lay = plan_layout((5, 6), 4)
    assert bool((decode_sum(lay, []) == 0).all())
    assert decode_sum(lay, []).shape == (5, 6)


def test_choose_method_by_total_k() -> None:
    small, big = plan_layout((128, 128), 64), plan_layout((4096, 4096), 64)
    assert choose_method(small, 8) == "sparse"
    assert choose_method(small, 16 * 32) == "dense"
    assert choose_method(big, 4) == "sparse"
    assert choose_method(big, 32) == "dense"


def test_float64_parts_decode_in_float64() -> None:
    lay = plan_layout((32, 32), 8)
    idx, val = dct_topk(torch.randn(32, 32, dtype=torch.float64), lay, 3)
    assert decode_sum(lay, [(idx, val)]).dtype == torch.float64
    assert decode_sum(lay, [(idx, val)], dtype=torch.float32).dtype == torch.float32


def test_bad_parts_raise() -> None:
    lay = plan_layout((8, 8), 4)  # 4 chunks of 16
    good = (torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2))
    bad = [
        (torch.zeros(4, 2, dtype=torch.int32), torch.zeros(4, 2)),  # index dtype
        (torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, 2)),  # chunk count
        (torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 3)),  # val shape
        (torch.full((4, 2), 16, dtype=torch.int64), torch.zeros(4, 2)),  # index out of range
        (torch.full((4, 2), -1, dtype=torch.int64), torch.zeros(4, 2)),  # negative index
        (torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 2, dtype=torch.int64)),  # int values
    ]
    for part in bad:
        with pytest.raises(KernelError):
            decode_sum(lay, [good, part])
        with pytest.raises(KernelError):
            scatter_sum(lay, [part])
    with pytest.raises(KernelError):
        decode_sum(lay, [good], method="fft")  # type: ignore[arg-type]
    with pytest.raises(KernelError):
        numpy_ref.scatter_sum(lay, [(np.full((4, 2), 99), np.zeros((4, 2)))])


@pytest.mark.parametrize("shape", [(300, 300), (70000,), (2, 260, 260)])
def test_results_do_not_alias_scratch(shape: tuple[int, ...]) -> None:
    """Kernels keep temporaries in per-thread scratch; what they return must survive later calls."""
    lay = plan_layout(shape, 64)
    x = torch.randn(shape, generator=_gen(1))
    idx, val = dct_topk(x, lay, 4)
    dense, sparse = (
        decode_sum(lay, [(idx, val)], method="dense"),
        decode_sum(lay, [(idx, val)], method="sparse"),
    )
    coeffs = dct_chunks(x, lay)
    saved = [t.clone() for t in (idx, val, dense, sparse, coeffs)]
    y = torch.randn(shape, generator=_gen(2))
    parts = [dct_topk(y, lay, 4)]
    decode_sum(lay, parts, method="dense")
    decode_sum(lay, parts, method="sparse")
    dct_chunks(y, lay)
    for before, now in zip(saved, (idx, val, dense, sparse, coeffs), strict=True):
        assert torch.equal(before, now)
    torch.testing.assert_close(dense, sparse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("shape", [(200, 130), (3, 70, 64), (300,)])
@pytest.mark.parametrize("coding", ["FP32", "SIGN1"])
def test_wire_round_trip_with_coding(shape: tuple[int, ...], coding: str) -> None:
    """tensor -> top-k -> coded bytes -> decoded -> dense equals what the sender expects."""
    from distronet.kernels.coding import (
        IndexCoding,
        ValueCoding,
        decode_payload,
        encode_payload,
        encode_tensor,
    )

    lay = plan_layout(shape, 64)
    x = torch.randn(shape, generator=_gen(7))
    idx, val = dct_topk(x, lay, 4)
    vc = ValueCoding[coding]
    enc, deq = encode_tensor(0, idx.numpy(), val.numpy(), lay.chunk_numel, vc, IndexCoding.ENTROPY)
    (dec,) = decode_payload(encode_payload([enc]), [(lay.n_chunks, lay.chunk_numel)]).tensors()
    got = decode_sum(lay, [(torch.from_numpy(dec.idx), torch.from_numpy(dec.val))])
    # The receiver rebuilds exactly the sender's dequantised values (error feedback relies on it).
    torch.testing.assert_close(got, decode_sum(lay, [(idx, torch.from_numpy(deq))]), atol=0, rtol=0)
    if vc == ValueCoding.FP32:  # lossless values: the dense top-k reconstruction, to fp32 rounding
        c = dct_chunks(x.double(), lay)
        keep = c.abs() >= c.abs().topk(4, dim=1).values[:, -1:]
        torch.testing.assert_close(got.double(), idct_chunks(c * keep, lay), atol=2e-6, rtol=0)
