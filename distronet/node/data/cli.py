"""`distro-node data prepare`: turn text files (or the built-in corpus) into token shards."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from distronet.node.data.corpus import load_builtin_corpus
from distronet.node.data.errors import DataError
from distronet.node.data.manifest import Manifest
from distronet.node.data.prepare import DEFAULT_SHARD_TOKENS, prepare_builtin, prepare_files
from distronet.node.exitcodes import ExitCode

__all__ = ["add_parser"]


class _ProgressLine:
    """Prints 'prepared X of Y MB (p %)' to stderr at most every half second, and at the end."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.5:
            return
        self.last = now
        pct = 100.0 * done / total if total else 100.0
        end = "\n" if done >= total else ""
        print(f"\rprepared {done / 1e6:.1f} of {total / 1e6:.1f} MB ({pct:.0f} %)", end=end, file=sys.stderr)


def _summary(m: Manifest, name: str) -> str:
    return f"{name}: {len(m.shards)} shards, {m.total_tokens:,} tokens ({m.tokenizer}, {m.dtype})"


def _prepare(args: argparse.Namespace) -> int:
    out: Path = args.out
    if args.builtin == bool(args.inputs):
        print("distro-node data prepare: give INPUT files or --builtin (one of them)", file=sys.stderr)
        return int(ExitCode.USAGE)
    progress = None if args.quiet else _ProgressLine()
    try:
        if args.builtin:
            corpus = load_builtin_corpus()
            train, val = prepare_builtin(corpus, out, shard_tokens=args.shard_tokens, progress=progress)
            print(f"built-in corpus: {len(corpus.modules)} stdlib modules of Python {sys.version.split()[0]}")
            print(_summary(train, str(out / "manifest.json")))
            print(_summary(val, str(out / "validation.json")))
        else:
            manifest = prepare_files(args.inputs, out, shard_tokens=args.shard_tokens, progress=progress)
            print(_summary(manifest, str(out / "manifest.json")))
    except (DataError, OSError) as exc:
        print(f"distro-node data prepare: {exc}", file=sys.stderr)
        return int(ExitCode.ERROR)
    return int(ExitCode.OK)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node data` and `distro-node data prepare`."""
    p = sub.add_parser("data", help="prepare token shards for a run")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prep = dsub.add_parser(
        "prepare",
        help="turn text files into token shards plus a manifest",
        description="Tokenize INPUT files (folders: every file under them, sorted) into shard files of raw "
        "tokens (uint8 for the byte tokenizer) and a manifest.json with each shard's sha256 and token count.",
    )
    prep.add_argument("inputs", nargs="*", type=Path, metavar="INPUT", help="text files or folders")
    prep.add_argument("--builtin", action="store_true", help="prepare the built-in stdlib corpus instead")
    prep.add_argument("--out", type=Path, required=True, help="output folder (created)")
    prep.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    prep.add_argument(
        "--tokenizer", choices=["byte"], default="byte", help="tokenizer (byte: 1 token per byte)"
    )
    prep.add_argument("--quiet", action="store_true", help="no progress line")
    prep.set_defaults(func=_prepare)
