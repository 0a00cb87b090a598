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
        momenta = [
            packets.to_momentum(p, torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g))
            for p in plans
        ]
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


def _per_tensor_frame(
    plans, momenta, cfg, step, ident, digest
) -> tuple[bytes, list[tuple[torch.Tensor, object]]]:  # type: ignore[no-untyped-def]
    """``build_packet`` as it was before batching: one top-k and one ``encode_tensor`` per tensor."""
    import numpy as np

    from distronet.kernels.coding import encode_payload, encode_tensor
    from distronet.kernels.topk import topk_chunks
    from distronet.protocol.packet import seal_packet

    ex, k_now = cfg.extraction, cfg.extraction.k_at(step)
    coded, sent = [], []
    for plan, m in zip(plans, momenta, strict=True):
        k = plan.k(k_now)
        if plan.dense:
            idx, val = torch.arange(k, dtype=torch.int64).expand(m.shape[0], k), m
        else:
            idx, val = topk_chunks(m, k)
        vc = ex.dense_value_coding if plan.dense else ex.value_coding
        enc, deq = encode_tensor(
            plan.tensor_id,
            np.ascontiguousarray(idx.numpy(), dtype=np.int64),
            np.ascontiguousarray(val.numpy(), dtype=np.float32),
            plan.layout.chunk_numel,
            vc,
            ex.index_coding,
        )
        coded.append(enc)
        sent.append((idx, deq))
    return seal_packet(ident, cfg.run_id, step, digest, encode_payload(coded)), sent


@pytest.mark.parametrize("name", sorted(PACKET_BYTES_DEFAULT_GPT))
@pytest.mark.parametrize("model", ["gpt", "mixed"])
def test_batched_packet_bytes_equal_per_tensor_coding(name: str, model: str) -> None:
    """The batched encoder (one top-k and coding pass per class of tensors) writes the same frame,
    byte for byte, and sends the same values as coding tensor by tensor, for every preset, on the
    default GPT's real-shaped momenta and on a mix of shapes (padded dims, prime dims, 3-D,
    scalars, all-zero chunks, a tensor whose momentum is zero)."""
    import numpy as np

    from distronet.node.optim import packets

    cfg = preset(name)
    if model == "gpt":
        shapes = [(n, tuple(p.shape)) for n, p in GPT(GPTConfig(), seed=0).named_parameters()]
    else:
        shapes = [
            ("a", (96, 128)),
            ("b", (40,)),
            ("c", (300,)),
            ("d", (67, 131)),
            ("e", (2, 3, 64, 64)),
            ("f", ()),
            ("g", (96, 128)),
            ("h", (1, 5)),
            ("i", (128, 96)),
            ("z", (64, 64)),
        ]
    plans = packets.make_plans(shapes, cfg)
    digest = packets.run_digest(plans)
    ident = Identity.from_seed(bytes([9]) * 32)
    g = torch.Generator().manual_seed(1)
    for step in (0, 5):
        momenta = []
        for p in plans:
            m = torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g)
            m *= torch.rand(p.layout.n_chunks, 1, generator=g).square()  # chunks of unequal scale
            if p.layout.n_chunks > 2:
                m[1] = 0.0  # an all-zero chunk
            momenta.append(m)
        momenta[-1].zero_()
        want, want_sent = _per_tensor_frame(plans, momenta, cfg, step, ident, digest)
        # the optimizer's own momenta (2-D ones in spatial order): one buffer per class, whose
        # top-k is read in place; the same momenta apart, stacked into a copy
        loose = [packets.to_momentum(p, m) for p, m in zip(plans, momenta, strict=True)]
        assert any(p.spatial for p in plans) and any(not p.spatial for p in plans)
        held = packets.momentum_buffers(plans, [torch.empty(0)] * len(plans))
        for h, m in zip(held, loose, strict=True):
            h.copy_(m)
        for ms in (loose, held):
            got, got_sent = packets.build_packet(plans, ms, cfg, step, ident, digest)
            assert got == want
            for s, (idx, deq) in zip(got_sent, want_sent, strict=True):
                assert torch.equal(s.idx, idx) and np.array_equal(s.val.numpy(), deq)


