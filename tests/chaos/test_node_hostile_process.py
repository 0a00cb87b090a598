"""Chaos: four identities the coordinator never admitted attack a live run of real processes
(issue 17). They get no packet accepted, lead no round and serve no state, and their four votes
on one fake state move neither three honest replicas nor a newcomer.

Steps:
 1. a real coordinator (it signs membership credentials) and 3 `distro-node join` processes
    (tiny GPT; the run keeps 8 rounds (``retention``), so a newcomer far behind downloads a state
    rather than replaying rounds; a drift check every 2 steps) train past step 2;
 2. beside them a hostile process (``hostile_peer.py``; its module doc has the details) starts
    4 fresh identities, each with its own p2pd. It dials every node that the coordinator's public
    API lists and, for every step the honest nodes announce, re-signs copies of their packets
    (valid, on the run's plan) as its own packets of the next step and announces them: liars 0 and
    3 with a credential forged by a rogue key (its ticket ground to rank first), liar 1 with none,
    liar 2 with an honest node's genuine credential. It also gossips manifests of that step that it
    leads, listing only its own frames. All four offer one fake state (every parameter + 0.25, at
    the honest step + 1) and answer every digest ask with that state's digest;
 3. the attack reaches every honest node: its status lists all 4 liars as refused
    (``not_admitted``), and its refusals by code (NOT_ADMITTED, BAD_SIGNATURE, WRONG_PEER) grow;
 4. under attack the 3 nodes step on (6 more steps) and keep running drift checks, which find
    the others equal (``drift_equal`` grows);
 5. a newcomer starts while the liars serve their fake state. It downloads a state from a quorum
    of admitted donors (3 honest donors against 4 liars on one root), and then it is in step;
 6. at the end, on all 4 honest nodes: no accepted set holds a liar, no adopted round was led by
    one, and every state a node adopted came from an honest donor (``state_donors``). The liars
    were never asked for a state or a digest. The replicas are bit-identical at their newest
    common step, and SIGTERM stops them with exit 0.

The attack can succeed, which is why this test is worth running. In a manual run of this
scenario (not part of the test) the nodes were started ``--no-require-admission``, which let
the liars in. In ~50 s under attack each of the 3 nodes had a liar in all of its last 128
accepted sets, and liars led 123-125 of those rounds. The drift checks (4 fake votes against 3)
made each node adopt a downloaded state 152-158 times, and every one of them was a liar's
(``state_donors``). The newcomer took 7 of its 8 states from a liar. The liars built states on
request and answered digest asks by the hundred.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from distronet.node.demo import LocalSwarm, common_digests, wait_identical, wait_until, write_run

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(240)]
HOSTILE = Path(__file__).with_name("hostile_peer.py")
LIARS = 4
CODES = ("NOT_ADMITTED", "BAD_SIGNATURE", "WRONG_PEER")  # liars 1, 0 and 3, 2 (module doc)
UNDER_ATTACK = 6  # steps the honest nodes take under attack before the newcomer starts


def read_json(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):
        return {}


def refused(status: dict[str, Any]) -> dict[str, int]:
    return {c: status.get("rejected", {}).get(c, 0) for c in CODES}


def stop_together(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> list[int | None]:
    """SIGTERM every process at once, then wait for each (SIGKILL after ``timeout``); exit codes."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    return [p.returncode for p in procs]


