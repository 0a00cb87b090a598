"""`distro-node`: the volunteer's command line.

Sub-commands live one level down; each module exposes ``add_parser(subparsers)`` which registers
its parser and sets ``func`` to a callable ``(argparse.Namespace) -> int`` returning an exit code.
This file is only the table of contents. It sets no environment: the node's process tuning
(``GOMP_SPINCOUNT`` for torch, ``GOGC`` for p2pd, the event loop) is ``NodeConfig`` fields,
applied by ``join`` where torch loads and p2pd starts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from distronet.node.exitcodes import ExitCode

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The full `distro-node` parser, every sub-command registered."""
    from distronet.node import export, join, relay
    from distronet.node.bench import cli as bench_cli
    from distronet.node.data import cli as data_cli
    from distronet.node.doctor import cli as doctor_cli

    parser = argparse.ArgumentParser(
        prog="distro-node",
        description="Donate a GPU, an Apple laptop or a CPU to train one shared model.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    join.add_parser(sub)
    data_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    export.add_parser(sub)
    doctor_cli.add_parser(sub)
    relay.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `distro-node` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
