"""`distro-node bench coordinator` (slot; not built yet)."""

from __future__ import annotations

import argparse
import sys

from distronet.node.exitcodes import ExitCode


def _not_built(_args: argparse.Namespace) -> int:
    print("distro-node bench coordinator: not built yet", file=sys.stderr)
    return int(ExitCode.USAGE)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench coordinator`."""
    p = sub.add_parser("coordinator", help="(not built yet)")
    p.set_defaults(func=_not_built)
