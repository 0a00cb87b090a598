"""Can a diagonal curvature estimate correct the stale gradient of overlap mode (DC-ASGD)?

    .venv/bin/python docs/scripts/overlap_dc_calib.py STOP [FIELD=VALUE,...]

Runs the bench's setting (4 peers, default GPT, 600-step schedule) with ``ours_k32`` at lr 4e-3,
overlapped with the own-packet guess x0.7 (fields change that), for STOP steps. Every 10 steps,
for peer 0, it takes the gradient it used (at the guessed point θ_guess) and the gradient of the
same batch at the point the synchronous run would have used (the consensus after the round
arrived, θ_true), and compares diff = g(θ_true) − g(θ_guess) with candidate corrections
e = h ⊙ Δθ (Δθ = θ_true − θ_guess) per tensor group (ortho = hidden matrices, emb = embeddings
and head, 1d = norms/biases): h = g⊙g (DC-ASGD), 1 (isotropic), v (running mean of g², 0.99),
sqrt(v), and −g (a plain shrink). Prints per group rel = |diff|/|g| and, for each candidate,
[cosine(diff, e), the least-squares λ]. A correction g + λ·e can only remove cos² of |diff|².
"""

import copy
import json
import sys

import torch

from distronet.node.bench.converge_train import BenchSetting, make_data
from distronet.node.models.gpt import GPT
from distronet.node.optim import distro
from distronet.node.optim.config import preset
from distronet.node.bench.swarm_sim import _default_loss, run_swarm

torch.set_num_threads(1)
stop = int(sys.argv[1])
s = BenchSetting(steps=600, warmup_steps=30)
data = make_data(s)
kw: dict = {"overlap": True, "overlap_predict": "own", "overlap_scale": 0.7}
for kv in sys.argv[2].split(",") if len(sys.argv) > 2 else []:
    k, v = kv.split("=")
    kw[k] = json.loads(v)
cfg = preset(
    "ours_k32", lr=4e-3, warmup_steps=30, total_steps=600, decay="cosine", min_lr_ratio=s.min_lr_ratio, **kw
)
names = [n for n, _ in GPT(s.model, seed=s.seed).named_parameters()]
last: dict = {}
snap: dict = {}
v: dict = {}
peer0: dict = {}


def batches(i: int, step: int):
    b = data.batch(i, step)
    if i == 0:
        last["b"] = b
    return b


orig = distro.DistroOptimizer.finish_step


def finish_step(self) -> None:  # snapshot peer 0's parameters: the point its gradient was taken at
    peer0.setdefault("o", self)
    if self is peer0["o"]:
        snap["p"] = {n: p.detach().clone() for n, p in zip(names, self._params, strict=True)}
    orig(self)


distro.DistroOptimizer.finish_step = finish_step


def group(n: str, p: torch.Tensor) -> str:
    if p.dim() == 2 and not any(k in n for k in cfg.ortho_skip):
        return "ortho"
    return "emb" if p.dim() == 2 else "1d"


def on_step(step: int, res) -> None:
    m, opt = res.models[0], res.optimizers[0]
    params = dict(m.named_parameters())
    g_guess = {n: p.grad.detach().clone() for n, p in params.items()}
    for n, g in g_guess.items():
        v[n] = g * g if n not in v else 0.99 * v[n] + 0.01 * g * g
    if step < 5 or step % 10:
        return
    true = copy.deepcopy(m)
    for n, p in true.named_parameters():
        p.data.copy_(opt.state[params[n]]["consensus"])
    true.zero_grad()
    _default_loss(true, *last["b"]).backward()
    acc: dict = {}
    for n, p in true.named_parameters():
        g = g_guess[n].flatten()
        diff = (p.grad - g_guess[n]).flatten()
        d = (opt.state[params[n]]["consensus"] - snap["p"][n]).flatten()
        vn = v[n].flatten()
        ests = {"g2": g * g * d, "iso": d, "v": vn * d, "sqrtv": vn.sqrt() * d, "negg": -g}
        a = acc.setdefault(group(n, p), {"dd": 0.0, "gg": 0.0, **{k: [0.0, 0.0] for k in ests}})
        a["dd"] += float(diff @ diff)
        a["gg"] += float(g @ g)
        for k, e in ests.items():
            a[k][0] += float(diff @ e)
            a[k][1] += float(e @ e)
    out: dict = {"step": step}
    for grp, a in acc.items():
        r: dict = {"rel": round((a["dd"] / a["gg"]) ** 0.5, 3)}
        for k in ("g2", "iso", "v", "sqrtv", "negg"):
            xe, ee = a[k]
            r[k] = [round(xe / (a["dd"] * ee) ** 0.5, 3), float(f"{xe / ee:.3g}")] if ee > 0 else [0, 0]
        out[grp] = r
    print(json.dumps(out), flush=True)


run_swarm(lambda: GPT(s.model, seed=s.seed), batches, cfg, s.peers, stop, seed=s.seed, on_step=on_step)
