"""map_in_order: results in order for any helper count; the caller never waits for a helper."""

from __future__ import annotations

import threading
import time

import pytest

from distronet.kernels.fanout import map_in_order


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_results_in_order_for_any_worker_count(workers: int) -> None:
    assert map_in_order(lambda i: i * i, 37, workers) == [i * i for i in range(37)]
    assert map_in_order(lambda i: i, 0, workers) == []


def test_caller_does_not_wait_for_a_stalled_helper() -> None:
    """A helper stuck inside an item (as one starved of CPU would be) does not hold the caller
    back: the caller computes that item itself and returns."""
    release = threading.Event()
    caller: list[int] = []
    stalled: list[int] = []

    def fn(i: int) -> int:
        if threading.get_ident() not in caller and not stalled:
            stalled.append(i)
            release.wait(10)  # stuck until the test lets it go
        elif threading.get_ident() in caller:
            time.sleep(0.005)  # slow enough that the helper claims an item
        return 10 * i

    t0 = time.perf_counter()
    got = None

    def run() -> None:
        nonlocal got
        caller.append(threading.get_ident())
        got = map_in_order(fn, 8, 2)

    th = threading.Thread(target=run)
    th.start()
    th.join(5)
    release.set()
    assert not th.is_alive(), "the caller waited for the stalled helper"
    assert got == [10 * i for i in range(8)]
    assert stalled, "the helper never took an item"
    assert time.perf_counter() - t0 < 5


def test_helper_exception_is_met_by_the_caller() -> None:
    caller = threading.get_ident()

    def fn(i: int) -> int:
        if i == 3:
            raise ValueError("bad item")
        if threading.get_ident() != caller:
            time.sleep(0.001)
        return i

    with pytest.raises(ValueError, match="bad item"):
        map_in_order(fn, 6, 2)
