"""Presets produce the packet sizes documented in ``distronet.node.optim.config`` (default GPT)."""

from __future__ import annotations

import pytest
import torch

from distronet.node.exchange.memory import MemoryHub
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.node.optim.config import PACKET_BYTES_DEFAULT_GPT, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.identity import Identity


@pytest.mark.parametrize("name", sorted(PACKET_BYTES_DEFAULT_GPT))
def test_documented_packet_size(name: str) -> None:
    ident = Identity.from_seed(bytes(32))
    model = GPT(GPTConfig(), seed=0)
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    ex = MemoryHub().join(ident.peer_id)
    DistroOptimizer(model.named_parameters(), preset(name), ex, ident, roles=tensor_roles(model)).begin_step()
    got, want = ex.stats.bytes_up, PACKET_BYTES_DEFAULT_GPT[name]
    assert abs(got - want) <= 0.1 * want, (name, got, want)
    ring = 2 * 3 / 4 * 4 * model.num_parameters()  # fp32 ring all-reduce, 4 peers
    if name == "ours_k4_1bit":
        assert ring / got >= 1000


def test_open_round_is_the_same_for_any_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """open_frames spreads frames over threads; results (accepted parts, rejection codes) are a
    pure function of the frames, in peer order, whatever the pool size."""
    import numpy as np

    from distronet.node.optim import packets
    from distronet.protocol.errors import RejectCode

    cfg = preset("psyche")
    plans = packets.make_plans([("w", (96, 128)), ("b", (40,)), ("v", (300,))], cfg)
    digest = packets.run_digest(plans)
    idents = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(6)]
    g = torch.Generator().manual_seed(0)
    frames = {}
    for i, ident in enumerate(idents):
        momenta = [torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g) for p in plans]
        frames[ident.peer_id] = packets.build_packet(plans, momenta, cfg, 7 if i != 2 else 6, ident, digest)[
            0
        ]
    pids = sorted(frames)
    frames[pids[0]], frames[pids[1]] = frames[pids[1]], frames[pids[0]]  # signed by the other one
    frames[pids[3]] = frames[pids[3]][:-5]  # truncated
    results = []
    for workers in (1, 2, 3):
        monkeypatch.setattr(packets, "_workers", lambda w=workers: w)
        results.append(packets.open_round(frames, plans, cfg, 7, digest, torch.device("cpu")))
    for r in results:
        assert r.rejected == results[0].rejected and r.peers == results[0].peers and r.key == results[0].key
        for tid, parts in r.parts.items():
            for (i, v), (i0, v0) in zip(parts, results[0].parts[tid], strict=True):
                assert torch.equal(i, i0) and np.array_equal(
                    v.numpy().view(np.int32), v0.numpy().view(np.int32)
                )
    rej = results[0].rejected
    assert rej[pids[0]] == rej[pids[1]] == RejectCode.WRONG_PEER and pids[3] in rej
    assert len(results[0].peers) == 6 - len(rej) and all(
        len(p) == len(results[0].peers) for p in results[0].parts.values()
    )
