"""One training step of the default GPT (batch 8 x 64, AdamW, 2 torch threads): median of 60
steps after 10 warm-up, in ms. Run it with and without GOMP_SPINCOUNT in the environment,
alternating, to see what the OpenMP spin count does to compute (lead, session 6):

    for i in 1 2 3; do .venv/bin/python docs/scripts/omp_spin_train_ab.py;
      GOMP_SPINCOUNT=20000 .venv/bin/python docs/scripts/omp_spin_train_ab.py; done
"""
import statistics
import time

import torch

from distronet.node.models.gpt import GPT, GPTConfig
torch.set_num_threads(2)
m = GPT(GPTConfig(), seed=0)
opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
x = torch.randint(0, 256, (8, 64)); y = torch.randint(0, 256, (8, 64))
def step():
    loss = m.loss(x, y)
    opt.zero_grad(); loss.backward(); opt.step()
for _ in range(10): step()
ts = []
for _ in range(60):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
print(f"{statistics.median(ts)*1000:.2f}")
