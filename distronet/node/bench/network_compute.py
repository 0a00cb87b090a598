"""The compute-only side of `distro-node bench network`: one node's training with no network.

``python -m distronet.node.bench.network_compute '<json>'`` builds the run's model and
``DistroOptimizer`` exactly as a node does (same ``[model]`` and ``[optimizer]`` tables, same
thread count), over an in-memory exchange with this peer alone (so encode, decode and apply
still run), trains ``warmup + steps`` steps on the built-in corpus and prints one JSON line:
``{"steps_per_s": ..., "cpu_s_per_step": ..., "optimizer_cpu_s_per_step": ..., "step_s": [...]}``
(the timed steps only; the optimizer's share is its thread CPU inside ``Trainer.step``).

With ``"barrier": true`` the processes of one measurement time the same contention as the
swarm's nodes, which all train through the whole window: each prints ``{"ready": true}`` after
its warm-up and waits for a ``go`` line on stdin before its timed steps, and after printing its
result it keeps training (untimed) until a ``stop`` line or the end of stdin — so no process
times its steps while another is still importing torch or has already finished.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

__all__ = ["compute_rate", "main"]


def _line(expect: str) -> bool:
    """Block until a line ``expect`` arrives on stdin; False at the end of stdin."""
    return any(line.strip() == expect for line in sys.stdin)


def compute_rate(
    model: dict[str, Any],
    optimizer: dict[str, Any],
    *,
    steps: int,
    warmup: int,
    threads: int,
    peer: int = 0,
    barrier: bool = False,
) -> dict[str, Any]:
    """Steps per second of training alone (after ``warmup`` untimed steps) and each step's
    seconds; with ``barrier``, timed between a ``go`` and a ``stop`` line (module doc)."""
    import torch

    from distronet.node.daemon.parts import optimizer_config
    from distronet.node.daemon.trainer import ModelSpec, Trainer
    from distronet.node.data import load_builtin_corpus
    from distronet.node.data.order import BatchOrder
    from distronet.node.exchange.memory import MemoryExchange, MemoryHub
    from distronet.node.models.build import build_model
    from distronet.node.optim.distro import DistroOptimizer
    from distronet.node.optim.roles import tensor_roles
    from distronet.protocol.identity import Identity

    torch.set_num_threads(threads)
    spec = ModelSpec.from_run(model)
    device = torch.device("cpu")
    net = build_model(spec, device)
    ident = Identity.generate()
    exchange = MemoryExchange(MemoryHub(), ident.peer_id)
    dcfg = optimizer_config("bench", optimizer)
    opt = DistroOptimizer(net.named_parameters(), dcfg, exchange, ident, roles=tensor_roles(net))
    tokens = load_builtin_corpus().train[:200_000]
    order = BatchOrder(tokens, "bench", spec.seed, peer, spec.batch, spec.seq_len)
    trainer = Trainer(net, opt, order.xy, device)
    times, cpu, opt_cpu = [], 0.0, 0.0
    for step in range(warmup + steps):
        if barrier and step == warmup:
            print(json.dumps({"ready": True}), flush=True)
            _line("go")
        t0, c0 = time.perf_counter(), time.process_time()
        res = trainer.step(step)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            cpu += time.process_time() - c0
            opt_cpu += res.optimizer_cpu_s
    n = len(times)
    out = {"steps_per_s": n / sum(times), "cpu_s_per_step": cpu / n, "optimizer_cpu_s_per_step": opt_cpu / n,
           "step_s": times}  # fmt: skip
    if barrier:
        print(json.dumps(out), flush=True)
        stop = threading.Event()

        def wait_stop() -> None:
            _line("stop")
            stop.set()

        threading.Thread(target=wait_stop, daemon=True).start()
        step = warmup + steps
        while not stop.is_set() and step < warmup + 4 * steps:  # the others' timed steps, bounded
            trainer.step(step)
            step += 1
    return out


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    out = compute_rate(
        args["model"], args["optimizer"], steps=args["steps"], warmup=args["warmup"], threads=args["threads"],
        peer=args.get("peer", 0), barrier=bool(args.get("barrier", False)),
    )  # fmt: skip
    if not args.get("barrier"):
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
