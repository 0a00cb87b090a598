"""Our re-implementation of the DeMo reference agrees with our kernels where the layouts agree."""

from __future__ import annotations

import pytest
import torch

from distronet.kernels.decode import decode_sum
from distronet.kernels.layout import plan_layout
from distronet.kernels.topk import dct_topk
from distronet.node.bench.codec_demo import DemoReference, smaller_split
from distronet.protocol.errors import KernelError


@pytest.mark.parametrize(("n", "s", "want"), [(128, 64, 64), (96, 64, 48), (67, 64, 1), (10, 64, 10)])
def test_smaller_split(n: int, s: int, want: int) -> None:
    assert smaller_split(n, s) == want


@pytest.mark.parametrize("shape", [(128, 96), (256,), (64, 200)])
def test_reference_matches_ours(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(9))
    ref = DemoReference(shape, 64)
    lay = plan_layout(shape, 64)
    assert ref.split == lay.block
    idx_r, val_r = ref.encode(x, 8)
    idx_r = idx_r.reshape(lay.n_chunks, 8)
    order = idx_r.argsort(dim=1)
    idx, val = dct_topk(x, lay, 8)
    torch.testing.assert_close(idx_r.gather(1, order), idx)
    torch.testing.assert_close(val_r.reshape(lay.n_chunks, 8).gather(1, order), val, atol=1e-5, rtol=0)
    dense_ref = ref.decode([ref.encode(x, 8)])
    torch.testing.assert_close(dense_ref, decode_sum(lay, [(idx, val)]), atol=1e-5, rtol=0)
    torch.testing.assert_close(ref.inverse(ref.transform(x)), x, atol=1e-5, rtol=0)


def test_reference_bytes_round_trip_and_mean_of_duplicates() -> None:
    shape = (128, 128)
    ref = DemoReference(shape, 64)
    idx, val = ref.encode(torch.randn(shape), 4)
    data = ref.to_bytes(idx, val)
    assert len(data) == 12 * 4 * 4
    idx2, val2 = ref.from_bytes(data, 4)
    torch.testing.assert_close(idx2, idx)
    torch.testing.assert_close(val2, val)
    # Two identical packets decode (by the reference's mean) to one packet's tensor.
    torch.testing.assert_close(ref.decode([(idx, val), (idx, val)]), ref.decode([(idx, val)]))
    with pytest.raises(KernelError):
        ref.from_bytes(data[:-1], 4)


def test_reference_rejects_rank_3() -> None:
    with pytest.raises(KernelError):
        DemoReference((2, 3, 4))
