"""`distro-node join <run-id>` (slot; the daemon is not built yet)."""

from __future__ import annotations

import argparse
import sys

from distronet.node.exitcodes import ExitCode


def _not_built(_args: argparse.Namespace) -> int:
    print("distro-node join: the node daemon is not built yet", file=sys.stderr)
    return int(ExitCode.USAGE)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node join`."""
    p = sub.add_parser("join", help="join a training run (not built yet)")
    p.add_argument("run_id")
    p.set_defaults(func=_not_built)
