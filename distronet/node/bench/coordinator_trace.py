"""Where the slow calls' time went: the generator's records joined with the server's trace.

`distro-node bench coordinator --trace DIR` starts the server with ``DISTRO_COORD_TRACE``
(:mod:`distronet.coordinator.trace`) and keeps the generator's own record of each timed call;
both clocks are ``time.perf_counter`` (CLOCK_MONOTONIC, one clock for every process on Linux).
:func:`breakdown` joins them by (peer, nonce) and splits each call's latency into consecutive
stages that add up to it:

    send_lag      scheduled -> the generator wrote it (the generator's own delay)
    to_loop       written -> its bytes reached the server's event loop (kernel, loop busy)
    handle        reached the loop -> handled (parse, auth, schema, operation)
    batch_wait    handled -> the writer took its batch (the commit before it still running)
    to_thread     batch taken -> the SQLite writer process started it (pipe hand-off)
    statements    the upserts
    fsync         ``COMMIT`` (the WAL's fsync under synchronous=FULL)
    to_loop_back  COMMIT done -> the event loop saw it (GIL, loop busy)
    answer        -> the answer was written (done-callback dispatch)
    to_client     -> the generator read the answer

For the calls over ``slow_ms`` it reports each stage's median and mean, how many calls each
stage dominated, and how many overlapped a GC pass, a loop stall or a checkpoint.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

__all__ = ["STAGES", "breakdown"]

STAGES = (
    "send_lag", "to_loop", "handle", "batch_wait", "to_thread", "statements", "fsync",
    "to_loop_back", "answer", "to_client",
)  # fmt: skip


def _overlaps(spans: list[tuple[float, float]], a: float, b: float) -> bool:
    return any(s < b and s + d > a for s, d in spans)


def breakdown(
    server_file: str | Path, gen: list[tuple[Any, ...]], *, slow_ms: float = 50.0
) -> dict[str, Any]:
    """Join the generator's records ``gen`` with the server's trace file; see the module."""
    srv = json.loads(Path(server_file).read_text())
    calls = {(c[7], c[8]): c for c in srv["calls"]}
    commits = {c[0]: c for c in srv["commits"]}
    gcs = [(g[1], g[2]) for g in srv["gc"]]
    stalls = [(t0, d) for t0, d, _cpu in srv["stalls"]]
    cps = [(t0, d) for t0, d in srv["checkpoints"]]
    t_lo = min((g[3] for g in gen), default=0.0)
    t_hi = max((g[5] for g in gen), default=0.0)
    rows: list[dict[str, float]] = []
    unmatched = 0
    for peer, nonce, _kind, sched, sent, answered, _status in gen:
        c = calls.get((peer, nonce))
        if c is None:
            unmatched += 1
            continue
        _route, recv, _start, handled, batch, written = c[:6]
        cm = commits.get(batch)
        if cm is None:  # answered without waiting for a commit
            picked = thread0 = stmts = done = back = handled
        else:
            _b, picked, thread0, stmts, done, _cpu, back, _rows = cm
            picked = max(picked, handled)  # an in-flight batch was taken before this call
        r = {
            "send_lag": sent - sched,
            "to_loop": recv - sent,
            "handle": handled - recv,
            "batch_wait": picked - handled,
            "to_thread": thread0 - picked if cm is not None and thread0 >= picked else 0.0,
            "statements": stmts - max(thread0, picked),
            "fsync": done - max(stmts, picked),
            "to_loop_back": back - max(done, picked),
            "answer": written - back,
            "to_client": answered - written,
        }
        r = {k: max(v, 0.0) * 1e3 for k, v in r.items()}
        r["total"] = (answered - sched) * 1e3
        r["t0"], r["t1"] = sched, answered
        rows.append(r)
    slow = [r for r in rows if r["total"] > slow_ms]
    dominated = {k: 0 for k in STAGES}
    for r in slow:
        dominated[max(STAGES, key=lambda k: r[k])] += 1
    in_window = [c for c in srv["commits"] if t_lo <= c[1] <= t_hi]
    fsyncs = sorted((c[4] - c[3]) * 1e3 for c in in_window)
    whole = sorted((c[6] - c[1]) * 1e3 for c in in_window)
    sql_cpu = sorted(c[5] / max(c[4] - c[2], 1e-9) for c in in_window)
    gcw = [g for g in srv["gc"] if t_lo <= g[1] <= t_hi]
    stw = [s for s in srv["stalls"] if t_lo <= s[0] <= t_hi]
    cpw = [c for c in cps if t_lo <= c[0] <= t_hi]

    def stat(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {}
        s = sorted(xs)
        return {
            "median": round(statistics.median(s), 2),
            "mean": round(statistics.fmean(s), 2),
            "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], 2),
            "max": round(s[-1], 2),
        }

    return {
        "calls": len(rows),
        "unmatched": unmatched,
        "slow_calls": len(slow),
        "slow_stage_ms": {k: stat([r[k] for r in slow]) for k in STAGES},
        "all_stage_p99_ms": {k: stat([r[k] for r in rows]).get("p99", 0.0) for k in STAGES},
        "slow_dominated_by": {k: v for k, v in dominated.items() if v},
        "slow_overlapping": {
            "gc": sum(_overlaps(gcs, r["t0"], r["t1"]) for r in slow),
            "loop_stall": sum(_overlaps(stalls, r["t0"], r["t1"]) for r in slow),
            "checkpoint": sum(_overlaps(cps, r["t0"], r["t1"]) for r in slow),
        },
        "commits": len(in_window),
        "commit_fsync_ms": stat(fsyncs),
        "commit_whole_ms": stat(whole),
        "commits_fsync_over_20ms": sum(f > 20 for f in fsyncs),
        "commit_thread_cpu_share_median": round(statistics.median(sql_cpu), 3) if sql_cpu else None,
        "young_types": srv.get("young_types"),
        "gc_passes": {str(g): sum(1 for x in gcw if x[0] == g) for g in (0, 1, 2)},
        "gc_ms": [(x[0], round(x[2] * 1e3, 2), round(x[3] * 1e3, 2), x[4]) for x in gcw][:20],
        "loop_stalls_over_2ms": len(stw),
        "loop_stall_ms": stat([s[1] * 1e3 for s in stw]),
        "loop_stall_cpu_share": round(sum(s[2] for s in stw) / max(sum(s[1] for s in stw), 1e-9), 3),
        "checkpoints": len(cpw),
        "checkpoint_ms": stat([c[1] * 1e3 for c in cpw]),
    }
