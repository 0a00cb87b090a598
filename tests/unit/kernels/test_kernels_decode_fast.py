"""decode_sum's compiled dense scatter: bit-identical to the tensor path, same errors."""

from __future__ import annotations

import pytest
import torch

from distronet.kernels import decode
from distronet.kernels.coding import warm
from distronet.kernels.decode import decode_sum
from distronet.kernels.layout import ChunkLayout, plan_layout
from distronet.protocol.errors import KernelError

SHAPES = [(), (7,), (200,), (67, 131), (128, 96), (2, 3, 20, 70), (64, 64), (300, 260)]

Part = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(autouse=True)
def _warm() -> None:
    assert warm(), "numba is a dependency: the compiled decoder must be available"


def _parts(lay: ChunkLayout, seed: int, ks: list[int]) -> list[Part]:
    """Parts at the given k's whose positions overlap heavily (few distinct positions per chunk),
    values of mixed magnitude: float32 sums then depend on the order of additions."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.randperm(lay.chunk_numel, generator=g)[: max(ks)]
    out = []
    for k in ks:
        k = min(k, lay.chunk_numel)
        pick = torch.stack([pool[torch.randperm(pool.numel(), generator=g)[:k]] for _ in range(lay.n_chunks)])
        idx = pick.sort(dim=1).values.to(torch.int64)
        val = torch.randn(idx.shape, generator=g) * 10.0 ** torch.randint(-3, 4, idx.shape, generator=g)
        out.append((idx, val.to(torch.float32)))
    return out


def _tensor_path(lay: ChunkLayout, parts: list[Part], mp: pytest.MonkeyPatch) -> torch.Tensor:
    with mp.context() as m:
        m.setattr(decode, "use_jit", lambda: False)
        return decode_sum(lay, parts, method="dense", dtype=torch.float32).clone()


@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_dense_spread_is_bit_identical(
    shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = plan_layout(shape, 16)
    cases = [[4], [4, 4, 4, 4], [7, 3, 7, 5, 3], [16, 16], [2, 9, 2, 9, 2, 9]]
    for seed, ks in enumerate(cases):
        parts = _parts(lay, seed, ks)
        assert decode._dense_compiled(lay, parts, torch.float32, torch.device("cpu")) is not None
        got = decode_sum(lay, parts, method="dense", dtype=torch.float32)
        want = _tensor_path(lay, parts, monkeypatch)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (shape, ks)
        if len(ks) > 3 and lay.numel > 1000:  # the comparison sees the order of additions
            flipped = decode_sum(lay, parts[::-1], method="dense", dtype=torch.float32)
            assert not torch.equal(got.view(torch.int32), flipped.view(torch.int32))
        if lay.n_coefficients <= 4096:  # auto picks the same inverse either way
            auto = decode_sum(lay, parts)
            with monkeypatch.context() as m:
                m.setattr(decode, "use_jit", lambda: False)
                assert torch.equal(auto.view(torch.int32), decode_sum(lay, parts).view(torch.int32))


def test_strided_parts_compiled_and_grad_parts_on_the_tensor_path() -> None:
    """Expanded (stride-0) indices, as a dense tensor's own packet has, take the compiled path;
    values needing grad the tensor path; both give the same bits."""
    lay = plan_layout((96, 80), 16)
    cpu = torch.device("cpu")
    idx = torch.arange(lay.chunk_numel, dtype=torch.int64).expand(lay.n_chunks, lay.chunk_numel)
    val = torch.randn(idx.shape)
    assert decode._dense_compiled(lay, [(idx, val)], torch.float32, cpu) is not None
    graded = val.clone().requires_grad_(True)
    assert decode._dense_compiled(lay, [(idx, graded)], torch.float32, cpu) is None
    want = decode_sum(lay, [(idx.contiguous(), val)], dtype=torch.float32).clone()
    for v in (val, graded):
        got = decode_sum(lay, [(idx, v)], dtype=torch.float32)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("bad", [-1, 256])
def test_out_of_range_index_gets_the_tensor_paths_error(bad: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = plan_layout((64, 48), 16)
    parts = _parts(lay, 3, [5, 5, 5])
    parts[2][0][1, 3] = bad
    with pytest.raises(KernelError) as fast:
        decode_sum(lay, parts, method="dense")
    with monkeypatch.context() as m, pytest.raises(KernelError) as slow:
        m.setattr(decode, "use_jit", lambda: False)
        decode_sum(lay, parts, method="dense")
    assert str(fast.value) == str(slow.value)
    assert "part 2" in str(fast.value)


def test_other_dtypes_take_the_tensor_path() -> None:
    lay = plan_layout((64, 48), 16)
    idx, val = _parts(lay, 1, [6])[0]
    half = decode_sum(lay, [(idx, val.to(torch.bfloat16))], method="dense")
    full = decode_sum(lay, [(idx, val.to(torch.bfloat16).float())], method="dense")
    assert half.dtype == torch.float32
    assert torch.equal(half, full)
    assert decode_sum(lay, [(idx, val.double())], method="dense").dtype == torch.float64
