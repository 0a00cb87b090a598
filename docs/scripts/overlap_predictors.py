"""How well candidate stand-ins predict the update in flight (overlap mode; issue 3, Overlap).

    .venv/bin/python docs/scripts/overlap_predictors.py [--stop 60] PRESET:LR[:FIELD=VALUE,...]

Runs the bench setting overlapped (``overlap=True`` added) and, on peer 0 after every step s,
forms candidate guesses of round s's update from what the peer knows then; one step later it
compares each with the update round s really applied (cosine, per tensor group, mean over steps):
``last`` the previous update, ``own`` the rule on the peer's own packet, ``own_dense`` the rule
on its whole momentum before extraction, ``own_top4k`` on its top 4k coefficients per chunk.
"""

import argparse
import json
from collections import defaultdict

import numpy as np
import torch

from distronet.kernels.decode import decode_sum
from distronet.node.bench.converge_train import BenchSetting, make_data
from distronet.node.models.gpt import GPT
from distronet.node.optim.config import UpdateRule, lr_at, preset
from distronet.node.optim.update import apply_rule
from distronet.node.bench.swarm_sim import run_swarm

ap = argparse.ArgumentParser()
ap.add_argument("--stop", type=int, default=60)
ap.add_argument("spec")
a = ap.parse_args()
torch.set_num_threads(1)
s = BenchSetting()
data = make_data(s)
name, lr_s, *rest = a.spec.split(":")
kw: dict = {}
for kv in rest[0].split(",") if rest and rest[0] else []:
    k, v = kv.split("=")
    try:
        kw[k] = json.loads(v)
    except json.JSONDecodeError:
        kw[k] = v
cfg = preset(
    name,
    **{
        "overlap": True,
        **kw,
        "lr": float(lr_s),
        "warmup_steps": s.warmup_steps,
        "total_steps": s.steps,
        "decay": "cosine",
        "min_lr_ratio": s.min_lr_ratio,
    },
)
cands: dict[int, dict[str, torch.Tensor]] = {}
last_u: dict[int, torch.Tensor] = {}
prev_cons: dict[int, torch.Tensor] = {}
acc: dict[tuple[str, str], list[float]] = defaultdict(list)


def group(pname: str, rule: UpdateRule) -> str:
    if rule is UpdateRule.ORTHO:
        return "ortho"
    return "embed/head" if len(pname.split(".")) <= 2 and "ln_f" not in pname else "1d/other"


def cos(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x * y).sum() / (x.norm() * y.norm() + 1e-30))


def on_step(step: int, res) -> None:
    opt = res.optimizers[0]
    names = [n for n, _ in res.models[0].named_parameters()]
    pend = opt._pending.get(step)
    for i, (plan, p) in enumerate(zip(opt.plans, opt._params, strict=True)):
        cons = opt.state[p]["consensus"]
        rule = opt._rule_for(plan)
        g = group(names[i], rule)
        if i in prev_cons and step >= 1:  # round step - 1 was applied in this step's finish_step
            u = (prev_cons[i] - cons) / lr_at(cfg, step - 1)
            if u.norm() > 0:
                for cname, c in cands.get(i, {}).items():
                    acc[(g, cname)].append(cos(c, u))
                if i in last_u:
                    acc[(g, "last")].append(cos(last_u[i], u))
                last_u[i] = u
        prev_cons[i] = cons.clone()
        if pend is None:
            continue
        sent = pend.sent[i]
        mom = opt.state[p]["momentum"]
        pre = mom.clone().scatter_add_(1, sent.idx, sent.val)
        r = UpdateRule.RMS if rule is UpdateRule.ADAM else rule  # Adam's v: use the RMS rule as a proxy

        def dec(idx: torch.Tensor, val: torch.Tensor, layout=plan.layout) -> torch.Tensor:
            return decode_sum(layout, [(idx, val)], dtype=torch.float32, device=val.device)

        full = torch.arange(pre.shape[1]).expand(pre.shape[0], -1).contiguous()
        k4 = min(pre.shape[1], 4 * sent.idx.shape[1])
        top = pre.abs().topk(k4, dim=1).indices
        cands[i] = {
            "own": apply_rule(r, dec(sent.idx, sent.val), ns_steps=cfg.ns_steps, eps=cfg.eps),
            "own_dense": apply_rule(r, dec(full, pre), ns_steps=cfg.ns_steps, eps=cfg.eps),
            "own_top4k": apply_rule(r, dec(top, pre.gather(1, top)), ns_steps=cfg.ns_steps, eps=cfg.eps),
        }
    if (step + 1) % 20 == 0:
        out = {f"{g}/{c}": round(float(np.mean(v)), 3) for (g, c), v in sorted(acc.items())}
        print(json.dumps({"step": step + 1, "loss": round(res.mean_loss(step), 3), **out}), flush=True)
        acc.clear()


run_swarm(lambda: GPT(s.model, seed=s.seed), data.batch, cfg, s.peers, a.stop, seed=s.seed, on_step=on_step)
