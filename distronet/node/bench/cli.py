"""`distro-node bench ...`: benchmarks a volunteer can also run as a "can my machine keep up?" check.

Each benchmark module exposes ``add_parser(subparsers)``; this file only lists them.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench` and its sub-commands."""
    from distronet.node.bench import codec, converge, coordinator, hostile, nat, network

    p = sub.add_parser("bench", help="run a benchmark")
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    codec.add_parser(bsub)
    converge.add_parser(bsub)
    coordinator.add_parser(bsub)
    hostile.add_parser(bsub)
    nat.add_parser(bsub)
    network.add_parser(bsub)
