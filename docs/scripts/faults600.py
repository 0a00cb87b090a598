"""600 steps, 4 peers, QUICK GPT, shuffled/duplicated/delayed/late/dropped delivery: replicas bit-identical?"""
import sys, time, json, torch
torch.set_num_threads(1)
from distronet.node.bench.converge_train import QUICK, make_data
from dataclasses import replace
from distronet.node.models.gpt import GPT
from distronet.node.optim.config import preset
from distronet.node.exchange.faulty import FaultPlan
from distronet.node.bench.swarm_sim import SwarmFaults, param_digest, run_swarm
s = replace(QUICK, peers=4, steps=int(sys.argv[1]) if len(sys.argv) > 1 else 600)
data = make_data(s)
plan = FaultPlan(seed=11, p_drop=0.05, p_late=0.05, p_duplicate=0.3, max_delay=0.9)
for name in sys.argv[2:] or ["ours_k4_1bit"]:
    t = time.time()
    cfg = preset(name, lr=2e-3, total_steps=s.steps)
    r = run_swarm(lambda: GPT(s.model, seed=0), data.batch, cfg, 4, s.steps, SwarmFaults(plan=plan))
    digests = sorted({param_digest(m) for m in r.models})
    reps = [rep for o in r.optimizers for rep in o.reports]
    print(json.dumps({"preset": name, "steps": s.steps, "identical": len(digests) == 1, "digest": digests[0][:16],
        "rounds_cut": sum(len(x.accepted) < 4 for x in r.optimizers[0].reports),
        "duplicates_dropped": sum(o.exchange.stats.duplicates_dropped for o in r.optimizers),
        "repulled": sum(o.exchange.stats.repulled for o in r.optimizers),
        "own_lost": sum(not x.own_accepted for x in reps), "loss0": round(r.mean_loss(0), 3), "loss_end": round(r.mean_loss(s.steps - 1), 3),
        "s": round(time.time() - t)}), flush=True)
