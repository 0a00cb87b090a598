"""decode_flat: every tensor of every payload in one pass equals per-tensor decode_sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distronet.kernels import decode, decode_plan
from distronet.kernels.coding import (
    IndexCoding,
    ValueCoding,
    decode_payload,
    encode_payload,
    encode_tensor,
    warm,
)
from distronet.kernels.decode import decode_flat, decode_sum
from distronet.kernels.decode_plan import plan_batch
from distronet.kernels.layout import plan_layout
from distronet.kernels.topk import dct_topk
from distronet.protocol.errors import KernelError

# Small tensors of several block shapes (padded, batched) and one "big" one (over the patched
# SMALL_COEFFICIENTS: spatial order, its own inverse).
SHAPES = [(), (7,), (200,), (67, 131), (128, 96), (2, 3, 20, 70), (64, 64), (160, 144)]


@pytest.fixture(autouse=True)
def _small_big_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode_plan, "SMALL_COEFFICIENTS", 20_000)
    plan_batch.cache_clear()


def _parts(shapes: list[tuple[int, ...]], seed: int, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    lays = [plan_layout(s, 16) for s in shapes]
    return [
        dct_topk(torch.randn(s, generator=g), lay, min(k, lay.chunk_numel))
        for s, lay in zip(shapes, lays, strict=True)
    ]


def test_plan_puts_big_tensors_apart() -> None:
    plan = plan_batch(tuple(plan_layout(s, 16) for s in SHAPES))
    assert plan.big == (False,) * 7 + (True,)
    assert plan.size == sum(plan_layout(s, 16).n_coefficients for s in SHAPES)
    blocks = [g.block for g in plan.groups]
    assert len(blocks) == len(set(blocks))  # one group per block shape
    assert sum(g.n_chunks for g in plan.groups) == sum(plan_layout(s, 16).n_chunks for s in SHAPES[:7])


def test_decode_flat_of_coded_payloads_equals_decode_sum() -> None:
    shapes = [(200,), (67, 131), (2, 3, 20, 70), (160, 144)]
    layouts = [plan_layout(s, 16) for s in shapes]
    nk = [(lay.n_chunks, lay.chunk_numel) for lay in layouts]
    flats = []
    parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in shapes]
    codings = [(ValueCoding.FP32, IndexCoding.FIXED), (ValueCoding.SIGN1, IndexCoding.ENTROPY)]
    for seed, (vc, ic) in enumerate(codings):
        first = seed  # the second payload leaves tensor 0 out
        coded = []
        for t, (idx, val) in enumerate(_parts(shapes, seed, 3)):
            if t < first:
                continue
            enc, deq = encode_tensor(t, idx.numpy(), val.numpy(), layouts[t].chunk_numel, vc, ic)
            coded.append(enc)
            parts[t].append((idx, torch.from_numpy(deq)))
        flats.append(decode_payload(encode_payload(coded), nk))
    got = decode_flat(layouts, flats)
    for lay, ps, x in zip(layouts, parts, got, strict=True):
        assert x.shape == lay.shape and x.dtype == torch.float32
        torch.testing.assert_close(x, decode_sum(lay, ps), atol=2e-5, rtol=1e-5)
    with pytest.raises(KernelError):
        decode_flat(layouts[:2], flats)


def test_compiled_spread_is_bit_identical_to_index_add(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled spread adds what ``index_add_`` adds, in the same order: equal bits, with
    small and big (spatial-order) tensors, every coding, several k, packets missing tensors."""
    assert warm(), "numba is a dependency: the compiled decoder must be available"
    layouts = [plan_layout(s, 16) for s in SHAPES]
    nk = [(lay.n_chunks, lay.chunk_numel) for lay in layouts]
    flats = []
    for seed in range(10):
        vc, ic = ValueCoding(1 + seed % 5), IndexCoding(1 + seed % 2)
        coded = [
            encode_tensor(t, idx.numpy(), val.numpy(), layouts[t].chunk_numel, vc, ic)[0]
            for t, (idx, val) in enumerate(_parts(SHAPES, seed, 1 + seed % 6))
            if (t + seed) % 4  # each packet leaves some tensors out
        ]
        flats.append(decode_payload(encode_payload(coded), nk))
    got = [x.clone() for x in decode_flat(layouts, flats)]
    monkeypatch.setattr(decode, "use_jit", lambda: False)
    want = decode_flat(layouts, flats)
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))


