"""``coding_batch.encode_groups`` writes the bytes of ``encode_tensor`` + ``encode_payload``.

The batched encoder codes every tensor of one class in one pass; the per-tensor encoder is the
oracle. Random payloads mix every value and index coding, chunk sizes with and without a square
side (so ENTROPY's three rank maps and its fixed-width fallback all occur), dense tensors,
unsorted indices, zero chunks and tiny and large scales; errors must be raised for the same
inputs with the same type.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from distronet.kernels.coding import IndexCoding, ValueCoding, decode_payload, encode_payload, encode_tensor
from distronet.kernels.coding_batch import CodingGroup, encode_batch, encode_groups
from distronet.kernels.coding_index import RankMap, encode_indices
from distronet.protocol.errors import KernelError

Item = tuple[int, np.ndarray, np.ndarray, int, ValueCoding, IndexCoding]


def _items(rng: np.random.Generator) -> list[Item]:
    items = []
    for tid in rng.choice(40, size=int(rng.integers(1, 12)), replace=False):
        cn = int(rng.choice([1, 2, 3, 7, 16, 64, 100, 256, 4096]))
        k = cn if rng.random() < 0.3 else min(int(rng.choice([1, 2, 4, 8, 32])), cn)
        n = int(rng.integers(1, 700))
        kind = rng.integers(3)
        if kind == 1:  # low frequencies favoured, as a DCT's top-k
            w = np.exp(-np.arange(cn) / max(1.0, cn / 8))
            idx = np.sort(np.argsort(-rng.random((n, cn)) * w, axis=1)[:, :k], axis=1)
        else:
            idx = np.argsort(rng.random((n, cn)), axis=1)[:, :k]
            if kind == 0:
                idx = np.sort(idx, axis=1)
        val = (rng.standard_normal((n, k)) * 10.0 ** rng.integers(-6, 3)).astype(np.float32)
        if rng.random() < 0.2:
            val[: int(rng.integers(1, n + 1))] = 0.0
        vc = list(ValueCoding)[int(rng.integers(len(ValueCoding)))]
        ic = list(IndexCoding)[int(rng.integers(len(IndexCoding)))]
        items.append((int(tid), idx, val, cn, vc, ic))
    return items


@pytest.mark.parametrize("jit", [True, False])
def test_batched_payloads_equal_per_tensor_ones(jit: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte for byte, with the compiled ENTROPY planning and fields (``coding_jit_index``) and
    with the numpy passes."""
    from distronet.kernels import coding_batch, coding_batch_plan
    from distronet.kernels.coding import warm

    if jit:
        assert warm()
    else:
        monkeypatch.setattr(coding_batch, "use_jit", lambda: False)
        monkeypatch.setattr(coding_batch_plan, "use_jit", lambda: False)
    rng = np.random.default_rng(0)
    maps: Counter[RankMap | None] = Counter()
    checked = 0
    for _ in range(80):
        items = _items(rng)
        try:
            coded = [encode_tensor(*it) for it in items]
            want = encode_payload([c for c, _ in coded])
        except KernelError:  # e.g. more than 15 classes: the batched encoder refuses it too
            with pytest.raises(KernelError):
                encode_batch(items)
            continue
        got, deq = encode_batch(items)
        assert got == want
        for (_, d_want), d_got in zip(coded, deq, strict=True):
            assert np.array_equal(d_got, d_want)
        for _tid, idx, _, cn, _, ic in items:
            if ic == IndexCoding.ENTROPY and idx.shape[1] < cn:
                code, _ = encode_indices(np.sort(idx, axis=1), cn, ic)
                assert code is not None
                maps[code.rank_map] += 1
        checked += 1
    assert checked >= 50
    assert all(maps[m] >= 5 for m in RankMap), maps  # every rank map and the fallback were met


def test_groups_decode_to_what_was_sent() -> None:
    rng = np.random.default_rng(1)
    idx = np.sort(np.argsort(rng.random((30, 64)), axis=1)[:, :4], axis=1)
    val = rng.standard_normal((30, 4)).astype(np.float32)
    g = CodingGroup((3, 0, 7), (10, 15, 5), idx, val, 64, ValueCoding.INT8, IndexCoding.ENTROPY)
    payload, (deq,) = encode_groups([g])
    flat = decode_payload(payload, [(15, 64), (1, 64), (1, 64), (10, 64), (1, 64), (1, 64), (1, 64), (5, 64)])
    got = {t.tensor_id: t for t in flat.tensors()}
    for tid, a, b in ((3, 0, 10), (0, 10, 25), (7, 25, 30)):
        assert np.array_equal(got[tid].idx, idx[a:b]) and np.array_equal(got[tid].val, deq[a:b])


@pytest.mark.parametrize(
    "rows, ids, idx, err",
    [
        ((2,), (0,), [[0, 1], [1, 1]], "repeats"),
        ((1,), (0,), [[0, 64]], "lie in"),
        ((1, 2), (0, 1), [[0, 1], [2, 3]], "split"),
        ((1,), (-1,), [[0, 1]], "id"),
    ],
)
def test_bad_groups_are_refused(
    rows: tuple[int, ...], ids: tuple[int, ...], idx: list[list[int]], err: str
) -> None:
    i = np.array(idx, dtype=np.int64)
    g = CodingGroup(ids, rows, i, np.ones(i.shape, np.float32), 64, ValueCoding.FP32, IndexCoding.FIXED)
    with pytest.raises(KernelError, match=err):
        encode_groups([g])


