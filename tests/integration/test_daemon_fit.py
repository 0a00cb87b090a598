"""A real `distro-node join` given a run too big for it (``--memory-cap``) exits with
``ExitCode.WONT_FIT`` before it joins or downloads anything, saying what to change; a second
node that follows the advice (the ``--micro-batch`` the message names) passes the check, joins
and leases a shard (so what the first one did not do is observable)."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from distronet.node.demo import LocalSwarm, wait_until, write_run
from distronet.node.exitcodes import ExitCode

pytestmark = [pytest.mark.timeout(120)]

BIG = {"arch": "gpt", "depth": 4, "width": 128, "heads": 4, "context": 128, "batch": 64, "seq_len": 128}
CAP = "150MB"  # the run's GPT needs ~0.5 GB at its whole batch of 64 x 128 tokens


def _requests(url: str) -> dict[str, int]:
    """The coordinator's request count per route (its Prometheus /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    counts: dict[str, int] = {}
    for m in re.finditer(r"^distro_coordinator_requests(?:_total)?\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
        route = re.search(r'route="([^"]+)"', m.group(1))
        if route:
            counts[route.group(1)] = counts.get(route.group(1), 0) + int(float(m.group(2)))
    return counts


def test_a_run_too_big_for_the_cap_is_refused_before_anything_large(tmp_path: Path) -> None:
    run = write_run(tmp_path, "big", shards=2, model=BIG)
    with LocalSwarm(tmp_path, run, "big") as swarm:
        url = swarm.start_coordinator()
        before = _requests(url)
        i = swarm.start_node("--device", "cpu", "--memory-cap", CAP)
        proc = swarm.nodes[i]
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the node did not exit: {swarm.log_tail(i)}")
        log = (tmp_path / f"node{i}.log").read_text()
        assert code == ExitCode.WONT_FIT == 9, log
        assert "does not fit" in log and "this node has 150.0 MB" in log and "--memory-cap" in log, log
        m = re.search(r"a micro-batch of at most (\d+) \(--micro-batch (\d+)\)", log)
        assert m and m.group(1) == m.group(2) and 1 <= int(m.group(1)) < 64, log
        # nothing large fetched, not even joined: only the run's tables were read
        seen = {k: v - before.get(k, 0) for k, v in _requests(url).items() if v > before.get(k, 0)}
        assert set(seen) == {"get_run", "metrics"}, seen
        node_dir = swarm.node_dirs[i]
        assert not (node_dir / "shards").exists() and not list(node_dir.glob("*tokenizer*")), list(
            node_dir.iterdir()
        )

        # the advice works: at that micro-batch the same cap passes the check, the node joins and leases
        j = swarm.start_node("--device", "cpu", "--memory-cap", CAP, "--micro-batch", m.group(1))

        def leased() -> bool:
            if swarm.nodes[j].poll() is not None:
                raise AssertionError(f"node exited {swarm.nodes[j].returncode}: {swarm.log_tail(j)}")
            return any("lease" in k for k in _requests(url)) and _requests(url).get("join", 0) >= 1

        wait_until(leased, 90, "the second node's join and lease")
        assert swarm.stop(swarm.nodes[j]) == 0
