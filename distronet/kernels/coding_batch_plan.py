"""ENTROPY index planning for :mod:`coding_batch`: a rank map per tensor, its gaps and wire order.

:func:`_entropy` answers for one coding group: which rank map each tensor's indices take (the
cheapest estimate on up to ``_SAMPLE_CHUNKS`` sampled chunks a tensor), whether it falls back to a
fixed-width body, each chunk's gaps of its sorted ranks and the order that sorts them. Once the
compiled kernels are warm :class:`_PlanJob` runs :func:`coding_jit_index.plan` (tensor ranges are
independent, so ``coding_batch.encode_groups`` spreads every group's pieces over a few threads);
else :func:`_entropy_numpy` makes the same choices with whole-array numpy passes (tests hold the
two equal). :func:`_take_rows` / :func:`_put_rows` move values into and out of wire order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from distronet.kernels.coding_bucket import _tables, buckets_of
from distronet.kernels.coding_index import _SAMPLE_CHUNKS, RankMap, fixed_width, rank_tables, square_side
from distronet.kernels.jit_state import use_jit

__all__ = ["PLAN_PIECE_ROWS"]


def _hist(b: np.ndarray, seg: np.ndarray, t: int, bmax: int) -> np.ndarray:
    """Per-tensor bucket histograms ``(t, bmax + 1)`` of buckets ``b`` belonging to tensors ``seg``."""
    h: np.ndarray = np.bincount(seg * (bmax + 1) + b, minlength=t * (bmax + 1)).reshape(t, bmax + 1)
    return h


def _best_costs(hist: np.ndarray, bmax: int) -> np.ndarray:
    """``best_params(...)[0]`` of every row's histogram (bits including mantissas), int64 (t,)."""
    orders, costs = _tables(bmax)
    total = hist[:, orders] @ costs.T  # (t, b0, w)
    mantissa = hist[:, 2:] @ np.arange(1, bmax, dtype=np.int64)
    out: np.ndarray = total.reshape(hist.shape[0], -1).min(axis=1) + mantissa
    return out


def _estimates(gaps: np.ndarray, seg_rows: np.ndarray, t: int, bmax: int) -> np.ndarray:
    """``coding_index._estimate`` of each tensor's rows of ``gaps`` (class A + class B bits)."""
    b = buckets_of(gaps)
    k = gaps.shape[1]
    cost_a = _best_costs(_hist(b[:, 0], seg_rows, t, bmax), bmax)
    if k == 1:
        return cost_a
    seg_b = np.repeat(seg_rows, k - 1)
    out: np.ndarray = cost_a + _best_costs(_hist(b[:, 1:].reshape(-1), seg_b, t, bmax), bmax)
    return out


def _sorted_ranks(idx: np.ndarray, table: np.ndarray) -> np.ndarray:
    ranks: np.ndarray = np.sort(table[idx], axis=1)
    return ranks


