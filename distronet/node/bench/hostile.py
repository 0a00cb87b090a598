"""`distro-node bench hostile`: one hostile peer of eight, attack by attack, through the real code.

The engine is ``hostile_run`` (imported when the benchmark runs: torch stays out of other
commands). Prints a table, or with ``--json`` the rows: ``attack``, ``val_loss``,
``clean_val_loss``, ``plain_mean_val_loss`` (clean row), ``nonfinite_applied``,
``neutralised_at_step``, ``detected_at_step``, ``hostile_credit``, ``honest_credit`` (mean over
the honest peers), ``verify_cost_share`` and the ratios to the clean row. The workload (200
steps, lr decayed to zero, label noise 0.2) is chosen so that the final loss compares: a swarm
that shuts one peer out loses that peer's data, and the seven-honest reference row shows how
much (``hostile_run``'s docstring; docs/decisions/robust-aggregation.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from distronet.node.exitcodes import ExitCode

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench hostile`."""
    p = sub.add_parser("hostile", help="one hostile peer of eight, attack by attack: loss, credit, detection")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--quick", action="store_true", help="a short run (tests, < 30 s)")
    p.add_argument("--steps", type=int, default=None, help="steps per row (default 200)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run every attack's row and print them."""
    from distronet.node.bench.hostile_run import QUICK, HostileSetting, run_all

    s = QUICK if args.quick else HostileSetting()
    if args.steps:
        s = dataclasses.replace(s, steps=args.steps)
    rows = run_all(s)
    if args.json:
        print(json.dumps(rows, indent=1))
        return int(ExitCode.OK)
    for r in rows:
        print(
            f"{r['attack']:>18}  val {r['val_loss']:.4f} ({r['val_loss_ratio']:.3f}x)  "
            f"neutralised {r['neutralised_at_step']}  detected {r['detected_at_step']}  "
            f"hostile credit {r['hostile_credit']}  honest {r['honest_credit_ratio']:.3f}  "
            f"verify {100 * r['verify_cost_share']:.2f}%"
        )
    return int(ExitCode.OK)
