"""`distro-node bench network`: step rate on shaped links against compute alone; time to join.

Three measurements in one run (:mod:`distronet.node.bench.network_run`):

1. **compute-only**: ``--nodes`` processes train the run's model side by side with no network
   (same model, optimizer, overlap and one torch thread each), before and after each run of
   step 2; the median step rate of all of them. The processes time the same window (a barrier after
   their warm-up; each keeps training until all are done), as the swarm's nodes do.
2. **shaped**: ``--nodes`` real ``distro-node join`` processes, each in its own network
   namespace on a veth shaped with tc (``--link-up``/``--link-down``, netem delay where the
   kernel has it), with budgets ``--up``/``--down`` and overlap on; each node's step rate over
   ``--steps`` steps after ``--warmup``, and the busiest 10 s window of bytes counted by the
   kernel on each veth against the budget. Needs root, ``ip`` and ``tc``. ``--repeats`` swarm
   runs (default 3), each between two compute-only runs: a run's fraction is its nodes' median
   rate over the compute-only runs just before and after it (this machine's speed drifts by
   10-20 % within a minute), measured only when every node's rate was (``swarm_fraction``);
   ``fraction_of_compute_rate`` is the median of the runs' fractions (``repeats_fraction``).
3. **join**: on loopback, the default model, ``--nodes - 1`` nodes training; seconds from
   starting a newcomer's ``distro-node join`` until a peer applies a round that accepted its
   packet.

Targets (issue 5): ``fraction_of_compute_rate`` ≥ 0.85, ``join_to_first_accept_s`` ≤ 10,
``max_budget_overshoot`` ≤ 0.05 (busiest window / budget − 1; negative = headroom).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distronet.node.exitcodes import ExitCode

__all__ = ["DEFAULT_MODEL", "add_parser", "repeats_fraction", "run", "swarm_fraction"]

DEFAULT_MODEL: dict[str, Any] = {"arch": "gpt", "seed": 0, "batch": 8, "seq_len": 64}
QUICK_MODEL: dict[str, Any] = {
    "arch": "gpt", "depth": 2, "width": 32, "heads": 4, "context": 64, "seed": 1, "batch": 8, "seq_len": 64,
}  # fmt: skip
CPU_PARTS = ("train", "optimizer", "loop", "other", "p2pd")
YES_NO: dict[Any, str] = {True: "yes", False: "NO"}
TARGETS = {"fraction_of_compute_rate": 0.85, "join_to_first_accept_s": 10.0, "max_budget_overshoot": 0.05}


def _warm_compiled_decoder() -> None:
    """Fill numba's on-disk cache of the payload decoder in a throwaway process first: after a
    change to ``kernels`` each node's ``warm-decoder`` thread would otherwise compile it (~10-40
    CPU-s) while its steps are being timed. Failures are ignored (the nodes then warm it)."""
    code = "from distronet.node.daemon.parts import warm_compiled_decoder; warm_compiled_decoder()"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([sys.executable, "-c", code], timeout=300, check=False, capture_output=True)


def _fresh(folder: Path) -> Path:
    """``folder``, emptied: nodes started in a folder of an earlier run would resume from its
    checkpoints (their steps jump, and nothing is timed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from distronet.node.bench.netns import LinkShape, missing_requirements
    from distronet.node.bench.network_run import compute_only, join_to_first_accept, median, shaped_swarm

    model = QUICK_MODEL if args.quick else DEFAULT_MODEL
    optimizer = {"preset": args.preset, "overlap": True}
    exchange = {
        "round_deadline_s": args.round_deadline_s, "manifest_grace_s": 0.2, "manifest_wait_s": 1.5,
        "pull_timeout_s": 10.0, "retention": 32,
    }  # fmt: skip
    out: dict[str, Any] = {"nodes": args.nodes, "up": args.up, "down": args.down, "model": model}
    out.update(optimizer=optimizer, exchange=exchange, link_up=args.link_up, link_down=args.link_down)
    why_not = missing_requirements()
    _warm_compiled_decoder()
    if why_not is None and not args.skip_shaped:
        cw = min(3, args.warmup)
        computes = [compute_only(model, optimizer, n=args.nodes, steps=args.steps, warmup=cw)]
        runs = []
        for r in range(args.repeats):  # compute, swarm, compute, swarm, ..., compute
            runs.append(shaped_swarm(
                _fresh(tmp / ("shaped" if r == 0 else f"shaped{r}")), n=args.nodes,
                link=LinkShape(args.link_up, args.link_down, args.delay_ms), up=args.up, down=args.down,
                model=model, optimizer=optimizer, exchange=exchange, warmup=args.warmup, steps=args.steps,
            ))  # fmt: skip
            computes.append(compute_only(model, optimizer, n=args.nodes, steps=args.steps, warmup=cw))
        every = [c for cs in computes for c in cs]
        # each swarm run against the compute-only runs just before and after it (the machine drifts)
        fractions = [
            swarm_fraction(run.rates, median([c.rate for c in computes[i] + computes[i + 1]]))
            for i, run in enumerate(runs)
        ]
        rates = [x for run in runs for x in run.rates]
        cpu = [c for run in runs for c in run.cpu]
        out.update(
            compute_steps_per_s=median([c.rate for c in every]),
            compute_steps_per_s_each_run=[median([c.rate for c in cs]) for cs in computes],
            compute_cpu_s_per_step=median([c.cpu_s_per_step for c in every]),
            compute_optimizer_cpu_s_per_step=median([c.optimizer_cpu_s_per_step for c in every]),
            shaped_cpu_s_per_step=median([x for run in runs for x in run.cpu_s_per_step]),
            shaped_cpu_split={k: median([getattr(c, k) for c in cpu]) for k in CPU_PARTS},
            shaped_steps_per_s=median(rates),
            shaped_steps_per_s_per_node=[run.rates for run in runs],
            resyncs_while_timed=[run.resyncs for run in runs],
            fraction_per_repeat=fractions,
            fraction_of_compute_rate=repeats_fraction(fractions),
            shaped_nodes_measured=sum(math.isfinite(r) for r in rates),
            max_budget_overshoot=max(x for run in runs for x in run.up_ratio + run.down_ratio) - 1.0,
            budget_ratio_up=[run.up_ratio for run in runs],
            budget_ratio_down=[run.down_ratio for run in runs],
            delay_applied=all(run.delay_applied for run in runs),
            replicas_identical=all(run.identical for run in runs),
        )
    else:
        out.update(fraction_of_compute_rate=None, max_budget_overshoot=None)
        out["shaped_skipped"] = why_not or "--skip-shaped"
    if args.skip_join:
        out["join_to_first_accept_s"] = None
    else:
        joined = join_to_first_accept(
            _fresh(tmp / "join"), model=model, peers=max(1, args.nodes - 1),
            round_deadline_s=args.join_deadline_s,
        )  # fmt: skip
        out.update(join_to_first_accept_s=joined.seconds, join_first_accepted_step=joined.first_step)
    return out


def swarm_fraction(rates: list[float], compute_rate: float) -> float | None:
    """The swarm's median step rate over ``compute_rate``; None unless every node's rate was
    measured. A node that started late (the others' timed window was over when it began) or
    jumped by a resync has no rate, and the median of the others would not be a swarm's rate."""
    if not rates or not all(math.isfinite(r) for r in rates) or not compute_rate > 0:
        return None
    return statistics.median(rates) / compute_rate


def repeats_fraction(fractions: list[float | None]) -> float | None:
    """The median of the repeats' fractions that were measured (``swarm_fraction``); None when
    none was."""
    got = [f for f in fractions if f is not None]
    return statistics.median(got) if got else None


def _no_nan(value: Any) -> Any:
    """``value`` with every NaN float replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _verdict(key: str, value: Any) -> str:
    if value is None:
        return "not measured"
    good = value >= TARGETS[key] if key == "fraction_of_compute_rate" else value <= TARGETS[key]
    return "met" if good else "NOT met"


def _list(values: list[Any], spec: str) -> str:
    """``a, b, c``; a list of per-run lists as ``a, b | c, d``."""
    if values and all(isinstance(v, list) for v in values):
        return " | ".join(_list(v, spec) for v in values)
    return ", ".join(_fmt(v, spec) for v in values) or "-"


def _cpu_split(r: dict[str, Any]) -> str:
    c = r.get("shaped_cpu_split")
    if not c:
        return "-"
    return (f"{_fmt(c['train'], '.3f')} ({_fmt(c['optimizer'], '.3f')}) / {_fmt(c['loop'], '.3f')} / "
            f"{_fmt(c['other'], '.3f')} / {_fmt(c['p2pd'], '.3f')}")  # fmt: skip


def _table(r: dict[str, Any]) -> str:
    frac, over, join = r["fraction_of_compute_rate"], r["max_budget_overshoot"], r["join_to_first_accept_s"]
    compute, shaped = r.get("compute_steps_per_s"), r.get("shaped_steps_per_s")
    rows = [
        ("compute-only steps/s (median; each run, in order)",
         f"{_fmt(compute, '.3f')} ({_list(r.get('compute_steps_per_s_each_run', []), '.3f')})"),
        ("shaped steps/s (median; per node | per swarm run)",
         f"{_fmt(shaped, '.3f')} ({_list(r.get('shaped_steps_per_s_per_node', []), '.3f')})"),
        ("fraction of compute rate, each swarm run", _list(r.get("fraction_per_repeat", []), ".3f")),
        ("fraction_of_compute_rate (>= 0.85; their median)",
         f"{_fmt(frac, '.3f')}  {_verdict('fraction_of_compute_rate', frac)}"),
        ("CPU s per step: compute-only / node + p2pd",
         f"{_fmt(r.get('compute_cpu_s_per_step'), '.3f')} / {_fmt(r.get('shaped_cpu_s_per_step'), '.3f')}"),
        ("CPU s per step, node: training thread (optimizer) / loop / other / p2pd", _cpu_split(r)),
        ("CPU s per step, compute-only: optimizer", _fmt(r.get("compute_optimizer_cpu_s_per_step"), ".3f")),
        ("resyncs while timed (per node)", _list(r.get("resyncs_while_timed", []), "d")),
        ("replicas bit-identical at the end", YES_NO.get(r.get("replicas_identical"), "-")),
        ("busiest 10 s window / budget, up", _list(r.get("budget_ratio_up", []), ".3f")),
        ("busiest 10 s window / budget, down", _list(r.get("budget_ratio_down", []), ".3f")),
        ("max_budget_overshoot (<= 0.05)", f"{_fmt(over, '+.3f')}  {_verdict('max_budget_overshoot', over)}"),
        ("join_to_first_accept_s (<= 10, loopback)",
         f"{_fmt(join, '.1f')}  {_verdict('join_to_first_accept_s', join)}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``). Exit code per ExitCode."""
    from distronet.node.bench.netns import NetnsError
    from distronet.node.demo import SwarmFailure

    if args.repeats < 1:
        print(f"distro-node bench network: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        return int(ExitCode.USAGE)
    if args.quick:
        args.steps, args.warmup, args.repeats = min(args.steps, 6), min(args.warmup, 2), 1
    load_before, t0 = os.getloadavg()[0], time.monotonic()
    with contextlib.ExitStack() as stack:
        d = args.work_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="distro-bench-net-"))
        Path(d).mkdir(parents=True, exist_ok=True)
        try:
            result = _measure(args, Path(d))
        except (SwarmFailure, NetnsError) as e:
            print(f"distro-node bench network: FAILED: {e}", file=sys.stderr)
            for log in sorted(Path(d).glob("*/*.log")):
                tail = log.read_text(errors="replace").splitlines()[-8:]
                print(f"--- {log.parent.name}/{log.name} (last lines)\n" + "\n".join(tail), file=sys.stderr)
            return int(ExitCode.ERROR)
    result.update(seconds=time.monotonic() - t0, load_before=load_before, load_after=os.getloadavg()[0])
    if args.json:
        print(json.dumps(_no_nan(result), indent=1))
        return int(ExitCode.OK)
    delay = "on" if result.get("delay_applied") else "not available"
    print(
        f"distro-node bench network: {args.nodes} nodes, budgets up {args.up} / down {args.down} on links "
        f"{args.link_up} / {args.link_down} (netem delay {delay}), "
        f"overlap on, {args.steps} steps after {args.warmup}; {result['seconds']:.0f} s, load average "
        f"{load_before:.1f} before / {result['load_after']:.1f} after on {os.cpu_count()} CPUs"
    )
    if result.get("shaped_skipped"):
        print(f"shaped links skipped: {result['shaped_skipped']}")
    print(_table(result))
    return int(ExitCode.OK)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench network`."""
    p = sub.add_parser(
        "network", help="step rate on tc-shaped links vs compute alone; time for a newcomer to count"
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny model, 6 steps (a smoke run; figures are not the targets')"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--nodes", type=int, default=4, help="nodes (default 4)")
    p.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    p.add_argument(
        "--repeats", type=int, default=3,
        help="swarm runs, each between two compute-only runs; the fraction is their median (default 3)",
    )  # fmt: skip
    p.add_argument("--warmup", type=int, default=4, help="steps before timing starts (default 4)")
    p.add_argument("--up", default="4mbit", help="each node's upload budget (default 4mbit)")
    p.add_argument("--down", default="20mbit", help="each node's download budget (default 20mbit)")
    p.add_argument("--link-up", default="10mbit", help="tc rate of each node's upload link (default 10mbit)")
    p.add_argument(
        "--link-down", default="50mbit", help="tc rate of each node's download link (default 50mbit)"
    )
    p.add_argument(
        "--delay-ms", type=float, default=20.0, help="netem delay each way, where available (default 20)"
    )
    p.add_argument("--preset", default="ours_k32", help="optimizer preset (default ours_k32)")
    p.add_argument(
        "--round-deadline-s", type=float, default=0.5, help="the run's round deadline (default 0.5)"
    )
    p.add_argument(
        "--join-deadline-s", type=float, default=0.5, help="round deadline of the join run (default 0.5)"
    )
    p.add_argument("--skip-shaped", action="store_true", help="only the join measurement")
    p.add_argument(
        "--work-dir",
        default=None,
        help="keep logs and status files here; its shaped*, join folders are emptied first "
        "(default: a temp dir, removed)",
    )
    p.add_argument("--skip-join", action="store_true", help="only the shaped-link measurements")
    p.set_defaults(func=run)
