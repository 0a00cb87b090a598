"""``pull.nobody_holds``: when a failed pull proves that no live peer holds a frame (its producer
and the leader that listed it are gone, every other source said "not here"), and when it does not.
"""

from __future__ import annotations

import pytest

from distronet.node.swarm.errors import PullError, PullNotFound, PullPruned, PullTimeout, PullUnreachable
from distronet.node.swarm.pull import ContentStore, all_unreachable, nobody_holds

GONE = PullUnreachable("cannot open a pull stream")
NOT_HERE = PullNotFound("does not have it")


def _err(kind: type[PullError] = PullError, **causes: BaseException) -> PullError:
    return kind("pull failed", causes)


def test_gone_origins_and_peers_without_it_prove_nobody_holds_it() -> None:
    assert nobody_holds(_err(producer=GONE, leader=GONE, b=NOT_HERE, c=NOT_HERE), ["producer", "leader"])
    assert nobody_holds(_err(producer=GONE, b=NOT_HERE, c=GONE), ["producer"])  # we led: our view


@pytest.mark.parametrize(
    "causes",
    [
        {"producer": NOT_HERE, "leader": GONE, "b": NOT_HERE},  # the producer is alive: it may resend
        {"producer": GONE, "leader": PullError("stream broke"), "b": NOT_HERE},  # the leader may have it
        {"producer": GONE, "leader": GONE},  # nobody answered at all: we may be the one cut off
        {"producer": GONE, "leader": GONE, "b": GONE},
        {"producer": GONE, "leader": GONE, "b": NOT_HERE, "c": PullTimeout("slow")},  # c may hold it
        {"producer": GONE, "b": NOT_HERE},  # the leader was not asked
        {"producer": GONE, "leader": GONE, "b": NOT_HERE, "c": PullPruned("pruned")},  # c applied it
        {"producer": GONE, "leader": GONE, "c": PullPruned("pruned")},
    ],
)
def test_anything_short_of_proof_keeps_the_round_failing(causes: dict[str, BaseException]) -> None:
    assert not nobody_holds(_err(**causes), ["producer", "leader"])


def test_a_timed_out_pull_proves_nothing() -> None:
    assert not nobody_holds(_err(PullTimeout, producer=GONE, leader=GONE, b=NOT_HERE), ["producer", "leader"])
    assert not nobody_holds(_err(), [])


def test_the_store_remembers_what_it_evicted_a_bounded_while() -> None:
    store = ContentStore(max_total_bytes=3_000, max_gone=2)
    a, b = store.put(b"a" * 1_000, 1), store.put(b"b" * 1_000, 2)
    assert not store.pruned(a) and store.evict_before(2) == 1 and store.pruned(a) and a not in store
    c = store.put(b"c" * 1_000, 3)
    store.put(b"d" * 2_500, 4)  # over the cap: step 2 goes, then step 3
    assert store.pruned(b) and store.pruned(c) and not store.pruned(a)  # only the last 2 are kept
    store.put(b"b" * 1_000, 5)  # held again: no longer "pruned"
    assert not store.pruned(b) and b in store


def test_all_unreachable_only_when_no_source_could_be_reached() -> None:
    assert all_unreachable(_err(producer=GONE, leader=GONE))
    assert not all_unreachable(_err(producer=GONE, b=NOT_HERE))  # b answered
    assert not all_unreachable(_err(producer=GONE, b=PullError("stream broke")))
    assert not all_unreachable(_err(PullTimeout, producer=GONE))
    assert not all_unreachable(_err())
