"""`distro-node doctor --coordinator URL RUN` as a real process against a real coordinator process.

Steps:
 1. write a run (tiny GPT, round deadline 2.5 s) and start `distro-coordinator serve`;
 2. doctor it (JSON): the run's model, batch, sequence length and deadline are what it measured,
    the link to the coordinator was measured both ways, a round moves the packet to and from
    the one peer it assumes, and it keeps up (exit 0);
 3. doctor it under an 8 kbit/s upload budget: it cannot keep up, blames the budget and says
    to raise --up (exit 10);
 4. a run the coordinator does not have: exit 4, said on stderr; a coordinator that is not
    there: exit 3 — both before torch loads.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from distronet.node.demo import TINY_MODEL, LocalSwarm, write_run
from distronet.node.exitcodes import ExitCode

pytestmark = [pytest.mark.timeout(90)]

FAST = ["--threads", "1", "--warmup", "1", "--steps", "2", "--probe-bytes", "262144", "--probes", "2"]


def doctor(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "distronet.node.cli", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_doctor_measures_the_runs_model_and_link_and_judges_its_deadline(tmp_path: Path) -> None:
    run = write_run(tmp_path, "doc", shards=1, round_deadline_s=2.5)
    with LocalSwarm(tmp_path, run, "doc") as swarm:
        url = swarm.start_coordinator()
        ok = doctor("--coordinator", url, "doc", "--json", *FAST)
        slow = doctor("--coordinator", url, "doc", "--up", "8kbit", *FAST)
        missing = doctor("--coordinator", url, "nope", *FAST)
        swarm.stop(swarm.coordinator)
    assert ok.returncode == ExitCode.OK, ok.stderr[-2000:]
    rep = json.loads(ok.stdout)
    s, t, link = rep["step"], rep["round"], rep["link"]
    assert rep["run"] == "doc" and s["source"] == "run doc" and s["model"] == "gpt"
    assert (s["batch"], s["seq_len"]) == (TINY_MODEL["batch"], TINY_MODEL["seq_len"])
    assert s["params"] < 200_000 and len(s["times_s"]) == 2 and s["median_s"] > 0
    assert s["packet_bytes"] > 1000 and s["fits"] is True and 0 < s["peak_bytes"] < s["usable_bytes"]
    assert 0 < s["estimate_bytes"] < s["peak_bytes"] and s["decoded_peers"] == 1  # decoded: the one other
    assert t["deadline_s"] == 2.5 and t["peers"] == 1  # no node has joined: one peer assumed
    assert t["up_bytes"] == t["down_bytes"] == s["packet_bytes"]
    assert link["coordinator"] == url and link["down_rate"] > 1e5 and link["up_rate"] > 1e5
    assert rep["machine"]["cores"] >= 1 and rep["machine"]["memory_total"] > 0
    assert rep["verdict"]["keeps_up"] is True and rep["verdict"]["line"].startswith("verdict: can keep up")

    assert slow.returncode == ExitCode.CANNOT_KEEP_UP, slow.stderr[-2000:]
    last = slow.stdout.strip().splitlines()[-1]
    assert last.startswith("verdict: cannot keep up") and "(budget)" in last and "raise --up" in last
    assert "link      down " in slow.stdout and "step      " in slow.stdout

    assert missing.returncode == ExitCode.REJECTED and missing.stdout == ""
    assert "has no run 'nope'" in missing.stderr
    gone = doctor("--coordinator", f"http://127.0.0.1:{_closed_port()}", "doc", *FAST, timeout=30)
    assert gone.returncode == ExitCode.COORDINATOR_UNREACHABLE and "unreachable" in gone.stderr
