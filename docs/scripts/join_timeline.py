"""Where a newcomer's join time goes: `bench network`'s join run, the newcomer logging at info (lead, session 11).

    git worktree add /tmp/old-tree <rev>
    .venv/bin/python docs/scripts/join_timeline.py /tmp/join-tl 3 [/tmp/old-tree]

As ``network_run.join_to_first_accept`` (3 nodes of the default GPT training on loopback, then a
newcomer), ``PAIRS`` times; with an old tree, old and new alternate (the old one through
``PYTHONPATH``, see ``join_ab.py``). For each run it prints the seconds from starting the
newcomer's process to each of its log lines below, and to the first round a peer applied with its
packet (the bench's figure, polled every 50 ms as the bench does).
"""

import datetime as dt
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from join_ab import shim

from distronet.node.bench.network import DEFAULT_MODEL
from distronet.node.demo import LocalSwarm, write_run

MARKS = {  # first log line containing ... -> its name
    "starting: run": "first log line (imports done)",
    "p2pd up": "p2pd up",
    "computing on": "model built",
    "peer(s) in the mesh": "in the mesh",
    "replayed rounds": "replay done",
}


def _stamp(line: str) -> float | None:
    try:
        return dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def timeline(folder: Path, env: dict[str, str]) -> dict[str, float]:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run = write_run(
        folder, "joinbench", model=DEFAULT_MODEL, round_deadline_s=0.5
    )  # bench network's --join-deadline-s
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # LocalSwarm's processes inherit it
    try:
        with LocalSwarm(folder, run, "joinbench") as swarm:
            swarm.start_coordinator()
            for _ in range(3):
                swarm.start_node(min_peers=3)
            swarm.wait_steps([0, 1, 2], 2, timeout=240.0)
            old = {swarm.status(i).get("peer_id") for i in range(3)}
            t0 = time.time()
            swarm.start_node("--log-level", "info")
            out: dict[str, float] = {}
            while time.time() < t0 + 120 and "first accepted" not in out:
                for i in range(3):
                    for producers in swarm.status(i).get("accepted", {}).values():
                        if any(p not in old for p in producers):
                            out["first accepted"] = time.time() - t0
                time.sleep(0.05)
            swarm.stop_all()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    for line in (folder / "node3.log").read_text(errors="replace").splitlines():
        t = _stamp(line)
        for key, name in MARKS.items():
            if t is not None and key in line and name not in out:
                out[name] = t - t0
    return out


def main() -> None:
    work, pairs = Path(sys.argv[1]), int(sys.argv[2])
    trees = {"new": dict(os.environ)}
    if len(sys.argv) > 3:
        trees = {"old": {**os.environ, "PYTHONPATH": str(shim(Path(sys.argv[3]), work))}, **trees}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(pairs):
        for name, env in trees.items():
            tl = timeline(work / f"{name}{i}", env)
            runs[name].append(tl)
            print(
                name,
                i,
                " ".join(f"{k}={v:.2f}" for k, v in sorted(tl.items(), key=lambda kv: kv[1])),
                flush=True,
            )
    for name, tls in runs.items():
        keys = sorted(
            {k for tl in tls for k in tl}, key=lambda k: statistics.median(tl.get(k, 0) for tl in tls)
        )
        print(
            name,
            "medians:",
            ", ".join(f"{k} {statistics.median(tl[k] for tl in tls if k in tl):.2f}" for k in keys),
        )


if __name__ == "__main__":
    main()