def _payloads(shapes: list[tuple[int, ...]], k: int, n: int, skip: int | None = None) -> list:
    layouts = [plan_layout(s, 16) for s in shapes]
    nk = [(lay.n_chunks, lay.chunk_numel) for lay in layouts]
    out = []
    for seed in range(n):
        vc, ic = ValueCoding(1 + seed % 5), IndexCoding(1 + seed % 2)
        coded = [
            encode_tensor(t, idx.numpy(), val.numpy(), layouts[t].chunk_numel, vc, ic)[0]
            for t, (idx, val) in enumerate(_parts(shapes, seed, k))
            if not (seed == 0 and t == skip)
        ]
        out.append(decode_payload(encode_payload(coded), nk))
    return out


def _parts_of(flats: list, t: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Tensor ``t``'s parts in the payloads, in payload order: ``decode_sum``'s arguments."""
    mine = [d for f in flats for d in f.tensors() if d.tensor_id == t]
    return [(torch.from_numpy(d.idx), torch.from_numpy(d.val)) for d in mine]


@pytest.mark.parametrize(("k", "n"), [(1, 1), (3, 1), (3, 2), (8, 1)])
def test_sparse_inverse_is_bit_identical_to_decode_sum(k: int, n: int) -> None:
    """Small summed k: decode_flat rebuilds every tensor (small ones by block shape, the big one
    alone) from its coefficients, bit for bit as decode_sum does per tensor."""
    warm()
    layouts = [plan_layout(s, 16) for s in SHAPES]
    flats = _payloads(SHAPES, k, n)
    got, took = decode.decode_flat_methods(layouts, flats)
    for t, (lay, x) in enumerate(zip(layouts, got, strict=True)):
        parts = _parts_of(flats, t)
        total = sum(int(p[0].shape[1]) for p in parts)
        assert took[t] == decode.choose_method(lay, total)
        want = decode_sum(lay, parts, dtype=torch.float32)
        assert x.shape == lay.shape and torch.equal(x.view(torch.int32), want.view(torch.int32)), (k, n, t)
    assert "sparse" in took


def test_sparse_inverse_skips_a_block_shape_some_packet_half_carries() -> None:
    """A payload that leaves out one tensor of a block shape: that shape goes dense (still the
    sum), the other shapes stay sparse, and decode_flat says which took which."""
    shapes = [(64, 64), (32, 48), (200,), (48,)]  # two tensors of block (16, 16), two of (16,)
    layouts = [plan_layout(s, 16) for s in shapes]
    flats = _payloads(shapes, 2, 2, skip=1)
    got, took = decode.decode_flat_methods(layouts, flats)
    assert took == ["dense", "dense", "sparse", "sparse"]
    for t, (lay, x) in enumerate(zip(layouts, got, strict=True)):
        parts = _parts_of(flats, t)
        torch.testing.assert_close(x, decode_sum(lay, parts, method="dense"), atol=2e-5, rtol=1e-5)


# Small 2-D tensors of one block shape (16, 16) at three padded column counts (144 padded and
# not, 96, 64 with a batch), of block (10, 14) with and without a batch, 1-D ones and a big one.
DENSE_SHAPES = [
    (7,),
    (200,),
    (67, 131),
    (128, 96),
    (48, 144),
    (64, 64),
    (2, 64, 64),
    (2, 3, 20, 70),
    (40, 70),
    (160, 144),
]


def test_plan_puts_small_2d_tensors_in_spatial_runs() -> None:
    """Small 2-D tensors: spatial order, stacked by (block shape, padded columns); every position
    of the buffer belongs to exactly one coefficient of one tensor."""
    layouts = tuple(plan_layout(s, 16) for s in DENSE_SHAPES)
    plan = plan_batch(layouts)
    seen = np.zeros(plan.size, dtype=np.int64)
    for t, lay in enumerate(layouts):
        idx = np.broadcast_to(np.arange(lay.chunk_numel, dtype=np.int64), (lay.n_chunks, lay.chunk_numel))
        pos = plan.positions(t, idx)
        assert pos.min() == plan.offset[t] and pos.max() == plan.offset[t] + lay.n_coefficients - 1
        np.add.at(seen, pos.reshape(-1), 1)
        assert (plan.local[t] is None) == (len(lay.block) == 1 and not plan.big[t])
    assert (seen == 1).all()
    for g in plan.groups:
        if len(g.block) == 1:
            assert g.runs == ()
            continue
        assert [t for r in g.runs for t in r.members] == list(g.members)
        assert len({r.cols for r in g.runs}) == len(g.runs)
        for r in g.runs:
            assert {layouts[t].padded[1] for t in r.members} == {r.cols}
            assert r.rows == sum(layouts[t].batch * layouts[t].padded[0] for t in r.members)
            assert plan.offset[r.members[0]] == r.start
    assert sorted(len(r.members) for g in plan.groups for r in g.runs) == [1, 2, 2, 2]


@pytest.mark.parametrize("jit", [True, False])
def test_dense_inverse_is_bit_identical_to_decode_sum(monkeypatch: pytest.MonkeyPatch, jit: bool) -> None:
    """Summed k too large for the sparse inverse: every tensor goes through the plan's dense
    inverse (spatial runs for the small 2-D ones), bit for bit as decode_sum inverts it alone;
    the results are not overwritten by a later decode_flat."""
    assert warm()
    if not jit:
        monkeypatch.setattr(decode, "use_jit", lambda: False)
    layouts = [plan_layout(s, 16) for s in DENSE_SHAPES]
    flats = _payloads(DENSE_SHAPES, 12, 2)
    got, took = decode.decode_flat_methods(layouts, flats)
    assert took == ["dense"] * len(layouts)
    kept = [x.clone() for x in got]
    for t, (lay, x) in enumerate(zip(layouts, got, strict=True)):
        parts = _parts_of(flats, t)
        want = decode_sum(lay, parts, dtype=torch.float32)
        assert x.shape == lay.shape and torch.equal(x.view(torch.int32), want.view(torch.int32)), t
    decode_flat(layouts, _payloads(DENSE_SHAPES, 12, 1))
    for x, y in zip(got, kept, strict=True):
        assert torch.equal(x, y)


def test_invert_skips_done_tensors_of_a_run() -> None:
    """``done`` tensors come back as given; the others of their run are inverted as without."""
    layouts = tuple(plan_layout(s, 16) for s in DENSE_SHAPES)
    plan = plan_batch(layouts)
    buf = torch.randn(plan.size, generator=torch.Generator().manual_seed(0))
    full = decode_plan.invert(plan, buf)
    (run,) = [r for g in plan.groups for r in g.runs if len(r.members) == 2 and g.block == (16, 16)][:1]
    mark = torch.zeros(layouts[run.members[0]].shape)
    part = decode_plan.invert(plan, buf, {run.members[0]: mark})
    for t, (x, y) in enumerate(zip(full, part, strict=True)):
        assert y is mark if t == run.members[0] else torch.equal(x, y)


def test_the_compiled_decode_writes_every_region_it_reads() -> None:
    """Nothing is zeroed beforehand: the compiled decode writes each region the inverse reads
    whole (zeros, then the entries), so a buffer full of NaN from before (a failed round's
    leftovers, say) changes no bit. One tensor is sparse (k = 2), its region neither written
    nor read."""
    from distronet.kernels import workspace

    assert warm()
    shapes = [(200,), (67, 131), (128, 96), (160, 144)]
    layouts = [plan_layout(s, 16) for s in shapes]
    nk = [(lay.n_chunks, lay.chunk_numel) for lay in layouts]
    plan = plan_batch(tuple(layouts))
    for seed in range(3):
        coded, parts = [], []
        for t, shape in enumerate(shapes):
            ((idx, val),) = _parts([shape], 10 + seed + t, 2 if t == 0 else 24)
            enc, deq = encode_tensor(
                t, idx.numpy(), val.numpy(), nk[t][1], ValueCoding.FP32, IndexCoding.FIXED
            )
            coded.append(enc)
            parts.append([(idx, torch.from_numpy(deq))])
        flat = decode_payload(encode_payload(coded), nk)
        workspace.scratch(1, (plan.size,), torch.float32, torch.device("cpu")).fill_(float("nan"))
        got, methods = decode.decode_flat_methods(layouts, [flat])
        assert methods == ["sparse", "dense", "dense", "dense"]
        for lay, ps, x in zip(layouts, parts, got, strict=True):
            assert torch.equal(x, decode_sum(lay, ps)) and bool(x.isfinite().all())


@pytest.mark.parametrize("pieces", [1, 3, 8, 1000])
def test_spread_pieces_cover_every_block_row_once_in_order(pieces: int) -> None:
    layouts = tuple(plan_layout(s, 16) for s in [(200,), (67, 131), (1, 16), (640, 480), (33,)])
    plan = plan_batch(layouts)
    need = [True, True, False, True, True]
    got = plan.spread_pieces(need, pieces)
    assert 1 <= len(got) <= pieces
    rows = [(int(t), r) for items in got for t, r0, r1 in items.tolist() for r in range(r0, r1)]
    rows_of, size = plan.block_rows
    want = [(t, r) for t in range(len(layouts)) if need[t] for r in range(int(rows_of[t]))]
    assert rows == want
    if pieces == 3:  # about equal in floats: none more than twice the mean
        floats = [sum((r1 - r0) * int(size[t]) for t, r0, r1 in items.tolist()) for items in got]
        assert max(floats) <= 2 * sum(floats) / len(floats)


def test_a_piece_written_twice_writes_the_same_bits() -> None:
    """A round's pieces may run twice (the caller redoing one a helper has not finished): each
    block row is summed in the thread's own tile and copied out, so writing again changes nothing."""
    assert warm()
    shapes = [(200,), (67, 131), (160, 144)]
    layouts = [plan_layout(s, 16) for s in shapes]
    flats = _payloads(shapes, 24, 3)
    plan = plan_batch(tuple(layouts))
    z = torch.full((plan.size,), float("nan"))
    need = np.ones(len(layouts), dtype=np.bool_)
    decode._spread_compiled(plan, z, flats, need)
    once = z.clone()
    decode._spread_compiled(plan, z, flats, need)
    assert torch.equal(once.view(torch.int32), z.view(torch.int32)) and bool(z.isfinite().all())


@pytest.mark.parametrize("k", [1, 2, 24])  # sparse inverse (scratch factors, product; big ones at 1), dense
def test_results_never_share_memory_with_the_next_decode(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode's temporaries live in per-thread scratch buffers; what it returns must not:
    a second decode leaves the first one's results as they were. Big tensors too (here over
    4,000 coefficients), whose chunk-order product is the result's own order when they are 1-D
    or one block wide (over ``workspace.MIN_SCRATCH_NUMEL``: in scratch)."""
    monkeypatch.setattr(decode_plan, "SMALL_COEFFICIENTS", 4_000)
    plan_batch.cache_clear()
    shapes = [(200,), (67, 131), (160, 144), (128, 64), (640, 256), (70_000,), (4_400, 16), (300, 16)]
    layouts = [plan_layout(s, 16) for s in shapes]
    first, second = _payloads(shapes, k, 2)
    got = decode_flat(layouts, [first])
    kept = [x.clone() for x in got]
    decode_flat(layouts, [second])
    decode_flat(layouts, [second, first])
    for x, y in zip(got, kept, strict=True):
        assert torch.equal(x, y)
