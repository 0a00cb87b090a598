"""Scratch tuning over model-data's converge harness: spec = base:lr[:k=v,...]  (base = preset name or adamw)."""
import sys, json, argparse, dataclasses
import torch
from distronet.node.bench.converge_train import BenchSetting, make_data, run_row
from distronet.node.bench.converge_rows import ROWS, RowSpec
from distronet.node.optim import config as C
ap = argparse.ArgumentParser(); ap.add_argument("--steps", type=int, default=150); ap.add_argument("--peers", type=int, default=4)
ap.add_argument("runs", nargs="+"); a = ap.parse_args()
s = BenchSetting(steps=a.steps, peers=a.peers, warmup_steps=max(5, a.steps // 20))
data = make_data(s)
for i, spec in enumerate(a.runs):
    parts = spec.split(":"); base, lr = parts[0], float(parts[1]); kw = {}
    if len(parts) > 2:
        for kv in parts[2].split(","):
            k, v = kv.split("=")
            try: v = json.loads(v)
            except Exception: pass
            kw[k] = v
    if base == "adamw":
        row = ROWS["adamw"]
    else:
        name = f"tmp{i}"; C.PRESETS[name] = {**C.PRESETS[base], **kw}
        row = RowSpec(spec, "distro", spec, (lr,), lr, name)
    r = run_row(row, lr, s, data)
    print(json.dumps({"run": spec, "val": round(r.val_loss, 4), "train": round(r.train_loss, 4), "up": round(r.upload_bytes_per_step), "x": round(r.compression_vs_ring_allreduce, 1), "s": round(r.seconds)}), flush=True)
