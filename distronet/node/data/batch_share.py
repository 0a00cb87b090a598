"""Keeping a run's global batch when peers die: who trains on how many windows, and which ones.

A run trains on a *global batch* of ``G`` windows per step, split over its live peers. When a
peer dies, its share does not vanish: the survivors absorb it, so the step still averages ``G``
windows and no window of the dead peer's data stream is lost or trained twice. All functions
here are pure (no I/O, no torch) and deterministic: every replica, and the coordinator, computes
the same split from the same inputs.

* :func:`node_batch` — windows per step for the live peer of ``rank`` (0-based, in the run's
  agreed order, e.g. ascending peer id) among ``n_live``: ``G // n_live``, and one more for
  ``G % n_live`` of them; which ranks get the extra one rotates with the step, so over
  ``n_live`` steps every live peer trains on the same number of windows.
* :func:`takeover` — the in-process swarm's version of "the coordinator reissues a dead node's
  shards": each dead peer's windows of this step (its own reproducible stream, keyed by
  ``(seed, shard, peer, step)``) are dealt round-robin to the survivors, starting at rank
  ``step mod n_live``. Each survivor then trains on its own ``B`` windows plus what it was dealt:
  exactly :func:`node_batch` windows when every peer's batch is ``B``.
* :func:`loss_weight` — the factor on a peer's mean loss over ``n`` windows that makes the
  peers' gradients sum (up to the exchange's ``1 / n_live``) to the gradient of the mean loss
  over the whole global batch: ``n · n_live / G`` (1 when the shares are equal).
* The daemon's side: :func:`share_of` (this node's windows from the round's accepted peer set,
  identical on every replica), :func:`draw_windows` (``n`` windows of a peer's own reproducible
  order; its first ``B`` are the ``B`` it draws anyway) and :class:`SharedFeed`, a batch source
  ``feed(step) -> (x, y)`` that asks for :func:`share_of` windows each step. There the dead
  node's data is not dealt out window by window: the coordinator reissues its shard when its
  lease runs out, and the survivors read more windows of their own shards meanwhile.

Cost: O(dead peers × batch) small ints per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from distronet.node.data.order import BatchOrder
from distronet.protocol.errors import ConfigError

__all__ = [
    "BatchShareError",
    "SharedFeed",
    "draw_windows",
    "loss_weight",
    "node_batch",
    "share_of",
    "takeover",
]

Draw = Callable[[int, int], tuple[np.ndarray, np.ndarray]]
"""``draw(step, n) -> (x, y)``: ``n`` windows ``(n, seq_len)`` int64 of this node's order at ``step``."""
LiveView = Callable[[], tuple[Sequence[bytes], bytes]]
"""``live() -> (peer ids of the last applied round's accepted set, own peer id)``."""


class BatchShareError(ConfigError):
    """A batch split that cannot be made (no live peer, a negative size, an unknown rank)."""


def node_batch(global_batch: int, n_live: int, rank: int, step: int) -> int:
    """Windows the live peer of ``rank`` trains on at ``step`` when ``n_live`` peers share
    ``global_batch`` windows. Sums to ``global_batch`` over ranks ``0 .. n_live - 1``.

    Raises ``BatchShareError`` for ``n_live < 1``, ``global_batch < 0``, ``step < 0`` or a rank
    outside ``0 .. n_live - 1``.
    """
    if n_live < 1 or global_batch < 0 or step < 0:
        raise BatchShareError(
            f"need n_live >= 1, global_batch >= 0, step >= 0; got {n_live}, {global_batch}, {step}"
        )
    if not 0 <= rank < n_live:
        raise BatchShareError(f"rank {rank} outside 0..{n_live - 1}")
    base, extra = divmod(global_batch, n_live)
    return base + (1 if (rank - step) % n_live < extra else 0)


