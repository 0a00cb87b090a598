"""`distro-node doctor`'s verdict: a round's bytes and seconds, and when a machine keeps up."""

from __future__ import annotations

import json
import math

import pytest

from distronet.node.doctor.verdict import (
    Link,
    Machine,
    Report,
    StepTime,
    judge,
    metered_rate,
    render,
    round_traffic,
)
from distronet.node.swarm.budget import WireModel, parse_rate

MB = 1 << 20
NO_LINK = Link(None, None, None, 0, 0)


def step(
    median_s: float = 0.2, packet: int = 20_000, peak: int = 500 * MB, usable: int = 8000 * MB
) -> StepTime:
    return StepTime(
        "gpt",
        "local",
        875_264,
        8,
        64,
        0,
        2,
        (median_s,) * 3,
        3,
        median_s,
        packet,
        peak,
        "process RSS",
        usable,
    )


def test_a_round_moves_the_packet_to_and_from_every_peer_at_the_metered_budget() -> None:
    up, down = parse_rate("10mbit"), parse_rate("100mbit")
    t = round_traffic(20_000, 3, 5.0, up, down, NO_LINK)
    assert t.up_bytes == t.down_bytes == 60_000
    # the limiter's own arithmetic: 8 % reserve, 6 % overhead per payload byte
    assert t.up_rate == pytest.approx((1_250_000 - 100_000) / 1.06)
    assert t.up_rate == metered_rate(up, WireModel())
    assert t.up_limited_by == t.down_limited_by == "budget"
    assert t.transfer_s == pytest.approx(60_000 / t.up_rate)  # upload is the slower direction


def test_a_measured_link_below_the_budget_is_what_the_round_gets() -> None:
    link = Link("http://c", down_rate=50_000.0, up_rate=2e9, probe_bytes=MB, probes=3)
    t = round_traffic(10_000, 4, 5.0, math.inf, math.inf, link)
    assert (t.down_rate, t.down_limited_by) == (50_000.0, "link")
    assert (t.up_rate, t.up_limited_by) == (2e9, "link")  # an unlimited budget: only the link limits
    capped = round_traffic(10_000, 4, 5.0, parse_rate("10mbit"), math.inf, link)
    assert capped.up_limited_by == "budget" and capped.up_rate < 2e9
    assert t.transfer_s == pytest.approx(40_000 / 50_000)


def test_unlimited_budgets_and_no_link_cost_no_time() -> None:
    t = round_traffic(10_000, 3, 5.0, math.inf, math.inf, NO_LINK)
    assert t.transfer_s == 0.0 and judge(step(), t).keeps_up


def test_keeps_up_when_step_and_transfer_fit_the_deadline() -> None:
    t = round_traffic(20_000, 3, 5.0, parse_rate("10mbit"), parse_rate("100mbit"), NO_LINK)
    v = judge(step(0.21), t)
    assert v.keeps_up and v.line.startswith(
        "verdict: can keep up (step 0.21 s + transfer 0.06 s of a 5.0 s round)"
    )
    assert "headroom" not in v.line
    tight = judge(step(4.5), t)  # 4.55 s of 5: keeps up, but says so
    assert tight.keeps_up and "headroom: little" in tight.line


def test_a_slow_step_cannot_keep_up_and_the_remedy_is_a_faster_device() -> None:
    t = round_traffic(20_000, 3, 1.0, math.inf, math.inf, NO_LINK)
    v = judge(step(1.4), t)
    assert not v.keeps_up and v.line.startswith("verdict: cannot keep up (step 1.40 s")
    assert "a step takes 1.40 s" in v.reasons[0] and "--device cuda" in v.remedies[0]
    assert "remedy:" in v.line


def test_a_slow_upload_blames_the_budget_when_the_link_is_faster() -> None:
    link = Link("http://c", down_rate=1e9, up_rate=1e9, probe_bytes=MB, probes=3)
    t = round_traffic(400_000, 15, 5.0, parse_rate("10mbit"), parse_rate("100mbit"), link)
    v = judge(step(0.2), t)
    assert not v.keeps_up and "upload" in v.reasons[0] and "(budget)" in v.reasons[0]
    assert v.remedies == ("raise --up (the budget is below the link)",)
    slow_link = Link("http://c", down_rate=1e9, up_rate=200_000.0, probe_bytes=MB, probes=3)
    v2 = judge(step(0.2), round_traffic(400_000, 15, 5.0, math.inf, math.inf, slow_link))
    assert "(link)" in v2.reasons[0] and "faster connection" in v2.remedies[0]


def test_a_step_that_does_not_fit_memory_cannot_keep_up_however_fast() -> None:
    t = round_traffic(20_000, 3, 5.0, math.inf, math.inf, NO_LINK)
    v = judge(step(0.01, peak=9 * 1024 * MB, usable=8 * 1024 * MB), t)
    assert not v.keeps_up and "peak memory 9.0 GiB is over the 8.0 GiB usable" in v.reasons[0]
    assert "--micro-batch" in v.remedies[0]


def test_the_report_renders_and_serialises_without_infinities() -> None:
    t = round_traffic(20_000, 3, 5.0, math.inf, parse_rate("100mbit"), NO_LINK)
    s = step()
    m = Machine("AMD EPYC", 2, 2, None, "not installed", "torch cpu fp32", 16 << 30, 12 << 30)
    rep = Report(None, m, s, NO_LINK, t, judge(s, t))
    doc = json.loads(json.dumps(rep.as_json(), allow_nan=False))
    assert doc["round"]["up_budget"] is None and doc["step"]["fits"] is True
    assert doc["verdict"]["keeps_up"] is True and doc["step"]["estimate_bytes"] is None
    text = render(rep)
    assert "AMD EPYC, 2 cores" in text and text.splitlines()[-1] == rep.verdict.line
