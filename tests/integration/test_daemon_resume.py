"""One real node process: /metrics while it trains, SIGTERM → exit 0 with a checkpoint, restart
resumes from it; named exit codes for a bad configuration and an unreachable coordinator.

Steps:
 1. a coordinator process and one `distro-node join` (``--min-peers 1``, ``--metrics-port``);
 2. once it has finished step 2, scrape /metrics: ARCHITECTURE §8 names are there;
 3. SIGTERM: exit 0, checkpoint on disk at the step it stopped;
 4. start it again on the same data dir: its first step is the checkpoint's step, and its
    identity (peer id) is the same;
 5. `join` without --coordinator exits 2; with a dead coordinator URL exits 3.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from distronet.node.demo import LocalSwarm, write_run
from distronet.node.exitcodes import ExitCode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_sigterm_checkpoint_and_resume(tmp_path: Path) -> None:
    run = write_run(tmp_path, "resume", round_deadline_s=0.3)
    port = free_port()
    with LocalSwarm(tmp_path, run, "resume") as swarm:
        swarm.start_coordinator()
        swarm.start_node("--metrics-port", str(port), "--checkpoint-every", "2")
        swarm.wait_steps([0], 2, timeout=60.0)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for name in ("distro_node_steps_total", "distro_node_step_seconds_bucket", "distro_node_bytes_total",
                     "distro_node_budget_utilisation", "distro_node_peers_live", "distro_node_loss",
                     "distro_node_info"):  # fmt: skip
            assert name in text, name
        assert 'python_gc_collections_total{generation="2"}' in text  # the collector's counters are served
        assert "process_resident_memory_bytes" in text
        assert swarm.stop(swarm.nodes[0]) == 0
        first = swarm.status(0)
        assert first["state"] == "closed" and (tmp_path / "node0" / "checkpoint.safetensors").exists()

        swarm.nodes.pop()
        swarm.node_dirs.pop()
        (tmp_path / "node0" / "status.json").unlink()
        swarm.start_node("--max-steps", str(first["step"] + 3))
        assert swarm.nodes[0].wait(60) == 0  # --max-steps: a clean stop by itself
        second = swarm.status(0)
    assert second["peer_id"] == first["peer_id"]
    # --max-steps counts steps of the run (0-based), so the last one finished is max_steps - 1
    assert second["first_step"] == first["step"] + 1 and second["step"] == first["step"] + 2


def test_named_exit_codes(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "distronet.node.cli", "join", "r", "--data-dir", str(tmp_path)]
    env_free = {"PATH": "/usr/bin:/bin"}
    bad = subprocess.run(base, capture_output=True, timeout=60, env=env_free)
    assert bad.returncode == ExitCode.USAGE and b"--coordinator" in bad.stderr
    dead = subprocess.run(
        [*base, "--coordinator", f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        timeout=60,
        env=env_free,
    )
    assert dead.returncode == ExitCode.COORDINATOR_UNREACHABLE, dead.stderr[-500:]
