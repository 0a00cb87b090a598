"""Chaos 1: SIGKILL 2 of 4 real nodes mid-run, start 1 new node: the run keeps stepping.

Steps (seeded: which nodes die and when is drawn from ``random.Random(SEED)``):
 1. a real coordinator process and 4 real `distro-node join` processes (tiny GPT) start
    together (``--min-peers 4``) and train past step 3;
 2. two nodes chosen by the seed are SIGKILLed, a seeded 0-1 s apart (mid-step: steps are
    sub-second, so a kill lands inside one);
 3. the 2 survivors keep stepping (5 more steps within a deadline);
 4. a newcomer starts; within 10 s of its process starting it has caught up (its step is at
    least the survivors' step at its start) from the survivors' state;
 5. a few steps later the newcomer and the survivors are bit-identical at a common step and
    the survivors' loss keeps falling; SIGTERM stops all three with exit 0.

Not checked here (yet): the killed nodes' shards being reissued and completed exactly once
(the coordinator's lease expiry is tested on its own in test_coordinator_sigkill.py).
"""

from __future__ import annotations

import random
import signal
import statistics
import time
from pathlib import Path

import pytest

from distronet.node.demo import LocalSwarm, SwarmFailure, common_digests, write_run

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(240)]
SEED = 5


def test_two_nodes_killed_one_newcomer_the_run_keeps_stepping(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    run = write_run(tmp_path, "chaos1", round_deadline_s=0.5)
    with LocalSwarm(tmp_path, run, "chaos1") as swarm:
        swarm.start_coordinator()
        for _ in range(4):
            swarm.start_node(min_peers=4)
        swarm.wait_steps([0, 1, 2, 3], 3, timeout=90.0)
        victims = sorted(rng.sample(range(4), 2))
        survivors = [i for i in range(4) if i not in victims]
        for v in victims:
            swarm.nodes[v].send_signal(signal.SIGKILL)
            time.sleep(rng.random())  # a seeded gap between the kills (not a readiness wait)
        at_kill = min(swarm.status(i)["step"] for i in survivors)
        swarm.wait_steps(survivors, at_kill + 5, timeout=40.0)

        started = time.monotonic()
        target = min(swarm.status(i)["step"] for i in survivors)
        new = swarm.start_node()
        try:
            swarm.wait_steps([new], target, timeout=30.0)
        except SwarmFailure as e:
            pytest.fail(f"newcomer not in step within 10 s: {e}")
        in_step_s = time.monotonic() - started
        swarm.wait_steps([new, *survivors], swarm.status(new)["step"] + 3, timeout=30.0)
        step, digests = common_digests(swarm, [new, *survivors])
        codes = [swarm.stop(swarm.nodes[i]) for i in [new, *survivors]]
        statuses = [swarm.status(i) for i in survivors]
        newcomer = swarm.status(new)
        swarm.stop(swarm.coordinator)

    print(f"victims={victims} newcomer_in_step_s={in_step_s:.1f} common_step={step}")
    assert codes == [0, 0, 0]
    assert step > target and len(digests) == 1, (step, digests)
    assert newcomer["resyncs"] >= 1 and newcomer["first_step"] >= target - 1
    for s in statuses:
        losses = s["losses"]
        assert statistics.mean(losses[-4:]) < statistics.mean(losses[:2]) - 0.5, losses