def test_never_admitted_identities_cannot_enter_a_live_run(tmp_path: Path) -> None:
    run = write_run(tmp_path, "hostile", round_deadline_s=0.5)
    run.write_text(run.read_text().replace("manifest_grace_s", "retention = 8\nmanifest_grace_s", 1))
    out = tmp_path / "hostile"
    out.mkdir()
    report = out / "report.json"
    started = time.monotonic()
    phases: dict[str, float] = {}  # seconds from the start to the end of each step (printed)

    def mark(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)

    hostile: subprocess.Popen[bytes] | None = None
    log = open(tmp_path / "hostile.log", "wb")  # noqa: SIM115  (closed in finally)
    try:
        with LocalSwarm(tmp_path, run, "hostile") as swarm:
            swarm.start_coordinator()
            honest = [swarm.start_node("--drift-every", "2", min_peers=3) for _ in range(3)]
            # the liars start beside them and dial the nodes as soon as the coordinator lists one
            hostile = subprocess.Popen(
                [sys.executable, str(HOSTILE), "--coordinator", swarm.url, "--run", "hostile",
                 "--liars", str(LIARS), "--out", str(out)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            swarm.wait_steps(honest, 2, timeout=120.0)
            mark("stepping")
            wait_until(lambda: len(read_json(report).get("peer_ids", [])) == LIARS, 60.0, "the liars")
            liars = set(read_json(report)["peer_ids"])

            def reached(nodes: list[int]) -> bool:  # every liar refused at each node, each code seen
                if hostile is not None and hostile.poll() is not None:
                    raise AssertionError(f"the hostile process exited with {hostile.returncode}")
                for i in nodes:
                    s = swarm.status(i)
                    if not liars <= set(s.get("not_admitted", {})) or 0 in refused(s).values():
                        return False
                return True

            wait_until(lambda: reached(honest), 60.0, "the attack to reach the honest nodes")
            mark("reached")
            at_attack = {i: swarm.status(i) for i in honest}
            attack_step = max(s["step"] for s in at_attack.values())
            swarm.wait_steps(honest, attack_step + UNDER_ATTACK, timeout=60.0)
            mark("stepped_under_attack")

            target = min(swarm.status(i)["step"] for i in honest)
            new = swarm.start_node("--drift-every", "2", "--log-level", "info")
            newcomer_started = time.monotonic()

            def in_step() -> bool:  # it adopted a state, then reported digests beside the others
                if swarm.nodes[new].poll() is not None:
                    raise AssertionError(f"the newcomer exited with {swarm.nodes[new].returncode}")
                mine = swarm.status(new)
                if not mine.get("state_donors") or mine.get("first_step", -1) < target - 1:
                    return False
                return common_digests(swarm, [new, *honest])[0] >= int(mine["first_step"])

            wait_until(in_step, 60.0, "the newcomer to adopt a state and step with the others")
            newcomer_s = time.monotonic() - newcomer_started
            mark("newcomer_in_step")
            wait_until(lambda: reached([new]), 30.0, "the attack to reach the newcomer")
            live = [*honest, new]
            step, digests = wait_identical(swarm, live, swarm.status(new)["first_step"], 60.0)
            mark("identical")
            codes = stop_together([swarm.nodes[i] for i in live])
            final = {i: swarm.status(i) for i in live}
            stop_together([hostile])
            book = read_json(report)
            swarm.stop(swarm.coordinator)
            mark("stopped")
    finally:
        if hostile is not None:
            stop_together([hostile], 20.0)
        log.close()

    drift = [(final[i]["drift_equal"], final[i]["drift_differs"]) for i in live]
    print(f"attack_step={attack_step} common_step={step} newcomer_in_step_s={newcomer_s:.1f} phases={phases} "
          f"refused={[refused(final[i]) for i in live]} drift={drift} hostile={book}")  # fmt: skip
    assert codes == [0, 0, 0, 0]
    ids = {final[i]["peer_id"] for i in live}
    assert book["announced"] >= LIARS * UNDER_ATTACK and book["stolen"], book  # it attacked every step
    for i in live:
        s = final[i]
        # the attack reached the node (step 3): every liar refused here; each code's count grew
        assert liars <= set(s["not_admitted"]), (i, s["not_admitted"])
        if i in honest:
            before, after = refused(at_attack[i]), refused(s)
            assert all(after[c] > before[c] for c in CODES), (i, before, after)
        # not a single packet accepted: no accepted set holds a liar (and honest packets count)
        assert s["accepted"] and not any(liars & set(p) for p in s["accepted"].values()), i
        assert any(int(k) > attack_step and len(p) >= 2 for k, p in s["accepted"].items()), i
        # not a single round led: every adopted round under attack had an honest leader
        assert any(int(k) > attack_step for k in s["leaders"]), (i, s["leaders"])
        assert set(s["leaders"].values()) <= ids, (i, s["leaders"])
        # no state of theirs adopted: every state this node adopted was an honest donor's
        assert set(s["state_donors"]) <= ids, (i, s["state_donors"])
    # three honest replicas against four matching fake votes (step 4): their drift checks ran
    # under attack and found the others equal; none took the liars' state (just above)
    for i in honest:
        assert final[i]["drift_equal"] > at_attack[i]["drift_equal"], (i, final[i])
        assert final[i]["step"] >= attack_step + UNDER_ATTACK, (i, final[i])
    # the newcomer (step 5) downloaded a state while the liars offered theirs, from honest donors
    assert final[new]["state_donors"] and final[new]["resync_steps"], final[new]
    # the liars were never asked: donors and voters are taken from admitted peers only
    assert book["states_built"] == 0 and book["digests_served"] == 0, book
    assert len(digests) == 1 and step >= final[new]["first_step"], (step, digests)
