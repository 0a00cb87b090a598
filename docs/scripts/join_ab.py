"""`bench network`'s join measurement, an older tree against this one, alternating (lead, session 11).

    git worktree add /tmp/old-tree <rev>
    .venv/bin/python docs/scripts/join_ab.py /tmp/old-tree /tmp/join-ab 3

Runs ``distro-node bench network --json --skip-shaped`` ``PAIRS`` times for each tree, old and new
alternating (the machine's speed drifts within minutes), each into its own emptied folder under
``WORK``, and prints each run's ``join_to_first_accept_s`` and the medians. The old tree runs from
this virtual environment through ``PYTHONPATH`` (a folder of links named ``distronet/<part>`` to
the old tree's top-level packages, found before the editable install's own mapping); its nodes,
coordinator and p2pd inherit that environment.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

PARTS = ("coordinator", "dashboard", "kernels", "node", "protocol")


def shim(old_tree: Path, work: Path) -> Path:
    """A folder whose ``distronet/<part>`` link to ``old_tree/<part>``."""
    root = work / "old-shim"
    shutil.rmtree(root, ignore_errors=True)
    (root / "distronet").mkdir(parents=True)
    for part in PARTS:
        (root / "distronet" / part).symlink_to(old_tree.resolve() / part)
    return root


def join_once(work: Path, env: dict[str, str]) -> float:
    shutil.rmtree(work, ignore_errors=True)
    cmd = [sys.executable, "-m", "distronet.node.cli", "bench", "network", "--json", "--skip-shaped"]
    out = subprocess.run(
        [*cmd, "--work-dir", str(work)], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise SystemExit(f"bench failed ({out.returncode}): {out.stderr[-2000:]}")
    doc = json.loads(out.stdout[out.stdout.index("{") :])
    return float(doc["join_to_first_accept_s"])


def main() -> None:
    old_tree, work, pairs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    old_env = {**os.environ, "PYTHONPATH": str(shim(old_tree, work))}
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(pairs):
        for name, env in (("old", old_env), ("new", dict(os.environ))):
            s = join_once(work / f"{name}{i}", env)
            seconds[name].append(s)
            print(f"{name} {i}: join_to_first_accept_s {s:.2f}", flush=True)
    for name, values in seconds.items():
        print(f"{name}: median {statistics.median(values):.2f} s of {values}")


if __name__ == "__main__":
    main()
