"""Chaos 4: nodes in their own network namespaces on tc-shaped links stay within their budgets.

Set-up (``distronet.node.bench.netns``): 4 namespaces, each joined to a bridge in the root
namespace by a veth pair shaped with tbf to 10 mbit up / 50 mbit down (plus netem delay where
the kernel has netem); node ↔ node traffic crosses the bridge, so every byte a node moves
crosses its own veth. A real coordinator listens on the bridge; 4 real ``distro-node join``
processes (a 44k-parameter GPT, ~16 KB packets: a step's payload fits) run one per namespace with
``--up 1mbit --down 5mbit`` — well under the link rate, so tc does not enforce the budget for
them. The payload (3 pulls of a ~16 KB packet per step, plus the state download every node
makes at the start) keeps the busiest upload window at 40 % of the budget or more, so the
figure includes real payload, its TCP/noise/yamux overhead, acknowledgements, gossip, DHT and
coordinator calls. The kernel has no netem on the machines this was written on: then the
links have no added delay (printed).

Verdict: on every veth, in both directions, the bytes counted by the kernel over every 10 s
window (sampled every 0.5 s, sliding) are at most 1.05 × the node's budget × 10 s; the run
advances 10 steps past the first sample and the replicas are bit-identical at a common step;
every node stops with exit code 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distronet.node.bench.netns import LinkShape, ShapedNet, VethSampler, missing_requirements
from distronet.node.bench.netns_swarm import (
    SMALL_GPT,
    SMALL_OPTIMIZER,
    NetnsSwarm,
    small_exchange,
    write_shaped_run,
)
from distronet.node.demo import common_digests
from distronet.node.swarm.budget import parse_rate

pytestmark = [pytest.mark.netns, pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]

WHY_NOT = missing_requirements()
UP, DOWN = "1mbit", "5mbit"
WINDOW_S, TOLERANCE = 10.0, 1.05
N = 4


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
def test_nodes_on_shaped_links_stay_within_their_budgets(tmp_path: Path) -> None:
    run = write_shaped_run(
        tmp_path,
        "chaos4",
        model=SMALL_GPT,
        optimizer=SMALL_OPTIMIZER,
        exchange=small_exchange(1.0),
    )
    link = LinkShape(up="10mbit", down="50mbit", delay_ms=20.0)
    with (
        ShapedNet(N, link, prefix="dnc", subnet="10.77.0") as net,
        NetnsSwarm(net, tmp_path, run, "chaos4") as swarm,
    ):
        swarm.start_coordinator()
        with VethSampler(net, interval_s=0.5) as sampler:
            for _ in range(N):
                swarm.start_node("--up", UP, "--down", DOWN, min_peers=N)
            swarm.wait_steps(list(range(N)), 1, timeout=150.0)
            first = min(swarm.status(i)["step"] for i in range(N))
            swarm.wait_steps(list(range(N)), first + 10, timeout=90.0)
            step, digests = common_digests(swarm, list(range(N)))
            codes = swarm.stop_all()
        statuses = [swarm.status(i) for i in range(N)]

    budgets = {"up": parse_rate(UP), "down": parse_rate(DOWN)}
    report, worst = [], 0.0
    for i in range(N):
        for direction, rate in budgets.items():
            peak = sampler.peak(i, direction, WINDOW_S)
            ratio = peak.nbytes / (rate * WINDOW_S)
            worst = max(worst, ratio)
            report.append(
                f"node{i} {direction}: {peak.nbytes} B in {peak.span_s:.1f} s = {ratio:.3f} of budget"
            )
    print(f"delay applied: {net.delay_applied}; common step {step}; first {first}\n" + "\n".join(report))
    assert codes == [0] * N, codes
    assert worst <= TOLERANCE, "\n".join(report)
    assert step >= first + 5 and len(digests) == 1, (step, digests)
    assert all(s["step"] >= first + 10 and s["rounds"] > 0 for s in statuses)
    # the budget was really in use, not idle
    assert max(sampler.peak(i, "up", WINDOW_S).nbytes for i in range(N)) > 0.3 * budgets["up"] * WINDOW_S