def test_a_repeated_id_and_non_finite_values_are_refused() -> None:
    i = np.array([[0, 1]], dtype=np.int64)
    one = CodingGroup((0,), (1,), i, np.ones((1, 2), np.float32), 64, ValueCoding.FP32, IndexCoding.FIXED)
    with pytest.raises(KernelError, match="twice"):
        encode_groups([one, one])
    nan = CodingGroup(
        (0,), (1,), i, np.array([[1.0, np.nan]], np.float32), 64, ValueCoding.INT8, IndexCoding.FIXED
    )
    with pytest.raises(KernelError, match="NaN"):
        encode_groups([nan])


def _index_sets(rng: np.random.Generator) -> list[tuple[np.ndarray, int, np.ndarray]]:
    """ENTROPY groups of every kind the planner meets: square and other chunks, k from 1 up,
    tensors sampled whole (under 1,024 chunks) and strided, low-frequency clusters (a rank map
    wins), uniform positions (FALLBACK), a chunk with k = chunk - 1."""
    sets = []
    for cn, k, rows, low in [
        (4096, 32, [784], False),
        (4096, 32, [16, 176, 48, 1200, 3], True),
        (4096, 1, [40, 7], True),
        (64, 4, [300, 2000], True),
        (64, 63, [5, 9], False),
        (2304, 16, [129, 1500], True),
        (100, 7, [50], False),
        (49, 3, [1, 1, 1], True),
        (4096, 300, [20], True),
    ]:
        start = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        span = min(cn, 4 * k) if low else cn
        idx = np.sort(
            np.stack([rng.choice(span, size=k, replace=False) for _ in range(int(start[-1]))]), axis=1
        )
        sets.append((idx.astype(np.int64), cn, start))
    # anti-diagonal clusters (u + v small: DIAGONAL wins), then one uniform index a chunk (FALLBACK)
    tri = np.array([p for p in range(4096) if p // 64 + p % 64 < 12])
    diag = np.sort(np.stack([rng.choice(tri, size=32, replace=False) for _ in range(50)]), axis=1)
    one = np.sort(rng.choice(4096, size=(60, 1)), axis=1)
    sets.append((np.concatenate([diag, diag[:7]]).astype(np.int64), 4096, np.array([0, 50, 57])))
    sets.append((one.astype(np.int64), 4096, np.array([0, 60])))
    return sets


def test_the_compiled_planner_makes_the_numpy_passes_choices() -> None:
    """``_entropy`` once warm (``coding_jit_index.plan``) gives what ``_entropy_numpy`` gives:
    the same rank map per tensor, the same gaps in every non-FALLBACK row, the same wire order."""
    from distronet.kernels import coding_batch_plan
    from distronet.kernels.coding import warm

    assert warm()
    seen = set()
    for idx, cn, start in _index_sets(np.random.default_rng(3)):
        got = coding_batch_plan._entropy(idx, cn, start)
        want = coding_batch_plan._entropy_numpy(idx, cn, start)
        assert got[0] == want[0], (cn, idx.shape)
        seen |= set(want[0])
        for t, rm in enumerate(want[0]):
            if rm is not RankMap.FALLBACK:
                rows = slice(int(start[t]), int(start[t + 1]))
                np.testing.assert_array_equal(got[1][rows], want[1][rows])
        assert (got[2] is None) == (want[2] is None)
        if want[2] is not None:
            np.testing.assert_array_equal(got[2], want[2])
    assert seen == set(RankMap)  # every map, FALLBACK included, was chosen somewhere


def test_planning_in_pieces_over_threads_gives_the_same_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    """``encode_groups`` plans every ENTROPY group's tensors in pieces over a few threads
    (``PLAN_PIECE_ROWS``): pieces of one tensor each, over 1 or 2 threads, write the payload and
    values of one piece per group."""
    import torch

    from distronet.kernels import coding_batch_plan
    from distronet.kernels.coding import warm

    assert warm()
    rng = np.random.default_rng(11)
    groups = []
    for gi, (cn, k) in enumerate([(4096, 32), (256, 8), (4096, 4)]):
        rows = tuple(int(r) for r in rng.integers(1, 40, size=6))
        w = np.exp(-np.arange(cn) / (cn / 8))
        idx = np.sort(np.argsort(-rng.random((sum(rows), cn)) * w, axis=1)[:, :k], axis=1)
        val = rng.standard_normal(idx.shape).astype(np.float32)
        ids = tuple(range(10 * gi, 10 * gi + len(rows)))
        groups.append(CodingGroup(ids, rows, idx, val, cn, ValueCoding.INT8, IndexCoding.ENTROPY))
    job = coding_batch_plan._plan_job(groups[0].idx, 4096, np.concatenate([[0], np.cumsum(groups[0].rows)]))
    assert job is not None and job.pieces(1) == [(t, t + 1) for t in range(6)]
    assert job.pieces(10**9) == [(0, 6)]
    monkeypatch.setattr(coding_batch_plan, "PLAN_PIECE_ROWS", 10**9)
    want = encode_groups(groups)
    monkeypatch.setattr(coding_batch_plan, "PLAN_PIECE_ROWS", 1)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = encode_groups(groups)
            assert got[0] == want[0]
            for a, b in zip(got[1], want[1], strict=True):
                np.testing.assert_array_equal(a, b)
    finally:
        torch.set_num_threads(threads)
