"""Token-bucket limiter: rate parsing, long-run rate bound, burst bound, affordability, timeouts."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from distronet.node.swarm.budget import EXACT, Bandwidth, BudgetExceeded, TokenBucket, format_rate, parse_rate
from distronet.protocol.errors import ConfigError


class FakeClock:
    """Virtual time: sleeping advances the clock instantly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, dt: float) -> None:
        assert dt >= 0
        self.now += dt
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10mbit", 1.25e6),
        ("100Mbit/s", 12.5e6),
        ("10mbps", 1.25e6),
        ("500kbit", 62500.0),
        ("1gbit", 1.25e8),
        ("2MB/s", 2e6),
        ("2MBps", 2e6),
        ("512KiB/s", 512 * 1024.0),
        ("1.5MiB", 1.5 * 1024**2),
        ("100B/s", 100.0),
        ("4096", 4096.0),
        (" 8 bit ", 1.0),
    ],
)
def test_parse_rate_accepts_common_forms(text: str, expected: float) -> None:
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["", "fast", "10 parsecs", "-5mbit", "0mbit", "10xbit", "1e999MB", "10 mb it"]
)
def test_parse_rate_rejects_junk_with_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rate(text)


def test_parse_rate_unlimited_and_format() -> None:
    assert math.isinf(parse_rate("unlimited"))
    assert format_rate(parse_rate("10mbit")) == "10.0 Mbit/s"
    assert format_rate(math.inf) == "unlimited"


async def test_long_run_rate_and_burst_bound_hold_over_every_window() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1e6, burst=1e5, clock=clock, sleep=clock.sleep)
    grants: list[tuple[float, int]] = []
    start = clock.now
    for _ in range(100):  # 100 x 100 KB = 10 MB at 1 MB/s
        await bucket.acquire(100_000)
        grants.append((clock.now, 100_000))
    elapsed = clock.now - start
    assert bucket.total_bytes == 10_000_000
    assert elapsed == pytest.approx(9.9, rel=1e-6)  # first burst is free, the rest at rate
    for i, (t0, _) in enumerate(grants):  # any window [t0, t0+T]: at most burst + rate*T
        for t1, _ in grants[i:]:
            in_window = sum(n for t, n in grants if t0 <= t <= t1)
            assert in_window <= 1e5 + 1e6 * (t1 - t0) + 1e-3


async def test_request_larger_than_burst_is_sliced_not_overshot() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, burst=100.0, clock=clock, sleep=clock.sleep)
    await bucket.acquire(1100)
    assert clock.now - 1000.0 == pytest.approx(1.0)
    assert bucket.total_bytes == 1100


async def test_concurrent_acquirers_share_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, burst=100.0, clock=clock, sleep=clock.sleep)
    await asyncio.gather(*(bucket.acquire(500) for _ in range(4)))
    assert clock.now - 1000.0 == pytest.approx(1.9)
    assert bucket.total_bytes == 2000


async def test_affordability_accounts_for_banked_and_queued_bytes() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, burst=200.0, clock=clock, sleep=clock.sleep)
    assert bucket.affordable(1.0) == 1200
    assert bucket.can_afford(1200, 1.0)
    assert not bucket.can_afford(1201, 1.0)
    await bucket.acquire(200)
    assert bucket.affordable(0.5) == 500
    clock.now += 10.0  # idle time banks at most `burst`
    assert bucket.affordable(0.0) == 200


async def test_timeout_raises_up_front_without_consuming() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, burst=100.0, clock=clock, sleep=clock.sleep)
    with pytest.raises(BudgetExceeded) as info:
        await bucket.acquire(5000, timeout=1.0)
    assert info.value.affordable == 1100
    assert bucket.total_bytes == 0
    assert clock.now == 1000.0
    await bucket.acquire(1100, timeout=1.0)
    assert bucket.total_bytes == 1100


async def test_record_debits_unmetered_bytes() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, burst=100.0, clock=clock, sleep=clock.sleep)
    bucket.record(300)  # a header that went out without waiting: the next grant pays for it
    await bucket.acquire(100)
    assert clock.now - 1000.0 == pytest.approx(0.3)
    assert bucket.total_bytes == 400


async def test_unlimited_counts_but_never_waits() -> None:
    bw = Bandwidth.unlimited()
    await bw.up.acquire(10**12)
    assert bw.up.total_bytes == 10**12
    assert bw.up.can_afford(10**15, 0.0)


def test_bad_construction_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        TokenBucket(0.0)
    with pytest.raises(ConfigError):
        Bandwidth.from_rates("10mbit", "lots")


async def test_real_time_rate_with_deadline() -> None:
    bw = Bandwidth.from_rates("8mbit", "unlimited", wire=EXACT)  # 1 MB/s, burst 100 KB
    start = time.monotonic()
    await asyncio.wait_for(bw.up.acquire(300_000), timeout=2.0)
    elapsed = time.monotonic() - start
    assert 0.18 <= elapsed < 1.5
    assert bw.up.total_bytes == 300_000
