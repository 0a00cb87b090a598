"""`distro-coordinator`: the run's lightweight coordinator service (slot; not built yet)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `distro-coordinator` console script."""
    parser = argparse.ArgumentParser(prog="distro-coordinator")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="serve the coordinator API (not built yet)")
    parser.parse_args(argv)
    print("distro-coordinator: not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
