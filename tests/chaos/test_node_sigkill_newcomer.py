"""Chaos 1: SIGKILL 2 of 4 real nodes mid-run, start 1 new node: the run keeps stepping, and the
killed nodes' shards are reissued and each completed exactly once.

Steps (seeded: which nodes die and when is drawn from ``random.Random(SEED)``):
 1. a real coordinator process and 4 real `distro-node join` processes (tiny GPT; shards of 8
    steps; leases expire 6 s after their last renewal) start together (``--min-peers 4``) and
    train past step 3;
 2. two nodes chosen by the seed are SIGKILLed, a seeded 0-1 s apart (mid-step: steps are
    sub-second, so a kill lands inside one); the coordinator's API shows the shard units they held;
 3. the 2 survivors keep stepping (5 more steps within a deadline);
 4. a newcomer starts; it has caught up (its step is at least the survivors' step at its start)
    from the survivors' state within ``NEWCOMER_S`` of its process starting (the time taken is
    printed: ``newcomer_in_step_s``);
 5. the victims' units expire, are leased again and completed by a live node: the coordinator's
    API shows each ``done``, completed by a survivor or the newcomer, issued at least twice;
    the newcomer's packets are masked for 3 warm-up steps after the state it adopted (the
    survivors' accepted sets leave it out there), then accepted;
 6. the newcomer and the survivors are bit-identical at their newest common step (within 60 s:
    a replica that missed a round's manifest is repaired by its drift check) and the
    survivors' loss keeps falling; SIGTERM stops all three with exit 0;
 7. the ledger (the coordinator's SQLite file, read after it stopped) credits every completed
    unit exactly once: the nodes' shard counts sum to the number of done units, their tokens to
    the done units' tokens; no unit is held by a killed node; every completion a live node made
    is credited to it.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from distronet.node.demo import LocalSwarm, wait_identical, wait_until, write_run

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(300)]
SEED = 5
SHARD_TOKENS = 4096  # 8 steps of the tiny model's 8 x 64 tokens
NEWCOMER_S = 60.0  # the 10 s holds on a quiet machine; under CI load imports alone take ~9 s


def units(swarm: LocalSwarm) -> dict[int, dict[str, Any]]:
    """Every unit the coordinator has ever leased (they are issued in order), by its API."""
    out: dict[int, dict[str, Any]] = {}
    for u in range(10_000):
        state = swarm.api(f"/runs/{swarm.run_id}/leases/{u}")
        if state["issues"] == 0 and state["state"] == "free":
            return out
        out[u] = state
    return out


def test_two_nodes_killed_one_newcomer_the_run_keeps_stepping(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    run = write_run(
        tmp_path, "chaos1", round_deadline_s=0.5, shards=12, shard_tokens=SHARD_TOKENS, lease_ttl_s=6.0
    )
    with LocalSwarm(tmp_path, run, "chaos1") as swarm:
        swarm.start_coordinator()
        for _ in range(4):
            swarm.start_node(min_peers=4)
        swarm.wait_steps([0, 1, 2, 3], 3, timeout=120.0)
        peer = {i: swarm.status(i)["peer_id"] for i in range(4)}
        victims = sorted(rng.sample(range(4), 2))
        survivors = [i for i in range(4) if i not in victims]
        for v in victims:
            swarm.nodes[v].send_signal(signal.SIGKILL)
            time.sleep(rng.random())  # a seeded gap between the kills (not a readiness wait)
        dead = {peer[v] for v in victims}
        held = sorted(u for u, s in units(swarm).items() if s["state"] == "leased" and s["holder"] in dead)
        at_kill = min(swarm.status(i)["step"] for i in survivors)
        swarm.wait_steps(survivors, at_kill + 5, timeout=40.0)

        started = time.monotonic()
        target = min(swarm.status(i)["step"] for i in survivors)
        new = swarm.start_node("--log-level", "info")  # its log shows where the join time goes
        swarm.wait_steps([new], target, timeout=NEWCOMER_S)
        in_step_s = time.monotonic() - started
        live = [new, *survivors]
        peer[new] = swarm.status(new)["peer_id"]

        def reissued_and_done() -> bool:
            return all(swarm.api(f"/runs/chaos1/leases/{u}")["state"] == "done" for u in held)

        wait_until(reissued_and_done, 90.0, f"the killed nodes' units {held} to be completed again")

        def newcomer_accepted() -> bool:  # once its warm-up is over, its packets count
            warm_until = swarm.status(new).get("warmup_until", 2**62)
            return any(
                peer[new] in peers
                for i in survivors
                for k, peers in swarm.status(i).get("accepted", {}).items()
                if int(k) >= warm_until
            )

        wait_until(newcomer_accepted, 40.0, "the survivors to accept the newcomer's packets")
        victim_units = {u: swarm.api(f"/runs/chaos1/leases/{u}") for u in held}
        step, digests = wait_identical(swarm, live, max(swarm.status(i)["step"] for i in live), 60.0)
        book = units(swarm)
        codes = [swarm.stop(swarm.nodes[i]) for i in live]
        statuses = {i: swarm.status(i) for i in live}
        swarm.stop(swarm.coordinator)

    print(
        f"victims={victims} held={held} newcomer_in_step_s={in_step_s:.1f} common_step={step} "
        f"units={len(book)} done={sum(s['state'] == 'done' for s in book.values())}"
    )
    assert codes == [0, 0, 0]
    assert step > target and len(digests) == 1, (step, digests)
    newcomer = statuses[new]
    assert newcomer["resyncs"] >= 1 and newcomer["first_step"] >= target - 1
    for r in newcomer["resync_steps"]:  # after each state it adopted, its warm-up packets were masked
        for i in survivors:
            masked = [k for k, v in statuses[i]["accepted"].items() if r <= int(k) < r + 3]
            assert all(peer[new] not in statuses[i]["accepted"][k] for k in masked), (i, r)
    for i in survivors:
        losses = statuses[i]["losses"]
        assert statistics.mean(losses[-4:]) < statistics.mean(losses[:2]) - 0.5, losses

    # the killed nodes' units: reissued (issued again after their lease expired) and completed
    # by a live node
    # each killed node held its one unit (max_leases_per_node = 1) unless the kill fell in the
    # milliseconds between completing a shard and leasing the next
    assert 1 <= len(held) <= 2, f"the killed nodes held {held}"
    live_peers = {peer[i] for i in live}
    for u, s in victim_units.items():
        assert s["state"] == "done" and s["completed_by"] in live_peers and s["issues"] >= 2, (u, s)
    # nothing lost: no unit is left with a killed node
    assert not [u for u, s in book.items() if s["holder"] in dead], book

    # the ledger, read from the coordinator's own SQLite file: every done unit credited once
    db = sqlite3.connect(tmp_path / "coordinator" / "coordinator.db")
    try:
        done = dict(db.execute("SELECT unit, completed_by FROM units WHERE run_id='chaos1' AND state=2"))
        credited = db.execute(
            "SELECT COALESCE(SUM(shards), 0), COALESCE(SUM(tokens), 0) FROM nodes WHERE run_id='chaos1'"
        ).fetchone()
    finally:
        db.close()
    assert set(held) <= set(done)
    assert credited == (len(done), len(done) * SHARD_TOKENS), (credited, len(done))
    for i in live:  # every completion a live node reported was credited to it
        for u in statuses[i]["completed_units"]:
            assert done.get(u) == peer[i], (i, u, done.get(u))
