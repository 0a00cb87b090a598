"""Three real `distro-node join` processes and a real coordinator process on loopback.

Steps:
 1. write a run (tiny GPT, built-in corpus shards), start `distro-coordinator serve` (port file);
 2. start 3 nodes with ``--min-peers 3`` so they begin step 0 together;
 3. wait (deadline) until every node has finished step 11;
 4. the replicas are bit-identical (same parameter sha256 at the newest common step, and at
    every common step reported), the loss has fallen, every node's packets were accepted;
 5. SIGTERM every node: each exits 0 after finishing its step and leaving the run; a
    checkpoint is on disk.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from distronet.node.demo import LocalSwarm, common_digests, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STEPS = 10


def test_three_nodes_train_identically_and_stop_cleanly_on_sigterm(tmp_path: Path) -> None:
    run = write_run(tmp_path, "itest", round_deadline_s=0.5)
    with LocalSwarm(tmp_path, run, "itest") as swarm:
        swarm.start_coordinator()
        for _ in range(3):
            swarm.start_node(min_peers=3)
        swarm.wait_steps([0, 1, 2], STEPS - 1, timeout=75.0)
        codes = [swarm.stop(p, timeout=30.0) for p in swarm.nodes]
        statuses = [swarm.status(i) for i in range(3)]
        step, digests = common_digests(swarm, [0, 1, 2])
        held = [{int(k): v for k, v in s["digests"].items()} for s in statuses]
        swarm.stop(swarm.coordinator)

    assert codes == [0, 0, 0]
    assert step >= STEPS - 1 and len(digests) == 1, (step, digests)
    for t in set(held[0]) & set(held[1]) & set(held[2]):
        assert held[0][t] == held[1][t] == held[2][t], t
    for s in statuses:
        losses = s["losses"]
        assert statistics.mean(losses[-4:]) < statistics.mean(losses[:2]) - 0.5, losses
        assert s["own_accepted"] >= s["rounds"] - 2
        assert s["state"] == "closed"
    for i in range(3):
        assert (tmp_path / f"node{i}" / "checkpoint.pt").exists()
