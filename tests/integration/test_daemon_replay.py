"""A node that joins a run a few rounds after it started replays the rounds it missed
(``node/catchup/replay.py``) instead of downloading the swarm's state, and its packets count at once.

Real coordinator and three real `distro-node join` processes on loopback: nodes 0 and 1 start
together and train; node 2 starts once they are past step 3. Its step 0 is the run's seeded
weights, i.e. the swarm's state of step 0, so it replays rounds 0.. from a peer's accepted sets
and frames. The run keeps 256 rounds (``[exchange] retention``), so node 2 is within reach however
slowly it starts. Then the three replicas are bit-identical and node 2's packets are accepted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from distronet.node.demo import TINY_MODEL, LocalSwarm, common_digests, wait_until, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def test_a_node_a_few_rounds_late_replays_them_and_trains_in_step(tmp_path: Path) -> None:
    run = write_run(tmp_path, "replay", round_deadline_s=0.5, model=TINY_MODEL)
    text = run.read_text()
    run.write_text(text.replace("pull_timeout_s = 10.0\n", "pull_timeout_s = 10.0\nretention = 256\n", 1))
    assert "retention = 256" in run.read_text()
    with LocalSwarm(tmp_path, run, "replay") as swarm:
        swarm.start_coordinator()
        swarm.start_node(min_peers=2)
        swarm.start_node(min_peers=2)
        swarm.wait_steps([0, 1], 3, timeout=60.0)
        swarm.start_node("--log-level", "info")

        def node2_accepted() -> bool:
            return int(swarm.status(2).get("own_accepted", 0)) >= 3

        wait_until(node2_accepted, 60.0, "node 2's packets to be accepted three times")
        target = max(int(swarm.status(i).get("step", 0)) for i in range(3)) + 3
        swarm.wait_steps([0, 1, 2], target, timeout=60.0)
        step, digests = common_digests(swarm, [0, 1, 2])
        statuses = [swarm.status(i) for i in range(3)]
        for p in swarm.nodes:
            swarm.stop(p, timeout=30.0)
        swarm.stop(swarm.coordinator)

    log = (tmp_path / "node2.log").read_text(errors="replace")
    assert "caught up: replayed rounds 0-" in log, log[-3000:]
    assert "state download" not in log and "adopted the swarm's state" not in log, log[-3000:]
    assert step >= target and len(digests) == 1, (step, digests)
    assert statuses[2]["resyncs"] == 1 and statuses[2]["drift_differs"] == 0
    # Nodes 0 and 1 never download a state and never differ from each other. In full-suite
    # runs one of them has been seen to catch up once without a state (``resyncs`` 1, ``resync_steps``
    # empty; why is not yet known: the log of such a run is the next step); that is not a
    # state download, so it is allowed here (and shown if anything else goes wrong).
    assert all(s["resync_steps"] == [] and s["drift_differs"] == 0 for s in statuses[:2]), [
        {k: s.get(k) for k in ("step", "resyncs", "resync_steps", "drift_differs", "fell_behind")}
        for s in statuses
    ]
