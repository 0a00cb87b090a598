"""Built-in corpus (module list, disjoint split) and the reproducible data order."""

from __future__ import annotations

import numpy as np
import pytest

from distronet.node.data import (
    CORPUS_MODULES,
    BatchOrder,
    CorpusError,
    load_builtin_corpus,
    validation_windows,
)
from distronet.node.data.corpus import module_source


@pytest.fixture(scope="module")
def corpus():  # type: ignore[no-untyped-def]
    return load_builtin_corpus()


def test_every_listed_module_has_source() -> None:
    assert 40 <= len(CORPUS_MODULES) <= 100
    assert len(set(CORPUS_MODULES)) == len(CORPUS_MODULES)
    for name in CORPUS_MODULES:
        assert "def " in module_source(name) or "class " in module_source(name), name


def test_missing_module_is_an_error_naming_it() -> None:
    with pytest.raises(CorpusError, match="no_such_module_xyz"):
        load_builtin_corpus(("json", "no_such_module_xyz"))


def test_split_is_disjoint_and_covers_every_module(corpus) -> None:  # type: ignore[no-untyped-def]
    assert corpus.train.dtype == np.uint8 and corpus.val.dtype == np.uint8
    assert corpus.train.size > 1_000_000 and 0.05 < corpus.val.size / corpus.train.size < 0.2
    train, val = corpus.train.tobytes(), corpus.val.tobytes()
    for name in CORPUS_MODULES[:10]:
        src = module_source(name).encode()
        head = src[: len(src) // 2]
        tail = src[-200:]
        assert head[:300] in train and head[:300] not in val
        assert tail in val and tail not in train


def test_corpus_is_reproducible(corpus) -> None:  # type: ignore[no-untyped-def]
    again = load_builtin_corpus()
    assert again.digest == corpus.digest
    assert np.array_equal(again.train, corpus.train)


def _order(tokens: np.ndarray, seed: int = 0, shard: str = "s0", peer: int = 0) -> BatchOrder:
    return BatchOrder(tokens=tokens, shard_id=shard, seed=seed, peer=peer, batch=4, seq_len=16)


def test_order_is_a_pure_function_of_seed_shard_peer_step(corpus) -> None:  # type: ignore[no-untyped-def]
    a, b = _order(corpus.train), _order(corpus.train.copy())
    for step in (0, 1, 599):
        assert np.array_equal(a.windows(step), b.windows(step))
    # known values pin the stream across machines and numpy versions
    assert _order(np.zeros(10_000, np.uint8)).starts(0).tolist() == KNOWN_STARTS


KNOWN_STARTS = [5645, 8515, 6602, 2020]  # PCG64 raw stream of SeedSequence([0, key("s0"), 0, 0])


def test_different_peers_steps_seeds_shards_differ(corpus) -> None:  # type: ignore[no-untyped-def]
    base = _order(corpus.train).starts(3)
    for other in (
        _order(corpus.train, peer=1).starts(3),
        _order(corpus.train).starts(4),
        _order(corpus.train, seed=1).starts(3),
        _order(corpus.train, shard="s1").starts(3),
    ):
        assert not np.array_equal(base, other)


def test_windows_and_targets_are_shifted_by_one(corpus) -> None:  # type: ignore[no-untyped-def]
    order = _order(corpus.train)
    x, y = order.xy(5)
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])
    start = int(order.starts(5)[0])
    assert np.array_equal(x[0], corpus.train[start : start + 16])


def test_validation_windows_fixed_and_in_range(corpus) -> None:  # type: ignore[no-untyped-def]
    w = validation_windows(corpus.val, 32, 16)
    assert w.shape == (32, 17)
    assert np.array_equal(w, validation_windows(corpus.val, 32, 16))
    assert np.array_equal(w[-1], corpus.val[-17:])
