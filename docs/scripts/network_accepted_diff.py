"""Diff the accepted sets of a shaped `bench network` run's nodes, round by round.

Usage: ``.venv/bin/python docs/scripts/network_accepted_diff.py WORK_DIR/shaped [N]`` (N nodes,
default 4). Prints each round common to all nodes whose accepted sets differ (last 4 characters
of each producer's id), then the count of common rounds, differing rounds and the steps at which
the parameter digests differ. Reads only the status files (``nodeI/status.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: Path, n: int) -> int:
    st = [json.loads((folder / f"node{i}" / "status.json").read_text()) for i in range(n)]
    print("nodes", [s["peer_id"][-4:] for s in st], "steps", [s["step"] for s in st],
          "resyncs", [s.get("resyncs") for s in st])  # fmt: skip
    acc = [s["accepted"] for s in st]
    dig = [s["digests"] for s in st]
    common = sorted(set.intersection(*[set(a) for a in acc]), key=int)
    differing = 0
    for k in common:
        row = [tuple(sorted(p[-4:] for p in a[k])) for a in acc]
        if len(set(row)) > 1:
            differing += 1
            print("DIFF round", k, row)
    steps = sorted(set.intersection(*[set(d) for d in dig]), key=int)
    bad = [k for k in steps if len({d[k] for d in dig}) > 1]
    summary = f"rounds common {len(common)}, differing {differing}; "
    print(summary + f"digest steps common {len(steps)}, differing {bad}")
    return 1 if differing or bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 4))
