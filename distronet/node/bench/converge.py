"""`distro-node bench converge`: validation loss and upload per step, optimizer against optimizer.

Runs every row (``converge_rows.ROWS``: AdamW with dense all-reduce, the DeMo reference, our
configurations) from the same initial weights, on the same tokens in the same order, and
prints the validation loss on the same held-out windows, the upload per peer per step as on
the wire and its ratio to a fp32 ring all-reduce, the lr of each row and its seconds.

``--model gpt`` (the default) trains the built-in GPT on the code corpus (bytes); ``--model
llama`` a Llama-architecture Hugging Face model (``arch = "hf"``, 6x the GPT's parameters) on
the English corpus (Debian's ``fortunes``) with a 4,096-token BPE trained by ``data prepare``'s
code, cached in ``--work-dir``; its rows use the GPT's defaults unchanged.

``--sweep`` runs each row's lr grid (the same number of runs for every row), prints the grid
and records the winners in ``converge_defaults.json``, which later runs use as defaults
(``--quick`` sweeps are never recorded; a Llama sweep is recorded apart and changes no
default). Rows run in ``--jobs`` worker processes of
``--threads`` torch threads each; a row's result does not depend on which worker ran it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distronet.node.bench.converge_rows import (
    ROWS,
    RowSpec,
    default_lrs,
    resolve_rows,
    sweep_grid,
    write_defaults,
)
from distronet.node.exitcodes import ExitCode
from distronet.protocol.errors import DistroError

if TYPE_CHECKING:  # converge_train imports torch: only when a benchmark runs, not for `distro-node join`
    from distronet.node.bench.converge_train import BenchSetting, RowResult

__all__ = ["add_parser", "format_table", "run_jobs"]

Job = tuple[str, float]
Overrides = dict[str, dict[str, Any]]


def _work(name: str, lr: float, setting: BenchSetting, threads: int, overrides: Overrides) -> RowResult:
    from distronet.node.bench.converge_train import run_row

    return run_row(ROWS[name], lr, setting, threads=threads, overrides=overrides.get(name))


def run_jobs(
    jobs: Sequence[Job],
    setting: BenchSetting,
    workers: int,
    threads: int,
    quiet: bool,
    overrides: Overrides | None = None,
) -> list[RowResult]:
    """Run (row, lr) jobs, ``workers`` at a time in child processes (1: in this process), in job order.

    ``overrides`` maps a row name to preset fields to change (``--set``).
    """
    overrides = overrides or {}
    results: dict[int, RowResult] = {}

    def done(i: int, r: RowResult) -> None:
        results[i] = r
        if not quiet:
            print(
                f"[{len(results)}/{len(jobs)}] {r.config} lr={r.lr:g}: "
                f"val {r.val_loss:.4f} ({r.seconds:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

    if workers <= 1:
        for i, (name, lr) in enumerate(jobs):
            done(i, _work(name, lr, setting, threads, overrides))
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork: torch's thread pools do not survive one
        # longest first (a distro row costs ~3x an AdamW row): the workers finish close together
        order = sorted(range(len(jobs)), key=lambda i: ROWS[jobs[i][0]].kind == "adamw")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {
                pool.submit(_work, jobs[i][0], jobs[i][1], setting, threads, overrides): i for i in order
            }
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
    return [results[i] for i in range(len(jobs))]


def format_table(rows: Sequence[RowResult], setting: BenchSetting) -> str:
    """The human-readable result table (markdown)."""
    from distronet.node.bench.converge_train import ring_allreduce_bytes

    base = next((r.val_loss for r in rows if r.config == "adamw"), None)
    ring = ring_allreduce_bytes(rows[0].parameters, setting.peers) if rows else 0.0
    shape = setting.llama
    what = "GPT" if shape is None else f"Llama (vocab {shape.vocab} BPE)"
    lines = [
        f"{setting.peers} peers, {setting.steps} steps, batch {setting.batch}x{setting.seq_len} per peer, "
        f"{what} {rows[0].parameters if rows else 0:,} parameters; "
        f"fp32 ring all-reduce = {ring:,.0f} B/peer/step",
        "",
        "| config | lr | val loss | vs AdamW | upload B/peer/step | x less than ring "
        "| replicas equal | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rel = f"{r.val_loss / base:.3f}x" if base else "-"
        label = r.config + (
            " [" + ", ".join(f"{k}={v}" for k, v in r.overrides.items()) + "]" if r.overrides else ""
        )
        lines.append(
            f"| {label} | {r.lr:g} | {r.val_loss:.4f} | {rel} | {r.upload_bytes_per_step:,.0f} | "
            f"{r.compression_vs_ring_allreduce:,.1f} | {'yes' if r.replicas_identical else 'NO'} "
            f"| {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def _sweep_table(results: Sequence[RowResult]) -> str:
    lines = ["| config | lr | val loss |", "|---|---|---|"]
    best: dict[str, float] = {}
    for r in results:
        best[r.config] = min(best.get(r.config, float("inf")), r.val_loss)
    for r in results:
        mark = " (best)" if r.val_loss == best[r.config] else ""
        lines.append(f"| {r.config} | {r.lr:g} | {r.val_loss:.4f}{mark} |")
    return "\n".join(lines)


def _setting(args: argparse.Namespace) -> BenchSetting:
    from distronet.node.bench.converge_train import LLAMA, QUICK, QUICK_LLAMA, STANDARD

    if args.model == "llama":
        base = QUICK_LLAMA if args.quick else LLAMA
    else:
        base = QUICK if args.quick else STANDARD
    changes: dict[str, Any] = {
        k: v for k, v in (("peers", args.peers), ("steps", args.steps), ("batch", args.batch)) if v
    }
    if args.seq_len:
        changes["seq_len"] = args.seq_len
    if args.work_dir:
        changes["work_dir"] = str(args.work_dir)
    s = dataclasses.replace(base, **changes)
    if s.peers < 1 or s.steps < 1 or s.batch < 1 or not 1 <= s.seq_len <= s.context:
        raise DistroError(f"need peers, steps, batch >= 1 and 1 <= seq-len <= {s.context}")
    return s


def _lr_overrides(items: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError as exc:
            raise DistroError(f"--lr wants NAME=VALUE, got {item!r}") from exc
    return out


def _field_overrides(items: Sequence[str]) -> Overrides:
    """``ROW.FIELD=VALUE`` items → {row: {field: value}}; VALUE is JSON where it parses, else a string."""
    out: Overrides = {}
    for item in items:
        key, eq, raw = item.partition("=")
        row, dot, fld = key.partition(".")
        if not (eq and dot and row in ROWS and fld) or ROWS[row].kind != "distro":
            raise DistroError(f"--set wants DISTRO_ROW.FIELD=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(row, {})[fld] = value
    return out


def _run(args: argparse.Namespace) -> int:
    try:
        setting = _setting(args)
        specs: list[RowSpec] = resolve_rows(args.configs)
        lrs = {**default_lrs(), **_lr_overrides(args.lr)}
        overrides = _field_overrides(args.set)
    except DistroError as exc:
        print(f"distro-node bench converge: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    if setting.llama is not None:
        try:  # train the BPE and encode once, here, before the workers read the cache
            from distronet.node.bench.converge_llama import english_tokens

            english_tokens(setting.llama.vocab, setting.cache_dir())
        except DistroError as exc:
            print(f"distro-node bench converge: {exc}", file=sys.stderr)
            return int(ExitCode.ERROR)
    if args.sweep:
        jobs = [(s.name, lr) for s in specs for lr in sweep_grid(s, setting.model_name, lrs[s.name])]
    else:
        jobs = [(s.name, lrs[s.name]) for s in specs]
    workers = max(1, min(args.jobs, len(jobs)))
    results = run_jobs(jobs, setting, workers, args.threads, quiet=args.json, overrides=overrides)
    rows = results
    if args.sweep:
        winners = {
            s.name: min((r for r in results if r.config == s.name), key=lambda r: r.val_loss) for s in specs
        }
        rows = [winners[s.name] for s in specs]
        if not args.quick:
            table = {s.name: {f"{r.lr:g}": r.val_loss for r in results if r.config == s.name} for s in specs}
            won = {n: r.lr for n, r in winners.items()}
            write_defaults(won, table, setting.to_json(), model=setting.model_name)
    if args.json:
        objs = [{**r.to_json(), "winner": r in rows} if args.sweep else r.to_json() for r in results]
        print(json.dumps(objs, indent=1))
    else:
        if args.sweep:
            print(_sweep_table(results) + "\n")
        print(format_table(rows, setting))
    return int(ExitCode.OK)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench converge`."""
    p = sub.add_parser(
        "converge",
        help="validation loss and upload per step: AdamW vs DeMo vs ours",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        choices=["gpt", "llama"],
        default="gpt",
        help="gpt: the built-in GPT on the code corpus (default); llama: a 5.3M-parameter Llama on English",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where --model llama caches its BPE and tokens (default ~/.cache/distro-node/bench-converge)",
    )
    p.add_argument("--peers", type=int, default=0, help="simulated peers (default 4; --quick 2)")
    p.add_argument(
        "--steps", type=int, default=0, help="training steps (default 600, llama 300; --quick 40, llama 20)"
    )
    p.add_argument("--batch", type=int, default=0, help="windows per peer per step (default 4)")
    p.add_argument("--seq-len", type=int, default=0, help="tokens per window (default 128; --quick 64)")
    p.add_argument("--configs", nargs="+", metavar="NAME", help=f"rows to run (known: {', '.join(ROWS)})")
    p.add_argument("--lr", nargs="*", default=[], metavar="NAME=LR", help="override a row's learning rate")
    p.add_argument(
        "--set", nargs="*", default=[], metavar="ROW.FIELD=VALUE", help="change a distro row's preset field"
    )
    p.add_argument("--sweep", action="store_true", help="run each row's lr grid and record the winners")
    p.add_argument("--quick", action="store_true", help="tiny model, few steps (CI smoke run, < 2 minutes)")
    p.add_argument("--json", action="store_true", help="print a JSON list of row objects")
    p.add_argument("--jobs", type=int, default=2, help="rows run in parallel worker processes (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.set_defaults(func=_run)
