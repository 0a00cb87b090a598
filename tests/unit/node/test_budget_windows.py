"""Property: whatever the request pattern, a bucket grants at most burst + rate*T in any window T."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from distronet.node.swarm.budget import TokenBucket


class FakeClock:
    """Virtual time; before time moves it notes (time, bytes granted so far) of the bucket."""

    def __init__(self) -> None:
        self.now = 0.0
        self.bucket: TokenBucket | None = None
        self.marks: list[tuple[float, int]] = [(0.0, 0)]

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        assert self.bucket is not None
        self.marks.append((self.now, self.bucket.total_bytes))
        self.now += dt

    async def sleep(self, dt: float) -> None:
        self.advance(dt)
        await asyncio.sleep(0)


@settings(max_examples=50, deadline=None)
@given(
    rate=st.floats(1e3, 1e8),
    burst_s=st.floats(0.01, 1.0),
    requests=st.lists(st.tuples(st.floats(0.0, 12.0), st.floats(0.0, 2.0)), min_size=1, max_size=30),
)
def test_no_window_exceeds_burst_plus_rate(
    rate: float, burst_s: float, requests: list[tuple[float, float]]
) -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate, burst=max(1.0, rate * burst_s), clock=clock, sleep=clock.sleep)
    clock.bucket = bucket

    async def run() -> None:
        for bursts, idle in requests:  # request sizes in units of the burst (slicing is per burst)
            clock.advance(idle)  # the caller does something else for a while
            await bucket.acquire(int(bursts * bucket.burst))
        clock.advance(0.0)

    asyncio.run(run())
    assert bucket.total_bytes == sum(int(b * bucket.burst) for b, _ in requests)
    # marks[i] = (t_i, bytes granted by the end of t_i): bytes granted in (t_i, t_j] are bounded
    marks = clock.marks
    for i, (t0, g0) in enumerate(marks):
        for j in range(i + 1, len(marks)):
            t1, g1 = marks[j]
            assert g1 - g0 <= bucket.burst + rate * (t1 - t0) + (j - i)  # 1-byte float slack per step