def test_a_class_of_momenta_in_one_buffer_is_read_in_place_else_stacked() -> None:
    """``momentum_buffers`` lays each class's momenta one after another in one storage (2-D ones
    in spatial order, a class per padded column count), which ``_stacked`` views without a copy;
    momenta that are not (after a state load, say) are stacked into a copy, the same values
    either way."""
    from distronet.node.optim import packets

    cfg = preset("ours_k32")
    shapes = [("a", (128, 64)), ("b", (40,)), ("c", (64, 64)), ("w", (64, 128)), ("d", (130, 64))]
    plans = packets.make_plans(shapes, cfg)
    held = packets.momentum_buffers(plans, [torch.empty(0)] * len(plans))
    assert [tuple(h.shape) for h in held] == [(128, 64), (1, 40), (64, 64), (64, 128), (192, 64)]
    assert [p.spatial for p in plans] == [True, False, True, True, True]
    for i, h in enumerate(held):
        h.fill_(i + 1)
    narrow = [held[i] for i in (0, 2, 4)]  # the class of 64 x 64 chunks and 64 padded columns
    view = packets._stacked(narrow, 64)
    assert view.untyped_storage().data_ptr() == held[0].untyped_storage().data_ptr()
    assert held[3].untyped_storage().data_ptr() != held[0].untyped_storage().data_ptr()  # 128 columns
    loose = [h.clone() for h in narrow]
    copy = packets._stacked(loose, 64)
    assert copy.untyped_storage().data_ptr() != loose[0].untyped_storage().data_ptr()
    assert torch.equal(view, copy) and torch.equal(view, torch.cat(narrow))
    assert torch.equal(packets._stacked([narrow[0], narrow[2]], 64), torch.cat([narrow[0], narrow[2]]))


def test_a_momentum_round_trips_through_its_layout_and_feeds_back_exactly() -> None:
    """``to_momentum`` / ``momentum_chunks`` are inverse; ``feed_back`` takes the sent values out
    of (and gives them back to) the very coefficients the chunk-order indices name."""
    from distronet.node.optim import packets

    cfg = preset("ours_k32")
    plans = packets.make_plans([("a", (130, 70)), ("b", (40,)), ("c", (2, 64, 128))], cfg)
    g = torch.Generator().manual_seed(3)
    for plan in plans:
        c = torch.randn(plan.layout.n_chunks, plan.layout.chunk_numel, generator=g)
        m = packets.to_momentum(plan, c.clone())  # (1-D: the tensor itself)
        assert tuple(m.shape) == plan.momentum_shape
        assert torch.equal(packets.momentum_chunks(plan, m), c)
        idx = torch.stack([torch.randperm(plan.layout.chunk_numel, generator=g)[:5].sort().values for _ in c])
        val = torch.gather(c, 1, idx) * 0.25
        sent = packets.SentTensor(idx, val)
        packets.feed_back(plan, m, sent, -1.0)
        want = c.clone()
        want.scatter_(1, idx, torch.gather(c, 1, idx) - val)
        assert torch.equal(packets.momentum_chunks(plan, m), want)
        packets.feed_back(plan, m, sent, 1.0)
        assert torch.equal(packets.momentum_chunks(plan, m), want.scatter_add(1, idx, val))


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_feed_back_all_is_feed_back_tensor_by_tensor(sign: float) -> None:
    """The error feedback of a whole step (``feed_back_all``: a class of spatial momenta in one
    compiled pass, or one scatter) writes what ``feed_back`` writes tensor by tensor, for the
    optimizer's class buffers and for momenta that do not share one."""
    from distronet.kernels.coding import warm
    from distronet.node.optim import packets

    assert warm()
    cfg = preset("ours_k32")
    shapes = [("a", (128, 64)), ("b", (40,)), ("c", (64, 64)), ("w", (64, 200)), ("d", (130, 64))]
    plans = packets.make_plans(shapes, cfg)
    g = torch.Generator().manual_seed(4)
    held = packets.momentum_buffers(plans, [torch.empty(0)] * len(plans))
    for m in held:
        m.normal_(generator=g)
    sent = []
    for p in plans:
        n, cn, k = p.layout.n_chunks, p.layout.chunk_numel, p.k(32)
        idx = torch.stack([torch.randperm(cn, generator=g)[:k].sort().values for _ in range(n)])
        sent.append(packets.SentTensor(idx, torch.randn(n, k, generator=g)))
    want = [m.clone() for m in held]
    for p, m, s in zip(plans, want, sent, strict=True):
        packets.feed_back(p, m, s, sign)
    loose = [m.clone() for m in held]
    packets.feed_back_all(plans, held, sent, sign)
    packets.feed_back_all(plans, loose, sent, sign)
    for a, b, c in zip(held, loose, want, strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)
