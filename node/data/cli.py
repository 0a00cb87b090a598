"""`distro-node data ...` sub-commands (slot; filled by the data/corpus work)."""

from __future__ import annotations

import argparse

from distronet.node.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node data`."""
    p = sub.add_parser("data", help="prepare token shards for a run")
    p.set_defaults(func=lambda _a: int(ExitCode.USAGE))
