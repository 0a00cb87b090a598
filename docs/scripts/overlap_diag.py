"""Overlap diagnostics: loss curve and per-tensor update statistics of one run (issue 3, Overlap).

    .venv/bin/python docs/scripts/overlap_diag.py [--steps 600] [--stop N] [--every 20] [--quick]
        [--log F] [--delay-only PATTERN] [--seed S] PRESET:LR[:FIELD=VALUE,...]

``--stop N`` runs the first N steps of the ``--steps`` schedule; ``--delay-only`` (diagnostic, not
overlap) applies the update of the tensors it names (``ortho``, ``other`` or a name substring)
one step late in a plain run.

Runs ``run_swarm`` (the bench's computation) with the preset and the bench's lr schedule, and
logs every ``--every`` steps: the mean training loss over the last ``--every`` steps, the largest
parameter RMS and the cosine between consecutive applied updates of a few tensors (peer 0).
Appends one JSON line per checkpoint and one with the final validation loss to ``--log``.
"""

import argparse
import json
import time

import numpy as np
import torch

from distronet.node.bench.converge_train import QUICK, BenchSetting, evaluate, make_data
from distronet.node.models.gpt import GPT
from distronet.node.optim.config import preset
from distronet.node.bench.swarm_sim import param_digest, run_swarm

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=600)
ap.add_argument("--every", type=int, default=20)
ap.add_argument("--stop", type=int, default=0)  # run only this many steps of the --steps schedule
ap.add_argument("--quick", action="store_true")
ap.add_argument("--peers", type=int, default=0)
ap.add_argument("--log", default="/tmp/ov/diag.jsonl")
ap.add_argument("--delay-only", default="")
ap.add_argument("--seed", type=int, default=0)  # BenchSetting.seed: model init, data order, identities
ap.add_argument("spec")
a = ap.parse_args()
torch.set_num_threads(1)
base = QUICK if a.quick else BenchSetting()
s = BenchSetting(
    **{
        **base.to_json(),
        "model": base.model,
        "adamw_betas": base.adamw_betas,
        "steps": a.steps,
        "peers": a.peers or base.peers,
        "warmup_steps": 30 if a.steps >= 600 else max(5, a.steps // 20),
        "seed": a.seed,
    }
)
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
        **kw,
        "lr": float(lr_s),
        "warmup_steps": s.warmup_steps,
        "total_steps": s.steps,
        "decay": "cosine",
        "min_lr_ratio": s.min_lr_ratio,
    },
)
ap2 = a  # --delay-only: diagnostic, delay the update of tensors matching a pattern by one step
if a.delay_only:
    from distronet.node.optim import distro as _d
    from distronet.node.optim.config import UpdateRule

    _orig = _d.DistroOptimizer._update
    _stash: dict = {}

    def _delayed(self, plan, p, dec, shared):
        u = _orig(self, plan, p, dec, shared)
        ortho = self._rule_for(plan) is UpdateRule.ORTHO
        hit = (
            (a.delay_only == "ortho" and ortho)
            or (a.delay_only == "other" and not ortho)
            or (a.delay_only not in ("ortho", "other") and a.delay_only in plan.name)
        )
        if not hit:
            return u
        key = (id(self), plan.tensor_id)
        old = _stash.get(key, torch.zeros_like(u))
        _stash[key] = u.clone()
        return old

    _d.DistroOptimizer._update = _delayed
prev: dict[str, torch.Tensor] = {}
last: dict[str, torch.Tensor] = {}
cos_acc: dict[str, list[float]] = {}
t0 = time.time()


guess: dict[str, torch.Tensor] = {}
gcos: dict[str, list[float]] = {}


def on_step(step: int, res) -> None:
    m = res.models[0]
    opt = res.optimizers[0]
    for n, p in m.named_parameters():
        ref = opt.state[p]["consensus"] if cfg.overlap else p
        cur = ref.detach().clone()
        if n in last:
            d = cur - last[n]
            if n in guess and d.norm() > 0 and guess[n].norm() > 0:  # the guess vs the update it stood in for
                gcos.setdefault(n, []).append(float((d * guess[n]).sum() / (d.norm() * guess[n].norm())))
        if cfg.overlap:
            guess[n] = (p.detach() - cur).clone()
        if n in last:
            if n in prev and d.norm() > 0 and prev[n].norm() > 0:
                c = float((d * prev[n]).sum() / (d.norm() * prev[n].norm()))
                cos_acc.setdefault(n, []).append(c)
            prev[n] = d
        last[n] = cur
    if (step + 1) % a.every == 0:
        lo = [res.mean_loss(t) for t in range(step + 1 - a.every, step + 1)]
        rms = {n: float(p.detach().pow(2).mean().sqrt()) for n, p in m.named_parameters()}
        worst = max(rms, key=lambda k: rms[k])
        cos = {k: round(float(np.mean(v)), 3) for k, v in cos_acc.items()}
        cos_sel = {
            k: v
            for k, v in cos.items()
            if any(
                s in k
                for s in (
                    "wte.",
                    "blocks.0.attn.c_attn.weight",
                    "blocks.0.mlp.c_fc.weight",
                    "lm_head",
                    "blocks.3.mlp.c_proj.weight",
                    "ln_f.weight",
                )
            )
        }
        line = {
            "spec": a.spec,
            **({"seed": a.seed} if a.seed else {}),
            "step": step + 1,
            "loss": round(float(np.nanmean(lo)), 4),
            "max_rms": [worst, round(rms[worst], 3)],
            "cos_consec": cos_sel,
            "s": round(time.time() - t0),
        }
        gsel = {k: round(float(np.mean(v)), 3) for k, v in gcos.items() if k in cos_sel}
        line["guess_cos"] = gsel
        cos_acc.clear()
        gcos.clear()
        print(json.dumps(line), flush=True)
        with open(a.log, "a") as f:
            f.write(json.dumps(line) + "\n")


res = run_swarm(
    lambda: GPT(s.model, seed=s.seed),
    data.batch,
    cfg,
    s.peers,
    a.stop or s.steps,
    seed=s.seed,
    on_step=on_step,
)
live = [m for m, ok in zip(res.models, res.alive, strict=True) if ok]
line = {
    "spec": a.spec,
    **({"seed": a.seed} if a.seed else {}),
    "steps": a.stop or s.steps,
    "quick": a.quick,
    "val": round(evaluate(live[0], data.val_x, data.val_y), 4),
    "identical": len({param_digest(m) for m in live}) == 1,
    "s": round(time.time() - t0),
}
print(json.dumps(line), flush=True)
with open(a.log, "a") as f:
    f.write(json.dumps(line) + "\n")
