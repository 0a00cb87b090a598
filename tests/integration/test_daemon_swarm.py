"""Three real `distro-node join` processes and a real coordinator process on loopback.

Steps:
 1. write a run (tiny GPT with a global batch, built-in corpus shards), start
    `distro-coordinator serve` (port file);
 2. start 3 nodes with ``--min-peers 3`` so they begin step 0 together;
 3. wait (deadline) until every node has finished step 9;
 4. the replicas are bit-identical (same parameter sha256 at the newest common step and at
    every common step reported; also by their own drift check at step 10, which a node skips
    when no peer is at its step at that moment), the loss has fallen, every node's packets
    were accepted;
 5. SIGTERM nodes 0 and 1: each exits 0 after finishing its step and leaving the run, with a
    checkpoint on disk; node 2 gets Ctrl-C twice (0.3 s apart, so the kernel does not merge
    the two signals) while the coordinator is SIGSTOPped (so its clean stop is still leaving
    the run): forced exit 130.
"""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path

import pytest

from distronet.node.demo import TINY_MODEL, LocalSwarm, common_digests, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STEPS = 10


def test_three_nodes_train_identically_and_stop_on_signals(tmp_path: Path) -> None:
    # global_batch = 3 nodes x batch: each node's share is its batch once all 3 are in rounds
    # (the daemon's batch_share.SharedFeed path, in real processes)
    model = {**TINY_MODEL, "global_batch": 3 * int(TINY_MODEL["batch"])}
    run = write_run(tmp_path, "itest", round_deadline_s=0.5, model=model)
    with LocalSwarm(tmp_path, run, "itest") as swarm:
        swarm.start_coordinator()
        for _ in range(3):
            swarm.start_node(min_peers=3)
        swarm.wait_steps([0, 1, 2], STEPS - 1, timeout=75.0)
        # what each node logged while all three trained: once node 2 is gone, its DHT record
        # outlives it and the others rightly re-dial it (swarm.links), so later lines are not checked
        trained = [len((tmp_path / f"node{i}.log").read_bytes()) for i in range(3)]
        # the coordinator is stopped so that node 2's clean stop cannot finish before the second
        # Ctrl-C arrives: leaving the run waits for the coordinator (capped at 3 s), and a clean
        # stop is otherwise fast enough (< 0.3 s) to exit 0 first
        swarm.coordinator.send_signal(signal.SIGSTOP)
        try:
            swarm.nodes[2].send_signal(signal.SIGINT)
            time.sleep(0.3)  # spacing, not a readiness wait: two pending SIGINTs would merge
            swarm.nodes[2].send_signal(signal.SIGINT)
            forced = swarm.nodes[2].wait(10)
        finally:
            swarm.coordinator.send_signal(signal.SIGCONT)
        codes = [swarm.stop(p, timeout=30.0) for p in swarm.nodes[:2]]
        statuses = [swarm.status(i) for i in range(3)]
        step, digests = common_digests(swarm, [0, 1, 2])
        held = [{int(k): v for k, v in s["digests"].items()} for s in statuses]
        swarm.stop(swarm.coordinator)

    assert codes == [0, 0] and forced == 130  # the second Ctrl-C forced the exit
    assert step >= STEPS - 1 and len(digests) == 1, (step, digests)
    for t in set(held[0]) & set(held[1]) & set(held[2]):
        assert held[0][t] == held[1][t] == held[2][t], t
    for s in statuses[:2]:
        assert s["state"] == "closed"
    for s in statuses:
        losses = s["losses"]
        assert statistics.mean(losses[-4:]) < statistics.mean(losses[:2]) - 0.5, losses
        assert s["own_accepted"] >= s["rounds"] - 2
        assert s["drift_differs"] == 0
    assert sum(s["drift_equal"] for s in statuses) >= 1
    for i in range(2):
        assert (tmp_path / f"node{i}" / "checkpoint.safetensors").exists()
    for i in range(3):  # a healthy mesh: no member looked missing from the topics (swarm.links)
        log = (tmp_path / f"node{i}.log").read_bytes()[: trained[i]].decode(errors="replace")
        assert "re-dialling" not in log and "differ from" not in log, log[-2000:]
