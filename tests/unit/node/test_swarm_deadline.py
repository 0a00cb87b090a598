"""``with_deadline``: a call's deadline is kept even when the call swallows its cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from distronet.node.swarm import p2p
from distronet.node.swarm.errors import DaemonError
from distronet.node.swarm.p2p import with_deadline


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(p2p, "CANCEL_GRACE_S", 0.05)


async def _value(x: int, after: float) -> int:
    await asyncio.sleep(after)
    return x


async def _stubborn(release: asyncio.Event) -> int:
    """A call that swallows cancellation (as some hivemind DHT calls do) until ``release``."""
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue
    return 0


@pytest.mark.asyncio
async def test_in_time_gives_the_result_and_late_raises_a_named_error() -> None:
    assert await with_deadline(_value(7, 0.0), 1.0, "quick") == 7
    with pytest.raises(DaemonError, match=r"slow: no answer within 0\.1 s"):
        await with_deadline(_value(7, 5.0), 0.1, "slow")


@pytest.mark.asyncio
async def test_a_call_that_swallows_its_cancellation_is_left_behind() -> None:
    """``asyncio.wait_for`` waits for the cancelled call to end, here forever; the deadline here
    costs its timeout plus the short grace, and the call is abandoned."""
    release = asyncio.Event()
    t0 = time.monotonic()
    with pytest.raises(DaemonError):
        await with_deadline(_stubborn(release), 0.1, "stubborn")
    assert time.monotonic() - t0 < 2.0
    stuck = asyncio.create_task(asyncio.wait_for(_stubborn(release), 0.1))  # what wait_for does
    done, _ = await asyncio.wait({stuck}, timeout=1.0)
    assert not done  # still waiting for the call to take its cancellation
    release.set()
    assert await stuck == 0  # only once the call chose to end
    await asyncio.sleep(0)  # the abandoned call ends too


@pytest.mark.asyncio
async def test_a_call_that_ends_while_cancelled_still_gives_its_result() -> None:
    """A connection made at the deadline must reach the caller (who closes it), not be dropped."""

    async def late_but_done() -> str:
        try:
            await asyncio.sleep(5.0)
        except asyncio.CancelledError:
            return "connection"
        return "never"

    assert await with_deadline(late_but_done(), 0.05, "late") == "connection"


@pytest.mark.asyncio
async def test_cancelling_the_caller_cancels_promptly() -> None:
    release = asyncio.Event()
    waiter = asyncio.create_task(with_deadline(_stubborn(release), 30.0, "stubborn"))
    await asyncio.sleep(0.05)
    waiter.cancel()
    t0 = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert time.monotonic() - t0 < 1.0
    release.set()
    await asyncio.sleep(0)
