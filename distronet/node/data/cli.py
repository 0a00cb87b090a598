"""`distro-node data prepare`: turn text files (or the built-in corpus) into token shards."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from distronet.node.data.corpus import code_documents, load_builtin_corpus
from distronet.node.data.documents import DEFAULT_MAX_RECORD_BYTES, InputFormat
from distronet.node.data.english import ENGLISH_DIR, english_documents, load_english_corpus
from distronet.node.data.errors import DataError
from distronet.node.data.manifest import Manifest
from distronet.node.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    TOKENIZER_FILE,
    TokenizerChoice,
    prepare_builtin,
    prepare_builtin_tokenized,
    prepare_files,
)
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
    vocab = f", vocabulary {m.vocab_size}, EOS {m.eos_id}" if m.vocab_size is not None else ""
    return f"{name}: {len(m.shards)} shards, {m.total_tokens:,} tokens ({m.tokenizer}, {m.dtype}{vocab})"


def _choice(args: argparse.Namespace) -> TokenizerChoice | None:
    """The real tokenizer asked for, or None for the byte tokenizer."""
    given = None if args.tokenizer in (None, "byte") else Path(args.tokenizer)
    if given is not None and args.train_tokenizer is not None:
        raise DataError("give --tokenizer FILE or --train-tokenizer VOCAB, not both")
    if given is None and args.train_tokenizer is None:
        if args.eos_id is not None:
            raise DataError("--eos-id needs --tokenizer FILE or --train-tokenizer VOCAB")
        return None
    return TokenizerChoice(path=given, train_vocab=args.train_tokenizer, eos_id=args.eos_id)


def _builtin(
    args: argparse.Namespace, choice: TokenizerChoice | None, progress: _ProgressLine | None
) -> None:
    out: Path = args.out
    if choice is not None:
        if args.builtin == "english":
            train_docs, val_docs = english_documents()
        else:
            train_docs, val_docs = code_documents()
        train, val = prepare_builtin_tokenized(
            train_docs, val_docs, out, choice, shard_tokens=args.shard_tokens
        )
        print(f"built-in {args.builtin} corpus: {len(train_docs)} + {len(val_docs)} documents")
        print(f"tokenizer: {out / TOKENIZER_FILE} (sha256 {train.tokenizer_sha256})")
    else:
        corpus = load_english_corpus() if args.builtin == "english" else load_builtin_corpus()
        train, val = prepare_builtin(corpus, out, shard_tokens=args.shard_tokens, progress=progress)
        if args.builtin == "english":
            print(f"built-in English corpus: {len(corpus.modules)} fortune files under {ENGLISH_DIR}")
        else:
            print(f"built-in corpus: {len(corpus.modules)} stdlib modules of Python {sys.version.split()[0]}")
    print(_summary(train, str(out / "manifest.json")))
    print(_summary(val, str(out / "validation.json")))


def _prepare(args: argparse.Namespace) -> int:
    out: Path = args.out
    if bool(args.builtin) == bool(args.inputs):
        print("distro-node data prepare: give INPUT files or --builtin (one of them)", file=sys.stderr)
        return int(ExitCode.USAGE)
    progress = None if args.quiet else _ProgressLine()
    try:
        choice = _choice(args)
        if args.builtin:
            _builtin(args, choice, progress)
        else:
            fmt = InputFormat(args.jsonl_field, args.parquet_column, args.max_record_bytes)
            manifest = prepare_files(
                args.inputs, out, shard_tokens=args.shard_tokens, progress=progress, tokenizer=choice, fmt=fmt
            )
            print(_summary(manifest, str(out / "manifest.json")))
            if manifest.tokenizer_sha256 is not None:
                print(f"tokenizer: {out / TOKENIZER_FILE} (sha256 {manifest.tokenizer_sha256})")
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
        "tokens and a manifest.json with each shard's sha256 and token count. By default one token is one "
        "byte (uint8). With --tokenizer FILE or --train-tokenizer VOCAB each text file, JSONL record and "
        "Parquet row is a document, encoded and followed by the EOS id, stored as uint16 (vocabulary up to "
        "65,536) or uint32, with the tokenizer copied beside the shards as tokenizer.json.",
    )
    prep.add_argument(
        "inputs",
        nargs="*",
        type=Path,
        metavar="INPUT",
        help="text, .jsonl/.ndjson or .parquet files, or folders",
    )
    prep.add_argument(
        "--builtin",
        nargs="?",
        const="code",
        choices=["code", "english"],
        help="prepare a built-in corpus instead: code (default: the standard library's source) or english "
        "(Debian's fortunes package: apt-get install fortunes)",
    )
    prep.add_argument("--out", type=Path, required=True, help="output folder (created)")
    prep.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard")
    prep.add_argument(
        "--tokenizer",
        default="byte",
        metavar="FILE",
        help="a Hugging Face tokenizers JSON file (tokenizer.json); default byte: 1 token per byte",
    )
    prep.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB",
        help="train a byte-level BPE of VOCAB ids on the inputs first (deterministic; EOS <|endoftext|>)",
    )
    prep.add_argument(
        "--eos-id", type=int, help="token id put between documents (default: the tokenizer's EOS token)"
    )
    prep.add_argument("--jsonl-field", default="text", help="the text field of JSONL records (default text)")
    prep.add_argument(
        "--parquet-column", default="text", help="the text column of Parquet files (default text)"
    )
    prep.add_argument(
        "--max-record-bytes",
        type=int,
        default=DEFAULT_MAX_RECORD_BYTES,
        help="largest document: a text file, JSONL line or Parquet value (default 32 MiB)",
    )
    prep.add_argument("--quiet", action="store_true", help="no progress line")
    prep.set_defaults(func=_prepare)
