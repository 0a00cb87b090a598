"""Presets produce the packet sizes documented in ``distronet.node.optim.config`` (default GPT)."""

from __future__ import annotations

import pytest
import torch

from distronet.node.exchange.memory import MemoryHub
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.node.optim.config import PACKET_BYTES_DEFAULT_GPT, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.protocol.identity import Identity


@pytest.mark.parametrize("name", sorted(PACKET_BYTES_DEFAULT_GPT))
def test_documented_packet_size(name: str) -> None:
    ident = Identity.from_seed(bytes(32))
    model = GPT(GPTConfig(), seed=0)
    torch.manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    ex = MemoryHub().join(ident.peer_id)
    DistroOptimizer(model.named_parameters(), preset(name), ex, ident).begin_step()
    got, want = ex.stats.bytes_up, PACKET_BYTES_DEFAULT_GPT[name]
    assert abs(got - want) <= 0.1 * want, (name, got, want)
    ring = 2 * 3 / 4 * 4 * model.num_parameters()  # fp32 ring all-reduce, 4 peers
    if name == "ours_k4_1bit":
        assert ring / got >= 1000
