"""`distro-node`: the volunteer's command line.

Sub-commands live one level down; each module exposes ``add_parser(subparsers)`` which registers
its parser and sets ``func`` to a callable ``(argparse.Namespace) -> int`` returning an exit code.
This file is only the table of contents.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from distronet.node.exitcodes import ExitCode

__all__ = ["GOGC", "GOMP_SPINCOUNT", "build_parser", "main"]

GOMP_SPINCOUNT = "20000"
"""How long torch's OpenMP workers (GNU libgomp in the pip wheels) spin after a parallel region
before they sleep. libgomp's default (300,000 spins, several ms) keeps the second core busy
after every inverse DCT and matmul, starving the threads that open frames, the event loop and
p2pd; 20,000 hands the core back within ~0.1 ms while still catching back-to-back regions.
Side by side (docs/decisions/gomp-spincount.md): GPT k=32 decode 16/1 2.0-2.4 instead of
2.2-2.9 and the one-packet decode 3.4-3.9 ms instead of 4.7-5.2 ms; a training step unchanged
within noise. Set before torch loads (libgomp reads it once); a value in the environment wins."""

GOGC = "400"
"""Go's garbage-collector target for p2pd (started by the node, it inherits our environment):
its small heap is collected a quarter as often as with Go's default (100), ~1 ms less CPU a step
in a 4-node swarm (docs/decisions/gogc.md). A value in the environment wins."""


def build_parser() -> argparse.ArgumentParser:
    """The full `distro-node` parser, every sub-command registered."""
    from distronet.node import join
    from distronet.node.bench import cli as bench_cli
    from distronet.node.data import cli as data_cli

    parser = argparse.ArgumentParser(
        prog="distro-node",
        description="Donate a GPU, an Apple laptop or a CPU to train one shared model.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    join.add_parser(sub)
    data_cli.add_parser(sub)
    bench_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `distro-node` console script; returns the process exit code."""
    os.environ.setdefault("GOMP_SPINCOUNT", GOMP_SPINCOUNT)  # before any sub-command loads torch
    os.environ.setdefault("GOGC", GOGC)  # before the node starts p2pd
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    sys.exit(main())
