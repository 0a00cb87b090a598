"""The 600-step optimizer study (issue 3's setting): one process per run, every run logged.

    .venv/bin/python docs/scripts/study600.py [--steps 600] [--log FILE] SPEC [SPEC ...]

SPEC = ROW:LR[:FIELD=VALUE,...][@VARIANT]
  ROW      a bench row (adamw, demo-ref, ours-k32, ours-k4-1bit) or a DistroConfig preset name
  FIELD    DistroConfig fields changed on top of the preset (VALUE parsed as JSON, else string)
  VARIANT  comma-separated: die=STEP (peer 1 of 4 dies at STEP) | rebalance (with die=: the
           survivors take over the dead peer's data, ``run_swarm(keep_global_batch=True)``) |
           peers=N (N peers instead of 4, e.g. the 3-peer floor; peers read orders 0..N-1) |
           overlap | curve (the clean run through ``run_swarm``, same computation as
           ``run_row``, also logging the peers' mean train loss over each 50 steps as "curve")

A plain SPEC runs ``converge_train.run_row`` under ``BenchSetting(steps=...)`` (the exact
computation of ``distro-node bench converge``), so a result equals the bench row's. Each run
appends one JSON line to the log (default docs/scripts/study600.jsonl): spec, val loss, train
loss, upload bytes per peer per step, x less than the fp32 ring all-reduce, replicas equal,
live peers, seconds, UTC time. ``--record`` also writes the results into
``converge_defaults.json`` (``write_defaults``) as that row's sweep grid; the winner of the
recorded grid becomes the row's default lr.
"""

import argparse
import dataclasses
import json
import math
import time

import numpy as np
import torch

from distronet.node.bench.converge_rows import ROWS, read_defaults, write_defaults
from distronet.node.bench.converge_train import (
    BenchSetting,
    evaluate,
    make_data,
    ring_allreduce_bytes,
    run_row,
)
from distronet.node.models.gpt import GPT
from distronet.node.optim.config import preset
from distronet.node.bench.swarm_sim import SwarmFaults, param_digest, run_swarm

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=600)
ap.add_argument("--log", default="docs/scripts/study600.jsonl")
ap.add_argument("--record", action="store_true")
ap.add_argument("--seed", type=int, default=0)  # BenchSetting.seed: model init, data order, identities
ap.add_argument("specs", nargs="+")
a = ap.parse_args()
torch.set_num_threads(1)
s = BenchSetting(steps=a.steps, warmup_steps=30 if a.steps >= 600 else max(5, a.steps // 20), seed=a.seed)
data = make_data(s)


def parse(spec: str) -> tuple[str, float, dict, str]:
    body, _, variant = spec.partition("@")
    parts = body.split(":")
    kw = {}
    for kv in parts[2].split(",") if len(parts) > 2 and parts[2] else []:
        k, v = kv.split("=")
        try:
            kw[k] = json.loads(v)
        except json.JSONDecodeError:
            kw[k] = v
    return parts[0], float(parts[1]), kw, variant


for spec in a.specs:
    row, lr, kw, variant = parse(spec)
    t0 = time.time()
    if not variant and row in ROWS:
        r = run_row(ROWS[row], lr, s, data, overrides=kw or None)
        out = dict(
            val=r.val_loss,
            train=r.train_loss,
            up=r.upload_bytes_per_step,
            x_less_ring=r.compression_vs_ring_allreduce,
            identical=r.replicas_identical,
            alive=s.peers,
        )
    else:
        name = ROWS[row].preset if row in ROWS else row
        opts = dict(o.partition("=")[::2] for o in variant.split(","))
        faults = SwarmFaults(deaths={1: int(opts["die"])}) if "die" in opts else None
        peers = int(opts.get("peers") or s.peers)
        if "overlap" in opts:
            kw = {"overlap": True, **kw}
        cfg = preset(
            name,
            **{
                **kw,
                "lr": lr,
                "warmup_steps": s.warmup_steps,
                "total_steps": s.steps,
                "decay": "cosine",
                "min_lr_ratio": s.min_lr_ratio,
            },
        )
        res = run_swarm(
            lambda: GPT(s.model, seed=s.seed),
            data.batch,
            cfg,
            peers,
            s.steps,
            faults,
            seed=s.seed,
            keep_global_batch="rebalance" in opts,
        )
        live = [m for m, ok in zip(res.models, res.alive, strict=True) if ok]
        up = float(np.mean([b for rowb in res.upload_bytes for b in rowb if b > 0]))
        ring = ring_allreduce_bytes(live[0].num_parameters(), peers)
        tail = [res.mean_loss(t) for t in range(s.steps - s.steps // 10, s.steps)]
        out = dict(
            val=evaluate(live[0], data.val_x, data.val_y),
            train=float(np.nanmean(tail)),
            up=up,
            x_less_ring=ring / up,
            identical=len({param_digest(m) for m in live}) == 1,
            alive=len(live),
            windows_last=sum(w[-1] for w in res.windows),  # the global batch of the last step
        )
        if "curve" in opts:
            w = [res.mean_loss(t) for t in range(s.steps)]
            out["curve"] = [round(float(np.nanmean(w[t : t + 50])), 4) for t in range(0, s.steps, 50)]
    line = {
        "spec": spec,
        "row": row,
        "lr": lr,
        "fields": kw,
        "variant": variant or "clean",
        "steps": s.steps,
        **({"seed": s.seed} if s.seed else {}),
        **{k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in out.items()},
        "seconds": round(time.time() - t0),
        "utc": time.strftime("%H:%M", time.gmtime()),
    }
    print(json.dumps(line), flush=True)
    with open(a.log, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    if a.record and s.seed == 0 and row in ROWS and not variant and not kw and a.steps == 600:
        doc = read_defaults()
        grid = {**doc.get("sweep", {}).get(row, {}), f"{lr:g}": out["val"]}
        best = min(grid, key=lambda k: grid[k])
        write_defaults({row: float(best)}, {row: grid}, dataclasses.asdict(s))
