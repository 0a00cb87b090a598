"""Clean vs peer-death vs overlap, same setting as bench converge: preset lr steps [variants...]
variant: clean | die=STEP | overlap | overlap_nolook"""
import sys, json, time, torch
torch.set_num_threads(1)
from distronet.node.bench.converge_train import BenchSetting, make_data, evaluate
from distronet.node.models.gpt import GPT
from distronet.node.optim.config import preset
from distronet.node.bench.swarm_sim import SwarmFaults, param_digest, run_swarm
name, lr, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
s = BenchSetting(steps=steps)
data = make_data(s)
for v in sys.argv[4:]:
    t = time.time(); kw = {}; faults = None
    if v.startswith("die="): faults = SwarmFaults(deaths={1: int(v[4:])})
    if v.startswith("overlap"): kw = dict(overlap=True, overlap_lookahead=(not v.startswith("overlap_nolook")))
    if "," in v: kw.update({k: float(x) for k, x in (e.split("=") for e in v.split(",")[1:])})
    cfg = preset(name, lr=lr, warmup_steps=s.warmup_steps, total_steps=s.steps, decay="cosine", min_lr_ratio=s.min_lr_ratio, **kw)
    r = run_swarm(lambda: GPT(s.model, seed=s.seed), data.batch, cfg, s.peers, s.steps, faults, seed=s.seed)
    live = [m for m, a in zip(r.models, r.alive) if a]
    print(json.dumps({"preset": name, "lr": lr, "steps": steps, "variant": v, "val": round(evaluate(live[0], data.val_x, data.val_y), 4),
                      "identical": len({param_digest(m) for m in live}) == 1, "alive": sum(r.alive), "s": round(time.time() - t)}), flush=True)
