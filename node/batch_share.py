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

Cost: O(dead peers × batch) small ints per step.
"""

from __future__ import annotations

from collections.abc import Sequence

from distronet.protocol.errors import ConfigError

__all__ = ["BatchShareError", "loss_weight", "node_batch", "takeover"]


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
