"""A real `distro-node join --device mlx` process trains beside two torch-CPU node processes.

Steps:
 1. write a run (tiny GPT, built-in corpus shards), start `distro-coordinator serve`;
 2. start 3 nodes with ``--min-peers 3``: node 1 with ``--device mlx`` (MLX's CPU backend),
    nodes 0 and 2 with ``--device cpu``;
 3. wait (deadline) until all three agree on the parameter digest of a step past step 8. A
    replica that applied a different accepted set under load is repaired by its drift check,
    so agreement is awaited rather than asserted at one instant (the strict every-step check
    lives in test_daemon_swarm.py, with torch on every node);
 4. node 1's status names the ``mlx`` device, its packets were accepted in most rounds, and
    every node's loss fell; all three stop with exit code 0 on SIGTERM.

Real MLX (``mlx[cpu]`` on Linux): skips locally without it, fails under CI (``CI`` set).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from distronet.node.demo import LocalSwarm, wait_identical, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

DEVICES = ["cpu", "mlx", "cpu"]
AFTER = 8


@pytest.mark.usefixtures("require_mlx")
def test_mlx_node_process_trains_with_torch_nodes(tmp_path: Path) -> None:
    run = write_run(tmp_path, "mlxd", round_deadline_s=0.5)
    with LocalSwarm(tmp_path, run, "mlxd") as swarm:
        swarm.start_coordinator()
        for device in DEVICES:
            swarm.start_node("--device", device, min_peers=3)
        step, digests = wait_identical(swarm, [0, 1, 2], after=AFTER, timeout=100.0)
        statuses = [swarm.status(i) for i in range(3)]
        codes = [swarm.stop(p, timeout=30.0) for p in swarm.nodes]
        swarm.stop(swarm.coordinator)

    assert step > AFTER and len(digests) == 1, (step, digests)
    assert [s.get("device") for s in statuses] == DEVICES
    assert codes == [0, 0, 0]
    mlx_node = statuses[1]
    assert mlx_node["own_accepted"] >= mlx_node["rounds"] // 2, mlx_node
    for s in statuses:
        losses = s["losses"]
        assert statistics.mean(losses[-4:]) < statistics.mean(losses[:2]) - 0.3, losses