def takeover(
    batch: int, live: Sequence[int], dead: Sequence[int], step: int
) -> dict[int, list[tuple[int, int]]]:
    """Deal the dead peers' windows of ``step`` to the live peers.

    ``live`` and ``dead`` are peer indices (disjoint; the order of ``live`` is the rank order);
    every peer draws ``batch`` windows per step. Returns ``{live peer: [(dead peer, window
    index), ...]}`` with every live peer present (possibly with an empty list): the orphaned
    windows, listed dead peer by dead peer (ascending) and window by window, go to
    ``live[(k + step) % len(live)]`` for the ``k``-th one. Every orphan is dealt exactly once, and
    ``batch + len(result[live[r]]) == node_batch(batch * (len(live) + len(dead)), len(live), r,
    step)``.

    Raises ``BatchShareError`` when ``live`` is empty, the sets overlap or repeat, or ``batch < 1``.
    """
    if not live:
        raise BatchShareError("no live peer to take over the dead peers' windows")
    if batch < 1 or step < 0:
        raise BatchShareError(f"need batch >= 1 and step >= 0, got {batch}, {step}")
    if len(set(live)) != len(live) or len(set(dead)) != len(dead) or set(live) & set(dead):
        raise BatchShareError(f"live {list(live)} and dead {list(dead)} must be disjoint, without repeats")
    out: dict[int, list[tuple[int, int]]] = {p: [] for p in live}
    orphans = [(d, w) for d in sorted(dead) for w in range(batch)]
    for k, orphan in enumerate(orphans):
        out[live[(k + step) % len(live)]].append(orphan)
    return out


def loss_weight(windows: int, global_batch: int, n_live: int) -> float:
    """``windows · n_live / global_batch``: scales a peer's mean loss over ``windows`` so the
    live peers' gradients average to the mean-loss gradient of the global batch.

    Raises ``BatchShareError`` for a non-positive size.
    """
    if windows < 1 or global_batch < 1 or n_live < 1:
        raise BatchShareError(
            f"need positive sizes, got windows={windows}, global={global_batch}, live={n_live}"
        )
    return windows * n_live / global_batch


def share_of(global_batch: int, live: Sequence[bytes], me: bytes, step: int) -> int:
    """Windows node ``me`` trains on at ``step`` when the peers ``live`` (the last round's
    accepted set: the same on every replica) share ``global_batch``; ranks are ascending peer
    ids. ``me`` counts as live even if its own last packet missed the round (or before the
    first round). Raises ``BatchShareError`` for ``global_batch < 1`` or ``step < 0``.
    """
    if global_batch < 1:
        raise BatchShareError(f"global_batch must be >= 1, got {global_batch}")
    ranked = sorted(set(live) | {me})
    return max(1, node_batch(global_batch, len(ranked), ranked.index(me), step))


def draw_windows(order: BatchOrder, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows of ``order`` at ``step`` as ``(x, y)`` ``(n, seq_len)`` int64: the same
    ``(seed, shard, peer, step)`` stream, read further (PCG64 raw output is sequential), so the
    first ``order.batch`` windows are exactly ``order.xy(step)``. Raises ``ConfigError`` for
    ``n < 1``."""
    return dataclasses.replace(order, batch=n).xy(step)


class SharedFeed:
    """A batch source for ``Trainer``: each step, this node's share of ``global_batch``.

    ``draw(step, n)`` gives ``n`` windows of the node's data (e.g. ``draw_windows`` over its
    shard's order); ``live()`` names the live peers and this node (see ``LiveView``). With every
    peer live and ``global_batch = peers × B`` each step is ``B`` windows, as without the feed.
    Not thread-safe (one trainer calls it).
    """

    def __init__(self, draw: Draw, global_batch: int, live: LiveView) -> None:
        if global_batch < 1:
            raise BatchShareError(f"global_batch must be >= 1, got {global_batch}")
        self.draw, self.global_batch, self.live = draw, global_batch, live
        self.last_windows = 0  # windows of the last batch handed out

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        ids, me = self.live()
        self.last_windows = share_of(self.global_batch, ids, me, step)
        return self.draw(step, self.last_windows)
