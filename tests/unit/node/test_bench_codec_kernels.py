"""decode_sum_many (the bench's kernel-only decode): all tensors' parts in one pass equal decode_sum."""

from __future__ import annotations

import pytest
import torch

from distronet.kernels import decode_plan
from distronet.kernels.decode import decode_sum
from distronet.kernels.decode_plan import plan_batch
from distronet.kernels.layout import plan_layout
from distronet.kernels.topk import dct_topk
from distronet.node.bench.codec_kernels import decode_sum_many
from distronet.protocol.errors import KernelError

SHAPES = [(), (7,), (200,), (67, 131), (128, 96), (2, 3, 20, 70), (64, 64), (160, 144)]


@pytest.fixture(autouse=True)
def _small_big_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_plan, "SMALL_COEFFICIENTS", 20_000)  # the last shape is "big"
    plan_batch.cache_clear()


def _parts(shapes: list[tuple[int, ...]], seed: int, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    lays = [plan_layout(s, 16) for s in shapes]
    return [
        dct_topk(torch.randn(s, generator=g), lay, min(k, lay.chunk_numel))
        for s, lay in zip(shapes, lays, strict=True)
    ]


@pytest.mark.parametrize("packets", [1, 5])
def test_many_equals_per_tensor_decode(packets: int) -> None:
    layouts = [plan_layout(s, 16) for s in SHAPES]
    per_packet = [_parts(SHAPES, seed, 1 + seed % 4) for seed in range(packets)]
    parts = [[p[t] for p in per_packet] for t in range(len(SHAPES))]
    got = decode_sum_many(layouts, parts)
    for lay, ps, x in zip(layouts, parts, got, strict=True):
        assert x.shape == lay.shape and x.dtype == torch.float32
        torch.testing.assert_close(x, decode_sum(lay, ps, method="dense"), atol=2e-5, rtol=1e-5)


def test_missing_tensors_decode_to_zero_and_bad_parts_raise() -> None:
    layouts = [plan_layout(s, 16) for s in [(40,), (32, 32)]]
    (p,) = _parts([(40,)], 0, 3)
    z = decode_sum_many(layouts, [[p], []])
    assert z[1].abs().sum() == 0 and z[0].abs().sum() > 0
    with pytest.raises(KernelError):
        decode_sum_many(layouts, [[p]])
    with pytest.raises(KernelError):
        decode_sum_many(layouts, [[(p[0] + 100, p[1])], []])
    with pytest.raises(KernelError):
        decode_sum_many(layouts, [[(p[0].int(), p[1])], []])


def test_compiled_and_tensor_paths_give_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    from distronet.kernels.coding import warm
    from distronet.node.bench import codec_kernels

    assert warm()
    layouts = [plan_layout(s, 16) for s in SHAPES]
    per_packet = [_parts(SHAPES, seed, 1 + seed % 4) for seed in range(5)]
    parts = [[p[t] for p in per_packet[: 1 + t % 5]] for t in range(len(SHAPES))]  # 1-5 parts a tensor
    got = [x.clone() for x in decode_sum_many(layouts, parts)]
    monkeypatch.setattr(codec_kernels, "use_jit", lambda: False)
    for x, y in zip(got, decode_sum_many(layouts, parts), strict=True):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))
