"""The wire model of the budgets: header overhead, acknowledgements, the control-traffic reserve."""

from __future__ import annotations

import asyncio
import math

import pytest

from distronet.node.swarm.budget import EXACT, Bandwidth, TokenBucket, WireModel
from distronet.protocol.errors import ConfigError


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, dt: float) -> None:
        self.now += dt
        await asyncio.sleep(0)


async def test_metered_wire_bytes_stay_under_rate_minus_reserve() -> None:
    clock = FakeClock()
    bucket = TokenBucket(
        100_000.0, burst=10_000.0, overhead=0.05, reserve=8_000.0, clock=clock, sleep=clock.sleep
    )
    for _ in range(100):
        await bucket.acquire(9_000)  # 900 KB of payload = 945 KB on the wire
    assert bucket.total_bytes == 100 * math.ceil(9_000 * 1.05)
    # wire bytes granted after the first burst go at rate - reserve = 92 KB/s
    assert clock.now == pytest.approx((bucket.total_bytes - 10_000) / 92_000.0, rel=1e-3)


def test_affordable_is_in_payload_bytes() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1_000.0, burst=100.0, overhead=0.25, reserve=200.0, clock=clock, sleep=clock.sleep)
    assert bucket.affordable(1.0) == math.floor((100 + 800) / 1.25)
    assert bucket.metered_rate == 800.0 and bucket.rate == 1_000.0


async def test_acknowledgements_are_debited_from_the_other_direction() -> None:
    clock = FakeClock()
    bw = Bandwidth.from_rates(
        "80kbit",
        "800kbit",
        wire=WireModel(overhead=0.0, ack=0.1, reserve=0.0, reserve_floor=0.0),
        clock=clock,
        sleep=clock.sleep,
    )
    await bw.receive(50_000)  # 50 KB down -> 5 KB of acknowledgements up
    assert bw.down.total_bytes == 50_000 and bw.up.total_bytes == 5_000
    await bw.send(10_000)
    assert bw.up.total_bytes == 15_000 and bw.down.total_bytes == 51_000
    bw.sent(100)
    bw.received(100)
    assert (bw.up.total_bytes, bw.down.total_bytes) == (15_110, 51_110)


def test_default_wire_model_reserves_a_share_with_a_floor() -> None:
    w = WireModel()
    assert w.reserve_for(1.25e6) == pytest.approx(0.08 * 1.25e6)
    assert w.reserve_for(10_000.0) == 5_000.0  # never more than half
    assert w.reserve_for(50_000.0) == w.reserve_floor
    assert w.reserve_for(math.inf) == 0.0
    bw = Bandwidth.from_rates("10mbit", "unlimited")
    assert bw.up.rate == 1.25e6 and bw.up.metered_rate == pytest.approx(0.92 * 1.25e6)
    assert bw.down.unlimited
    exact = Bandwidth.from_rates("10mbit", "10mbit", wire=EXACT)
    assert exact.up.metered_rate == exact.up.rate and exact.ack == 0.0


def test_bad_wire_models_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        WireModel(overhead=-0.1)
    with pytest.raises(ConfigError):
        WireModel(reserve=0.9)
    with pytest.raises(ConfigError):
        TokenBucket(1000.0, reserve=1000.0)
