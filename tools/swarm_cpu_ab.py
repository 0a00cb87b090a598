"""Per-thread CPU of one node of a 4-node loopback swarm, per step.

Starts a coordinator and 4 real nodes on loopback (``demo.LocalSwarm``) training the default GPT
with ``bench network``'s batch (8 x 64), waits until all are
past step 5, then reads node 0's threads (``/proc/<pid>/task/*/schedstat``) and its p2pd's CPU
over ``SECONDS`` and prints ms of CPU per step of each. The environment is passed to the nodes
(and so to their p2pd), and ``NODE_ARGS`` is appended to each node's command line, so run it
alternating a setting, e.g. p2pd's garbage collector (or ``NODE_ARGS="--gossip-heartbeat-s 1"``):

    for i in 1 2; do for g in 100 400; do
      GOGC=$g python tools/swarm_cpu_ab.py /tmp/swarm-ab 15; done; done
"""

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from distronet.node.bench.network import DEFAULT_MODEL as BENCH_MODEL
from distronet.node.demo import LocalSwarm, write_run


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a node's p2pd)."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                st = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            if st[st.rindex(")") + 2 :].split()[1] == str(pid):
                out.append(int(p))
    return out


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid``, by thread id (``schedstat``: nanoseconds)."""
    task = Path(f"/proc/{pid}/task")
    return {int(t): int((task / t / "schedstat").read_text().split()[0]) / 1e9 for t in os.listdir(task)}


@contextlib.contextmanager
def loopback_swarm(folder: Path, run_id: str, extra: tuple[str, ...] = ()) -> Iterator[LocalSwarm]:
    """A coordinator and 4 nodes on loopback in an emptied ``folder``, training ``BENCH_MODEL``
    within bench network's budgets, all past step 5; stopped on exit."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run = write_run(folder, run_id, shards=20, model=BENCH_MODEL)
    with LocalSwarm(folder, run, run_id) as swarm:
        swarm.start_coordinator()
        for _ in range(4):
            swarm.start_node("--up", "4mbit", "--down", "20mbit", *extra, min_peers=4)
        swarm.wait_steps([0, 1, 2, 3], 5, timeout=240.0)
        yield swarm
        swarm.stop_all()


def cpu(pid: int) -> tuple[dict[int, float], float]:
    """(CPU seconds of each thread of ``pid`` by thread id, CPU seconds of its children)."""
    kids = 0.0
    for k in children(pid):
        try:
            rest = Path(f"/proc/{k}/stat").read_text()
        except OSError:
            continue
        fields = rest[rest.rindex(")") + 2 :].split()
        kids += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return thread_cpu(pid), kids


def main(folder: Path, seconds: float) -> None:
    extra = tuple(os.environ.get("NODE_ARGS", "").split())
    with loopback_swarm(folder, "cpuab", extra) as swarm:
        pid = swarm.nodes[0].pid
        s0, (t0, k0) = swarm.status(0)["step"], cpu(pid)
        time.sleep(seconds)
        s1, (t1, k1) = swarm.status(0)["step"], cpu(pid)
        steps = s1 - s0
        busy = sorted(((t1[t] - t0.get(t, 0.0)) * 1e3 / steps for t in t1), reverse=True)
        p2pd = (k1 - k0) * 1e3 / steps
        setting = f"GOGC={os.environ.get('GOGC', '-')} {' '.join(extra)}"
        print(
            f"{setting} steps {steps} ({steps / seconds:.2f}/s); ms CPU a step: "
            f"training thread {busy[0]:.1f}, event loop {busy[1]:.1f}, p2pd {p2pd:.1f}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
