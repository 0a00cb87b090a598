"""The optimizer's round decode (open_round + decode_sum per tensor) gives the same bits on the
compiled path as on the tensor path it replaced: the convergence figures were recorded with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distronet.kernels import decode
from distronet.kernels.coding import FlatPayload, warm
from distronet.kernels.decode import decode_sum
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.node.optim import packets
from distronet.node.optim.config import preset
from distronet.protocol.identity import Identity

CPU = torch.device("cpu")


def _round(name: str, n_peers: int) -> tuple[list[packets.TensorPlan], bytes, dict[bytes, bytes]]:
    cfg = preset(name)
    model = GPT(GPTConfig(depth=1), seed=0)  # the default model's tensor shapes, one block
    plans = packets.make_plans([(n, tuple(p.shape)) for n, p in model.named_parameters()], cfg)
    digest = packets.run_digest(plans)
    frames = {}
    for i in range(n_peers):
        ident = Identity.from_seed(bytes([i + 1]) * 32)
        g = torch.Generator().manual_seed(i)
        # Peers' momenta alike (as in a run), so their top-k positions overlap and order matters.
        momenta = [
            torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=torch.Generator().manual_seed(7))
            * (1 + 0.1 * torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g))
            for p in plans
        ]
        held = [packets.to_momentum(p, m) for p, m in zip(plans, momenta, strict=True)]
        frames[ident.peer_id] = packets.build_packet(plans, held, cfg, 3, ident, digest)[0]
    return plans, digest, frames


def _old_as_parts(flat: FlatPayload) -> list[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
    """open_round's per-tensor conversion before the split views (kept here to compare)."""
    return [
        (t.tensor_id, (torch.from_numpy(np.asarray(t.idx)), torch.from_numpy(np.asarray(t.val))))
        for t in flat.tensors()
    ]


@pytest.mark.parametrize("name", ["ours_k32", "ours_k4_1bit", "demo_reference"])
def test_round_aggregates_are_bit_identical(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert warm(), "numba is a dependency: the compiled decoder must be available"
    plans, digest, frames = _round(name, 4)
    for n_peers in (1, 4):
        _compare(name, plans, digest, dict(list(frames.items())[:n_peers]), monkeypatch)


def _compare(
    name: str,
    plans: list[packets.TensorPlan],
    digest: bytes,
    frames: dict[bytes, bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg, n_peers = preset(name), len(frames)
    dec = packets.open_round(frames, plans, cfg, 3, digest, CPU)
    assert len(dec.peers) == n_peers and not dec.rejected
    new = [
        decode_sum(p.layout, dec.parts[p.tensor_id], dtype=torch.float32, device=CPU).clone() for p in plans
    ]
    with monkeypatch.context() as m:  # before: per-tensor conversion, tensor-path scatter
        m.setattr(packets, "_as_parts", _old_as_parts)
        m.setattr(decode, "use_jit", lambda: False)
        old_dec = packets.open_round(frames, plans, cfg, 3, digest, CPU)
        old = [
            decode_sum(p.layout, old_dec.parts[p.tensor_id], dtype=torch.float32, device=CPU) for p in plans
        ]
    assert old_dec.key == dec.key
    compiled = 0
    for p, x, y in zip(plans, new, old, strict=True):
        assert x.shape == p.layout.shape
        assert x.numpy().tobytes() == y.numpy().tobytes(), p.name
        parts = dec.parts[p.tensor_id]
        compiled += decode._dense_compiled(p.layout, parts, torch.float32, CPU) is not None
    assert compiled > 0  # the comparison did exercise the compiled path
