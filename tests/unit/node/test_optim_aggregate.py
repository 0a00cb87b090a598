"""aggregate.round_sums (the whole round in one decode_flat) gives, bit for bit, what decode_sum
per tensor gave: the optimizer's updates and every recorded figure stay the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distronet.kernels.coding import decode_payload, encode_payload, encode_tensor, warm
from distronet.kernels.decode import decode_sum
from distronet.kernels.topk import topk_chunks
from distronet.node.exchange.memory import MemoryHub
from distronet.node.models.gpt import GPT, GPTConfig
from distronet.node.optim import aggregate, distro, packets
from distronet.node.optim.config import preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.identity import Identity

CPU = torch.device("cpu")


def _plans(name: str) -> list[packets.TensorPlan]:
    model = GPT(GPTConfig(depth=1), seed=0)  # the default model's tensor shapes, one block
    return packets.make_plans([(n, tuple(p.shape)) for n, p in model.named_parameters()], preset(name))


def _frames(name: str, plans: list[packets.TensorPlan], n_peers: int) -> dict[bytes, bytes]:
    cfg, digest = preset(name), packets.run_digest(plans)
    frames = {}
    for i in range(n_peers):
        ident = Identity.from_seed(bytes([i + 1]) * 32)
        g = torch.Generator().manual_seed(i)
        common = torch.Generator().manual_seed(7)  # alike momenta: top-k positions overlap
        momenta = [
            torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=common)
            * (1 + 0.1 * torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g))
            for p in plans
        ]
        held = [packets.to_momentum(p, m) for p, m in zip(plans, momenta, strict=True)]
        frames[ident.peer_id] = packets.build_packet(plans, held, cfg, 3, ident, digest)[0]
    return frames


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and x.contiguous().numpy().tobytes() == y.contiguous().numpy().tobytes()


@pytest.mark.parametrize("name", ["ours_k32", "ours_k4_1bit", "demo_reference", "psyche"])
def test_round_sums_equal_decode_sum_per_tensor(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert warm(), "numba is a dependency: the compiled decoder must be available"
    batched = []
    real = aggregate.decode_flat_methods
    monkeypatch.setattr(aggregate, "decode_flat_methods", lambda *a, **k: batched.append(1) or real(*a, **k))
    plans = _plans(name)
    frames = _frames(name, plans, 4)
    for n_peers in (1, 2, 4):  # k4 and k32 at 1 packet invert sparsely (one product per block shape)
        some = dict(list(frames.items())[:n_peers])
        dec = packets.open_round(some, plans, preset(name), 3, packets.run_digest(plans), CPU)
        assert len(dec.peers) == n_peers and len(dec.flats) == n_peers
        got = aggregate.round_sums(dec, plans, CPU)
        for p, x in zip(plans, got, strict=True):
            want = decode_sum(p.layout, dec.parts[p.tensor_id], dtype=torch.float32, device=CPU)
            assert _same(x, want), (name, n_peers, p.name)
    assert batched  # the one-pass decode ran


def test_payloads_missing_tensors_and_empty_rounds() -> None:
    plans = _plans("ours_k32")
    shapes = [(p.layout.n_chunks, p.layout.chunk_numel) for p in plans]
    g = torch.Generator().manual_seed(3)
    flats = []
    for skip in (0, 1):  # each payload leaves every other tensor out
        coded = []
        for p in plans[skip::2]:
            idx, val = topk_chunks(torch.randn(shapes[p.tensor_id], generator=g), 8)
            enc, _ = encode_tensor(
                p.tensor_id,
                np.ascontiguousarray(idx.numpy()),
                np.ascontiguousarray(val.numpy()),
                p.layout.chunk_numel,
                preset("ours_k32").extraction.value_coding,
                preset("ours_k32").extraction.index_coding,
            )
            coded.append(enc)
        flats.append(decode_payload(encode_payload(coded), shapes))
    tids = tuple(p.tensor_id for p in plans)
    for use in (flats[:1], flats, []):
        dec = packets.DecodedRound(3, tuple(bytes([i]) for i in range(len(use))), tuple(use), {}, b"", tids)
        got = aggregate.round_sums(dec, plans, CPU)
        for p, x in zip(plans, got, strict=True):
            want = decode_sum(p.layout, dec.parts[p.tensor_id], dtype=torch.float32, device=CPU)
            assert _same(x, want), p.name
    with pytest.raises(ValueError):
        aggregate.round_sums(dec, plans[1:], CPU)


def _per_tensor(
    dec: packets.DecodedRound, plans: list[packets.TensorPlan], device: torch.device
) -> list[torch.Tensor]:
    """The optimizer's decode before round_sums: decode_sum per tensor."""
    return [decode_sum(p.layout, dec.parts[p.tensor_id], dtype=torch.float32, device=device) for p in plans]


def _train(name: str, monkeypatch: pytest.MonkeyPatch, old: bool) -> list[bytes]:
    """3 peers, 4 overlapped steps on fixed random gradients; peer 0's parameter bytes."""
    cfg = preset(name, overlap=True, warmup_steps=0)
    hub = MemoryHub()
    opts, models = [], []
    for i in range(3):
        ident = Identity.from_seed(bytes([i + 1]) * 32)
        model = GPT(GPTConfig(depth=1), seed=0)
        opts.append(
            DistroOptimizer(
                model.named_parameters(), cfg, hub.join(ident.peer_id), ident, roles=tensor_roles(model)
            )
        )
        models.append(model)
    with monkeypatch.context() as m:
        if old:
            m.setattr(distro, "round_sums", _per_tensor)
        for step in range(4):
            for i, model in enumerate(models):
                g = torch.Generator().manual_seed(100 * step + i)
                for p in model.parameters():
                    p.grad = torch.randn(p.shape, generator=g)
            for o in opts:
                o.begin_step()
            for o in opts:
                o.finish_step()
    return [p.detach().numpy().tobytes() for p in models[0].parameters()]


@pytest.mark.parametrize("name", ["ours_k32", "ours_k4_1bit"])
def test_optimizer_steps_are_bit_identical_to_the_per_tensor_decode(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _train(name, monkeypatch, old=False) == _train(name, monkeypatch, old=True)


def test_decode_flat_results_outlive_the_next_call() -> None:
    """Its products live in per-thread scratch: a result that would be a view of one (a tensor
    of one column of chunks) is copied out, so the next call never changes an earlier result."""
    from distronet.kernels.decode import decode_flat
    from distronet.kernels.layout import plan_layout

    shapes = [(2000, 40), (3, 200, 40), (64, 64), (67, 131), (300,)]  # (2000, 40): 80k coefficients
    layouts = [plan_layout(s, 64) for s in shapes]
    nk = [(lay.n_chunks, lay.chunk_numel) for lay in layouts]

    def payload(seed: int) -> list[object]:
        g = torch.Generator().manual_seed(seed)
        coded = []
        for t, lay in enumerate(layouts):
            idx, val = topk_chunks(torch.randn(nk[t], generator=g), 5)
            vc, ic = preset("ours_k32").extraction.value_coding, preset("ours_k32").extraction.index_coding
            coded.append(encode_tensor(t, idx.numpy(), val.numpy(), lay.chunk_numel, vc, ic)[0])
        return [decode_payload(encode_payload(coded), nk)]

    first = decode_flat(layouts, payload(1))
    kept = [x.clone() for x in first]
    second = decode_flat(layouts, payload(2))
    for a, b, c in zip(first, kept, second, strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)
