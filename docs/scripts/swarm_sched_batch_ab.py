"""Does SCHED_BATCH for the nodes' event loops and p2pd (no wakeup preemption of the training
threads) cut the training thread's CPU a step? (lead, session 10; answer: no).

Starts a coordinator and 4 real nodes on loopback (``demo.LocalSwarm``) training the default GPT
with ``bench network``'s batch, then three times: every node's main thread and its p2pd's threads
to SCHED_OTHER, measure ``SECONDS``; to SCHED_BATCH, measure. Prints the nodes' mean rate and ms
of CPU a step of the training thread (the busiest thread), the event loop and p2pd. As root:

    .venv/bin/python docs/scripts/swarm_sched_batch_ab.py /tmp/s10/bab 12
"""

import os
import sys
import time
from pathlib import Path

from swarm_cpu_ab import children, loopback_swarm, thread_cpu  # docs/scripts, beside this file


def snapshot(pid: int) -> tuple[dict[int, float], float]:
    """CPU seconds of each thread of ``pid``, and of all threads of its children (p2pd)."""
    return thread_cpu(pid), sum(sum(thread_cpu(k).values()) for k in children(pid))


def set_policy(pid: int, batch: bool) -> None:
    policy = os.SCHED_BATCH if batch else os.SCHED_OTHER
    os.sched_setscheduler(pid, policy, os.sched_param(0))  # the main thread: the event loop
    for k in children(pid):
        for t in thread_cpu(k):
            os.sched_setscheduler(t, policy, os.sched_param(0))


folder, seconds = Path(sys.argv[1]), float(sys.argv[2])
with loopback_swarm(folder, "batchab") as swarm:
    pids = [n.pid for n in swarm.nodes]
    for _ in range(3):
        for batch in (False, True):
            for p in pids:
                set_policy(p, batch)
            time.sleep(1.0)
            s0, c0, t0 = [swarm.status(i)["step"] for i in range(4)], [snapshot(p) for p in pids], time.time()
            time.sleep(seconds)
            s1, c1, t1 = [swarm.status(i)["step"] for i in range(4)], [snapshot(p) for p in pids], time.time()
            train, loop, p2pd = [], [], []
            for i, p in enumerate(pids):
                n = s1[i] - s0[i]
                (a, ka), (b, kb) = c0[i], c1[i]
                train.append(max(b[t] - a.get(t, 0.0) for t in b) / n * 1e3)
                loop.append((b[p] - a[p]) / n * 1e3)
                p2pd.append((kb - ka) / n * 1e3)
            rate = sum(s1[i] - s0[i] for i in range(4)) / 4 / (t1 - t0)
            print(f"batch={batch!s:5} rate {rate:.3f}/s  ms a step: training {sum(train) / 4:.1f} "
                  f"loop {sum(loop) / 4:.1f} p2pd {sum(p2pd) / 4:.1f}", flush=True)  # fmt: skip
