"""`distro-node bench converge` (slot; not built yet)."""

from __future__ import annotations

import argparse
import sys

from distronet.node.exitcodes import ExitCode


def _not_built(_args: argparse.Namespace) -> int:
    print("distro-node bench converge: not built yet", file=sys.stderr)
    return int(ExitCode.USAGE)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench converge`."""
    p = sub.add_parser("converge", help="(not built yet)")
    p.set_defaults(func=_not_built)
