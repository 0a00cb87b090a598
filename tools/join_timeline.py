"""Where a newcomer's join time goes, phase by phase.

    python tools/join_timeline.py WORK_DIR RUNS [OLD_TREE]

Runs ``network_run.join_to_first_accept`` (``bench network``'s join run: 3 nodes of the default
GPT training on loopback, then a newcomer at ``--log-level info``) ``RUNS`` times and prints, for
each run, the seconds from starting the newcomer's process to each of its log lines in ``MARKS``
and to the first round a peer applied with its packet (the bench's ``join_to_first_accept_s``),
then the medians. With ``OLD_TREE`` (a checkout of another commit, e.g. ``git worktree add
/tmp/old REV``) old and new alternate, the old one first on ``PYTHONPATH``.
"""

import datetime as dt
import os
import shutil
import statistics
import sys
from pathlib import Path

from distronet.node.bench.network import DEFAULT_MODEL
from distronet.node.bench.network_run import join_to_first_accept

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
    """One join run in an emptied ``folder`` with ``env`` as the swarm's environment."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the swarm's processes inherit it
    try:  # round deadline as bench network's --join-deadline-s default
        joined = join_to_first_accept(
            folder, model=DEFAULT_MODEL, peers=3, round_deadline_s=0.5, newcomer_args=("--log-level", "info")
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = {"first accepted": joined.seconds}
    for line in (folder / "node3.log").read_text(errors="replace").splitlines():
        t = _stamp(line)
        for key, name in MARKS.items():
            if t is not None and key in line and name not in out:
                out[name] = t - joined.started_unix
    return out


def main() -> None:
    work, runs_wanted = Path(sys.argv[1]), int(sys.argv[2])
    trees = {"new": dict(os.environ)}
    if len(sys.argv) > 3:
        trees = {"old": {**os.environ, "PYTHONPATH": str(Path(sys.argv[3]).resolve())}, **trees}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for i in range(runs_wanted):
        for name, env in trees.items():
            tl = timeline(work / f"{name}{i}", env)
            runs[name].append(tl)
            phases = " ".join(f"{k}={v:.2f}" for k, v in sorted(tl.items(), key=lambda kv: kv[1]))
            print(name, i, phases, flush=True)
    for name, tls in runs.items():
        keys = sorted(
            {k for tl in tls for k in tl}, key=lambda k: statistics.median(tl.get(k, 0) for tl in tls)
        )
        medians = ", ".join(f"{k} {statistics.median(tl[k] for tl in tls if k in tl):.2f}" for k in keys)
        print(name, "medians:", medians)


if __name__ == "__main__":
    main()