def _gaps(ranks: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.diff(ranks, axis=1, prepend=-1) - 1
    return out


_PLAN_MAX_K = 256
"""The compiled planner serves k up to this (its work arrays grow with k); larger k plan in numpy."""


@dataclass
class _PlanJob:
    """One group's compiled ENTROPY planning (:func:`coding_jit_index.plan`): its inputs and the
    arrays it fills, tensor range by tensor range (internal)."""

    idx: np.ndarray
    cn: int
    start: np.ndarray
    tables: np.ndarray
    bmax: int
    orders: np.ndarray
    costs: np.ndarray
    choice: np.ndarray
    fallback: np.ndarray
    gaps: np.ndarray
    order: np.ndarray

    def run(self, t0: int, t1: int) -> None:
        """Plan tensors ``t0 <= t < t1`` (their rows only: pieces of one job are independent,
        and a piece planned twice writes the same values)."""
        from distronet.kernels.coding_jit_index import plan

        plan(
            self.idx,
            self.start[t0 : t1 + 1],
            self.tables,
            self.bmax,
            _SAMPLE_CHUNKS,
            self.orders,
            self.costs,
            self.choice[t0:t1],
            self.fallback[t0:t1],
            self.gaps,
            self.order,
        )

    def pieces(self, rows: int) -> list[tuple[int, int]]:
        """Consecutive tensor ranges of about ``rows`` chunks each (a tensor is never cut)."""
        out, t0, acc = [], 0, 0
        n_t = np.diff(self.start)
        for t in range(n_t.size):
            acc += int(n_t[t])
            if acc >= rows:
                out.append((t0, t + 1))
                t0, acc = t + 1, 0
        if t0 < n_t.size:
            out.append((t0, int(n_t.size)))
        return out

    def result(self) -> tuple[list[RankMap | None], np.ndarray, np.ndarray | None]:
        maps = _candidate_maps(self.cn)
        rank_map: list[RankMap | None] = [
            RankMap.FALLBACK if fb else maps[c]
            for fb, c in zip(self.fallback.tolist(), self.choice.tolist(), strict=True)
        ]
        return rank_map, self.gaps, self.order if self.choice.any() else None


def _plan_job(idx: np.ndarray, cn: int, start: np.ndarray) -> _PlanJob | None:
    """The compiled planning of ``_entropy``'s arguments, or None where it does not serve them
    (the compiled code not warm, or ``k`` above :data:`_PLAN_MAX_K`: the numpy path then)."""
    if not use_jit() or idx.shape[1] > _PLAN_MAX_K:
        return None
    t = start.size - 1
    bmax = fixed_width(cn)
    orders, costs = _tables(bmax)
    return _PlanJob(
        np.ascontiguousarray(idx),
        cn,
        start,
        _rank_stack(cn),
        bmax,
        orders,
        costs,
        np.empty(t, dtype=np.int64),
        np.empty(t, dtype=np.bool_),
        np.empty(idx.shape, dtype=np.int64),
        np.empty(idx.shape, dtype=np.int64),
    )


PLAN_PIECE_ROWS = 256
"""About this many chunks per piece of compiled ENTROPY planning handed to the helper threads
(``encode_groups``: every group's pieces in one ``fanout.map_in_order``)."""


def _entropy(
    idx: np.ndarray, cn: int, start: np.ndarray
) -> tuple[list[RankMap | None], np.ndarray, np.ndarray | None]:
    """Batched ``encode_indices`` (ENTROPY, k < cn): (rank map per tensor, gaps, wire order or
    None). Once the compiled kernels are warm, :func:`coding_jit_index.plan` (the same choices
    and arrays, one loop per tensor: ~2x faster on the Llama set); else :func:`_entropy_numpy`."""
    job = _plan_job(idx, cn, start)
    if job is None:
        return _entropy_numpy(idx, cn, start)
    job.run(0, start.size - 1)
    return job.result()


def _candidate_maps(cn: int) -> list[RankMap]:
    """The rank maps ENTROPY weighs for chunks of ``cn`` (the 2-D ones need a square chunk)."""
    return [RankMap.IDENTITY] + ([RankMap.TRANSPOSE, RankMap.DIAGONAL] if square_side(cn) is not None else [])


@functools.lru_cache(maxsize=16)
def _rank_stack(cn: int) -> np.ndarray:
    """Each candidate map's rank of every position, int64 ``(maps, cn)`` (do not modify)."""
    return np.ascontiguousarray(np.stack([rank_tables(cn, m)[0] for m in _candidate_maps(cn)]))


def _entropy_numpy(
    idx: np.ndarray, cn: int, start: np.ndarray
) -> tuple[list[RankMap | None], np.ndarray, np.ndarray | None]:
    """:func:`_entropy` by whole-array numpy passes (before the compiled code is warm)."""
    t, k = start.size - 1, idx.shape[1]
    n_t = np.diff(start)
    seg_rows = np.repeat(np.arange(t), n_t)
    bmax = fixed_width(cn)
    maps = _candidate_maps(cn)
    tables = _rank_stack(cn)
    if len(maps) > 1:
        strides = np.maximum(1, n_t // _SAMPLE_CHUNKS)
        counts = -(-n_t // strides)
        seg_s = np.repeat(np.arange(t), counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = start[:-1][seg_s] + within * strides[seg_s]
        sample = idx[rows]
        costs = np.stack(
            [_estimates(_gaps(_sorted_ranks(sample, tables[j])), seg_s, t, bmax) for j in range(len(maps))],
            axis=1,
        )
        choice = np.argmin(costs, axis=1)
    else:
        choice = np.zeros(t, dtype=np.int64)
    order = None
    if (choice == 0).all():
        ranks = idx  # identity ranks of sorted indices are sorted
    else:
        ranks = tables[np.repeat(choice, n_t)[:, None], idx]
        key = np.sort(ranks * k + np.arange(k), axis=1)
        ranks, order = key // k, key % k
    gaps = _gaps(ranks)
    fallback = _estimates(gaps, seg_rows, t, bmax) >= n_t * k * bmax
    if order is not None and fallback.any():
        order[np.repeat(fallback, n_t)] = np.arange(k)
    rank_map: list[RankMap | None] = [
        RankMap.FALLBACK if fb else maps[c] for fb, c in zip(fallback.tolist(), choice.tolist(), strict=True)
    ]
    return rank_map, gaps, order


def _take_rows(src: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``np.take_along_axis(src, order, axis=1)`` (compiled once warm)."""
    if not use_jit():
        return np.take_along_axis(src, order, axis=1)
    from distronet.kernels.coding_jit_index import take_rows

    out = np.empty(order.shape, dtype=src.dtype)
    take_rows(np.ascontiguousarray(src), np.ascontiguousarray(order), out)
    return out


def _put_rows(out: np.ndarray, order: np.ndarray, src: np.ndarray) -> None:
    """``np.put_along_axis(out, order, src, axis=1)`` (compiled once warm)."""
    if not use_jit():
        np.put_along_axis(out, order, src, axis=1)
        return
    from distronet.kernels.coding_jit_index import put_rows

    put_rows(out, np.ascontiguousarray(order), np.ascontiguousarray(src))
