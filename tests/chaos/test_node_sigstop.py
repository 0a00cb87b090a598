"""Chaos 3: SIGSTOP a node for 30 s, then SIGCONT: it is left out of rounds while stopped, then
resyncs and contributes again.

Steps (seeded: which node is stopped comes from ``random.Random(SEED)``):
 1. a real coordinator process and 4 real `distro-node join` processes (tiny GPT) train past
    step 3;
 2. node X is SIGSTOPped (its p2pd keeps running; the Python daemon is frozen). The 3 others
    keep stepping (12 steps within the stop), and every round that started once X was stopped
    left X out of its accepted set, on each of them. (They need not agree round by round: on a
    loaded machine a replica can miss a leader's manifest; the drift check then resyncs it.)
 3. 30 s after the stop X is SIGCONTed. It finds it fell behind, adopts the swarm's state
    (``resyncs`` grows; the step it adopted is past the one the others had reached at SIGCONT),
    publishes masked warm-up packets for ``warmup_mask_steps`` steps (the others' accepted sets
    leave it out there), then its packets are accepted by the others again;
 4. all 4 are bit-identical at their newest common step after that (within 60 s: a replica
    that missed a round's manifest on a loaded machine is repaired by its drift check); SIGTERM
    stops all with exit 0.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from distronet.node.demo import LocalSwarm, SwarmFailure, wait_identical, write_run

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]
SEED = 3
STOP_S = 30.0


def rounds(status: dict[str, Any], low: int, high: int) -> dict[int, list[str]]:
    """The accepted sets a node's status lists for steps ``low`` .. ``high``."""
    return {int(k): v for k, v in status.get("accepted", {}).items() if low <= int(k) <= high}


def wait_for(check: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise SwarmFailure(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def test_stopped_node_is_left_out_then_resyncs_and_contributes(tmp_path: Path) -> None:
    run = write_run(tmp_path, "chaos3", round_deadline_s=0.5)
    with LocalSwarm(tmp_path, run, "chaos3") as swarm:
        swarm.start_coordinator()
        for _ in range(4):
            swarm.start_node(min_peers=4)
        everyone = [0, 1, 2, 3]
        swarm.wait_steps(everyone, 3, timeout=120.0)
        x = random.Random(SEED).randrange(4)
        others = [i for i in everyone if i != x]
        xid = swarm.status(x)["peer_id"]

        swarm.nodes[x].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        x_step = swarm.status(x)["step"]
        at_stop = max(swarm.status(i)["step"] for i in others)
        swarm.wait_steps(others, at_stop + 12, timeout=STOP_S - 3)
        time.sleep(max(0.0, STOP_S - (time.monotonic() - stopped)))  # the scenario: 30 s stopped
        during = {i: swarm.status(i) for i in others}
        assert swarm.status(x)["step"] == x_step, "the stopped node moved"
        swarm.nodes[x].send_signal(signal.SIGCONT)
        at_cont = min(s["step"] for s in during.values())
        stop_s = time.monotonic() - stopped

        # 3. X finds it is behind and adopts the swarm's state, then contributes again
        def resynced() -> bool:
            s = swarm.status(x)
            return s.get("resyncs", 0) >= 1 and s.get("step", -1) > s.get("warmup_until", 2**62)

        swarm.wait_steps(others, at_cont + 1, timeout=30.0)  # the others never stopped
        wait_for(resynced, 60.0, f"node {x} to resync after SIGCONT and finish its warm-up")
        resumed = time.monotonic()
        xs = swarm.status(x)
        adopted, warm_until = xs["resync_steps"][-1], xs["warmup_until"]

        def accepted_again() -> bool:
            return any(xid in v for i in others for v in rounds(swarm.status(i), warm_until, 2**62).values())

        wait_for(accepted_again, 40.0, f"the others to accept node {x}'s packets again")
        contributed_s = time.monotonic() - resumed
        after = {i: swarm.status(i) for i in others}
        step, digests = wait_identical(swarm, everyone, warm_until, timeout=60.0)
        codes = [swarm.stop(p) for p in swarm.nodes]
        swarm.stop(swarm.coordinator)

    print(
        f"stopped=node{x} at_stop={at_stop} at_cont={at_cont} stop_s={stop_s:.1f} adopted={adopted} "
        f"warm_until={warm_until} fell_behind={xs['fell_behind']} contributed_after_s={contributed_s:.1f} "
        f"common_step={step}"
    )
    # 2. while X was stopped: left out of every round that began after the stop, and the others agree
    stopped_rounds = [rounds(s, at_stop + 2, at_cont) for s in during.values()]
    assert all(len(r) >= 10 for r in stopped_rounds), stopped_rounds
    for r in stopped_rounds:
        assert all(xid not in peers and peers for peers in r.values()), r
    # 3. it adopted a state from after the stop; its warm-up packets were masked, then accepted
    assert adopted >= at_cont and warm_until == adopted + 3, (adopted, warm_until)
    for s in after.values():
        assert all(xid not in v for v in rounds(s, adopted, warm_until - 1).values())
    # 4. all four replicas bit-identical
    assert step > warm_until and len(digests) == 1, (step, digests)
    assert codes == [0, 0, 0, 0]
