"""batch_share: the global batch split over live peers, and the dead peers' windows dealt out."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.node.data.batch_share import (
    BatchShareError,
    SharedFeed,
    draw_windows,
    loss_weight,
    node_batch,
    share_of,
    takeover,
)
from distronet.node.data.order import BatchOrder
from distronet.protocol.errors import ConfigError


@settings(max_examples=60)
@given(st.integers(0, 500), st.integers(1, 40), st.integers(0, 10_000))
def test_node_batch_sums_to_global_and_differs_by_at_most_one(g: int, n: int, step: int) -> None:
    sizes = [node_batch(g, n, r, step) for r in range(n)]
    assert sum(sizes) == g
    assert max(sizes) - min(sizes) <= 1


def test_node_batch_extra_window_rotates_over_steps() -> None:
    # 16 windows over 3 peers: 6, 5, 5 in turn; over 3 steps each peer trains on 16
    per_step = [[node_batch(16, 3, r, t) for r in range(3)] for t in range(3)]
    assert per_step == [[6, 5, 5], [5, 6, 5], [5, 5, 6]]
    assert [sum(col) for col in zip(*per_step, strict=True)] == [16, 16, 16]


@settings(max_examples=60)
@given(
    st.integers(1, 9),
    st.sets(st.integers(0, 11), min_size=1, max_size=12),
    st.integers(0, 1000),
    st.data(),
)
def test_takeover_deals_every_orphan_once_and_matches_node_batch(
    batch: int, peers: set[int], step: int, data: st.DataObject
) -> None:
    order = sorted(peers)
    dead = data.draw(st.lists(st.sampled_from(order), unique=True, max_size=len(order) - 1))
    live = [p for p in order if p not in dead]
    dealt = takeover(batch, live, dead, step)
    assert set(dealt) == set(live)
    got = Counter(w for ws in dealt.values() for w in ws)
    assert got == Counter((d, w) for d in dead for w in range(batch))  # each orphan exactly once
    for r, p in enumerate(live):
        assert batch + len(dealt[p]) == node_batch(batch * len(order), len(live), r, step)


def test_takeover_example_one_of_four_dead() -> None:
    # 200 % 3 == 2: the first orphan goes to live[2] (peer 3), then peer 0, peer 2, peer 3
    assert takeover(4, [0, 2, 3], [1], 200) == {
        0: [(1, 1)],
        2: [(1, 2)],
        3: [(1, 0), (1, 3)],
    }
    assert takeover(4, [0, 1, 2, 3], [], 7) == {0: [], 1: [], 2: [], 3: []}


def test_loss_weight_makes_shares_average_to_the_global_batch() -> None:
    assert loss_weight(4, 16, 4) == 1.0
    sizes = [node_batch(16, 3, r, 5) for r in range(3)]
    # sum over peers of weight * (mean over own windows) / n_live == mean over all 16 windows
    assert sum(loss_weight(n, 16, 3) * 1.0 for n in sizes) / 3 == pytest.approx(1.0)
    assert loss_weight(6, 16, 3) == pytest.approx(1.125)


def test_share_of_follows_the_accepted_set() -> None:
    ids = [bytes([i]) * 32 for i in (9, 3, 7, 5)]
    full = [share_of(16, ids, me, 11) for me in ids]
    assert full == [4, 4, 4, 4]
    three = [i for i in ids if i != ids[2]]
    shares = [share_of(16, three, me, 11) for me in three]
    assert sum(shares) == 16 and sorted(shares) == [5, 5, 6]
    assert share_of(16, three, ids[2], 11) == 4  # a node missing from the round counts itself in
    assert share_of(16, [], ids[0], 0) == 16  # before the first round: alone


def test_draw_windows_extends_the_peers_own_order() -> None:
    tokens = (np.arange(50_000) % 251).astype(np.uint8)
    order = BatchOrder(tokens, "shard-a", 3, 7, 4, 32)
    x, y = draw_windows(order, 12, 6)
    assert x.shape == y.shape == (6, 32)
    np.testing.assert_array_equal(x[:4], order.xy(12)[0])  # the first B windows: the usual batch
    np.testing.assert_array_equal(draw_windows(order, 12, 6)[1], y)  # reproducible


def test_shared_feed_asks_for_the_share_of_the_live_set() -> None:
    tokens = (np.arange(50_000) % 251).astype(np.uint8)
    order = BatchOrder(tokens, "shard-a", 0, 1, 4, 16)
    me, others = b"\x02" * 32, [b"\x01" * 32, b"\x03" * 32, b"\x04" * 32]
    live = [me, *others]
    feed = SharedFeed(lambda step, n: draw_windows(order, step, n), 16, lambda: (live, me))
    np.testing.assert_array_equal(feed(5)[0], order.xy(5)[0])  # everyone live: the usual batch
    live = [me, *others[:2]]  # one peer gone from the round
    assert sum(share_of(16, live, p, 6) for p in live) == 16
    assert feed(6)[0].shape[0] == feed.last_windows == share_of(16, live, me, 6)
    with pytest.raises(BatchShareError):
        SharedFeed(lambda step, n: order.xy(step), 0, lambda: (live, me))


@pytest.mark.parametrize(
    "call",
    [
        lambda: node_batch(16, 0, 0, 0),
        lambda: node_batch(16, 3, 3, 0),
        lambda: node_batch(-1, 3, 0, 0),
        lambda: node_batch(16, 3, 0, -1),
        lambda: takeover(4, [], [1], 0),
        lambda: takeover(0, [0], [1], 0),
        lambda: takeover(4, [0, 1], [1], 0),
        lambda: takeover(4, [0, 0], [1], 0),
        lambda: loss_weight(0, 16, 3),
        lambda: share_of(0, [b"a"], b"a", 0),
    ],
)
def test_bad_input_is_a_typed_error(call: object) -> None:
    with pytest.raises(BatchShareError):
        call()  # type: ignore[operator]
    assert issubclass(BatchShareError, ConfigError)
