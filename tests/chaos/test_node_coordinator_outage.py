"""Chaos 2: SIGKILL the coordinator under 4 training nodes and restart it 20 s later on the same
data folder and port: no node stops training, and afterwards the ledger holds every report.

Steps:
 1. a coordinator process and 4 `distro-node join` processes (tiny GPT; shards of 4 steps)
    train past step 2;
 2. SIGKILL the coordinator. During the 20 s it is down every node keeps stepping (at least 6
    steps each, asserted) and finishes a shard: the completion (and the heartbeats) are queued
    by the client library (``pending_reports`` > 0 in its status) while it keeps training;
 3. 20 s after the kill the coordinator restarts on the same folder and port; every node keeps
    stepping, and its queue drains (``pending_reports`` back to 0);
 4. the ledger holds every report: each unit a node reported complete — before, during and
    after the outage — is ``done`` and credited to that node (the coordinator's per-node shard
    count equals the node's number of completions: none lost, none counted twice), and the
    coordinator's view of each node's step is past the outage;
 5. SIGTERM every node: exit 0.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from distronet.node.demo import LocalSwarm, wait_until, write_run

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]
OUTAGE_S = 20.0
N = 4


def test_nodes_train_through_a_coordinator_outage(tmp_path: Path) -> None:
    run = write_run(tmp_path, "chaos2", round_deadline_s=0.5, shards=12, shard_tokens=2048)
    nodes = list(range(N))
    with LocalSwarm(tmp_path, run, "chaos2") as swarm:
        url = swarm.start_coordinator()
        port = int(url.rsplit(":", 1)[1])
        for _ in nodes:
            swarm.start_node(min_peers=N)
        swarm.wait_steps(nodes, 2, timeout=120.0)
        assert swarm.coordinator is not None
        swarm.coordinator.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        swarm.coordinator.wait(10)
        before = {i: swarm.status(i) for i in nodes}

        def trained_and_queued() -> bool:
            for i in nodes:
                s = swarm.status(i)
                done = len(s["completed_units"]) > len(before[i]["completed_units"])
                if s["step"] < before[i]["step"] + 6 or not done or s["pending_reports"] < 1:
                    return False
            return True

        wait_until(trained_and_queued, OUTAGE_S - 1, "every node to step on and queue a shard completion")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - killed)))  # the scenario: 20 s down
        during = {i: swarm.status(i) for i in nodes}
        assert all(swarm.nodes[i].poll() is None for i in nodes)
        outage_s = time.monotonic() - killed

        swarm.start_coordinator(port=port)
        swarm.wait_steps(nodes, max(s["step"] for s in during.values()) + 2, timeout=40.0)
        wait_until(
            lambda: all(swarm.status(i)["pending_reports"] == 0 for i in nodes),
            40.0,
            "every node's queued reports to reach the restarted coordinator",
        )
        codes, stop_s = [], []  # final status files; the ledger stops moving
        for p in swarm.nodes:
            t0 = time.monotonic()
            codes.append(swarm.stop(p))
            stop_s.append(round(time.monotonic() - t0, 1))
        after = {i: swarm.status(i) for i in nodes}
        ledger = {n["peer_id"]: n for n in swarm.api("/runs/chaos2/nodes")["nodes"]}
        unit_state = {
            u: swarm.api(f"/runs/chaos2/leases/{u}") for s in after.values() for u in s["completed_units"]
        }

    stepped = {i: during[i]["step"] - before[i]["step"] for i in nodes}
    print(f"outage_s={outage_s:.1f} steps_during_outage={stepped} stop_s={stop_s}")
    assert codes == [0] * N
    for i in nodes:
        s, peer = after[i], after[i]["peer_id"]
        assert stepped[i] >= 6
        assert len(set(s["completed_units"])) == len(s["completed_units"])
        for u in s["completed_units"]:
            assert unit_state[u]["state"] == "done" and unit_state[u]["completed_by"] == peer, (i, u)
        assert ledger[peer]["shards"] == len(s["completed_units"]), (i, ledger[peer], s["completed_units"])
        assert ledger[peer]["last_step"] >= during[i]["step"], (i, ledger[peer])
