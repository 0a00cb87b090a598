"""Hold the fit estimate (``models.fit.estimate``) to the memory real training steps take.

    python tools/fit_check.py                       # the table: gpt and the bench Llama, CPU
    python tools/fit_check.py --model llama --micro-batch 32 --steps 2 --json
    python tools/fit_check.py --device cuda         # on a CUDA machine

For each (model, micro-batch) a fresh Python process (``--child``) imports torch, builds the
run's model with ``models.build.build_model``, a ``DistroOptimizer`` (default preset) over a
one-peer ``MemoryHub`` and the daemon's ``Trainer`` with that micro-batch, and runs ``--steps``
full training steps (forward + backward per pass, publish, collect, apply) on random tokens.

What is measured:

* CPU: the process's peak resident set (``VmHWM`` of ``/proc/self/status``) over the steps, less
  its resident set (``VmRSS``) just before the model is built. The baseline is taken after torch
  and every module of the step have been imported (a one-layer, 8-wide model of the same
  architecture is built and dropped first: transformers imports a model type's code on its first
  build, ~140 MB for the Llama), and the peak counter is reset there
  (``/proc/self/clear_refs`` = 5), so the figure is what building and training the model adds:
  what the estimate claims to count, not the interpreter and the libraries, which a node has
  loaded before it decides whether a run fits (and which ``MemAvailable`` already excludes).
* CUDA: ``torch.cuda.max_memory_allocated`` over the steps (the caching allocator's peak of live
  tensors; the CUDA context is not in it).

Each setting is measured in ``--repeats`` fresh processes (3) and the median peak reported (one
process's CPU peak moves by ~10 % either way: glibc's per-thread heaps). Prints one row per
setting: estimate, measured, estimate / measured. ``--json`` prints the rows
as JSON lines. Exit 0; a child that fails prints its error and the tool exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SETTINGS = (("gpt", 32), ("gpt", 64), ("llama", 16), ("llama", 32))
SEQ_LEN = 128


def spec_for(model: str, micro_batch: int, seq_len: int) -> Any:
    """The run's ``ModelSpec``: the built-in GPT or the ``bench converge --model llama`` Llama,
    batch = micro-batch (one pass a step) unless ``--passes`` splits it."""
    from distronet.node.bench.converge_llama import LlamaShape
    from distronet.node.models.spec import ModelSpec

    if model == "gpt":
        return ModelSpec.from_run({"arch": "gpt", "seq_len": seq_len, "batch": micro_batch})
    if model == "llama":
        table = {"arch": "hf", "hf": LlamaShape().hf_config(), "seq_len": seq_len, "batch": micro_batch}
        return ModelSpec.from_run(table)
    raise SystemExit(f"unknown model {model!r} (gpt, llama)")


def _tiny(spec: Any) -> Any:
    """A one-layer, 8-wide model of ``spec``'s architecture: building it imports the model's code
    (transformers loads a model type's modules on first use) and allocates almost nothing."""
    import dataclasses

    from distronet.node.models.spec import GPTConfig

    if spec.gpt is not None:
        return dataclasses.replace(spec, gpt=GPTConfig(depth=1, width=8, heads=1, context=8, vocab=8))
    cfg = dict(spec.hf_config(), vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
               num_attention_heads=1, num_key_value_heads=1, head_dim=8)  # fmt: skip
    return dataclasses.replace(spec, hf_json=json.dumps(cfg))


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import hashlib

    import numpy as np
    import torch

    from distronet.node.backends import TorchBackend
    from distronet.node.daemon.trainer import Trainer
    from distronet.node.exchange.memory import MemoryHub
    from distronet.node.models import fit
    from distronet.node.models.build import build_model, set_checkpointing
    from distronet.node.optim.config import preset
    from distronet.node.optim.distro import DistroOptimizer
    from distronet.node.optim.roles import tensor_roles
    from distronet.protocol.identity import Identity

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backend = TorchBackend(device, "auto")
    rows = args.micro_batch * args.passes
    spec = spec_for(args.model, rows, args.seq_len)
    dcfg = preset("ours_k32", run_id="fit-check")
    est = fit.estimate(spec, dcfg, micro_batch=args.micro_batch, checkpointing=args.checkpointing,
                       device=device.type, precision=backend.precision)  # fmt: skip
    rng = np.random.default_rng(0)

    def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
        w = rng.integers(0, spec.vocab, size=(rows, spec.seq_len + 1), dtype=np.int64)
        return w[:, :-1], w[:, 1:]

    ident = Identity.from_seed(hashlib.sha256(b"fit-check").digest())
    build_model(_tiny(spec), torch.device("cpu"))  # imports the model's modules (module doc)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = int(torch.cuda.memory_allocated(device))
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from here
        base = _status_kb("VmRSS")
    model = build_model(spec, device)
    if args.checkpointing:
        set_checkpointing(model)
    ex = MemoryHub().join(ident.peer_id)
    opt = DistroOptimizer(model.named_parameters(), dcfg, ex, ident, roles=tensor_roles(model))
    trainer = Trainer(model, opt, batches, backend, args.micro_batch)
    for step in range(args.steps):
        trainer.step(step)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device)) - base
        how = "torch.cuda.max_memory_allocated"
    else:
        peak = _status_kb("VmHWM") - base
        how = "VmHWM - VmRSS before the build"
    return {
        "model": args.model, "micro_batch": args.micro_batch, "passes": args.passes,
        "seq_len": spec.seq_len, "checkpointing": args.checkpointing, "device": device.type,
        "precision": backend.precision, "n_parameters": est.n_parameters, "estimate_bytes": est.total,
        "measured_bytes": peak, "ratio": est.total / peak, "measured_as": how,
        "breakdown": {k: getattr(est, k) for k in ("parameters", "gradients", "optimizer",
                                                   "activations", "allocator", "codec", "runtime")},
        "torch_threads": torch.get_num_threads(), "steps": args.steps,
    }  # fmt: skip


def measure(
    model: str,
    micro_batch: int,
    *,
    device: str = "cpu",
    seq_len: int = SEQ_LEN,
    steps: int = 3,
    passes: int = 1,
    checkpointing: bool = False,
    threads: int = 0,
    timeout_s: float = 600.0,
    repeats: int = 3,
) -> dict[str, Any]:
    """Run ``repeats`` measurements, each in a fresh subprocess; the row (``child``) of the median
    measured peak, with every run's peak in ``measured_runs``. One process's CPU peak moves by
    about 10 % either way from run to run (glibc's per-thread heaps: 612-727 MB for the same
    Llama step with checkpointing, 2026-12-06, machine D), more on a loaded machine. Raises
    ``RuntimeError``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model,
           "--micro-batch", str(micro_batch), "--device", device, "--seq-len", str(seq_len),
           "--steps", str(steps), "--passes", str(passes), "--threads", str(threads)]  # fmt: skip
    if checkpointing:
        cmd.append("--checkpointing")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    rows: list[dict[str, Any]] = []
    for _ in range(max(1, repeats)):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"fit_check child {model} mb {micro_batch} failed ({proc.returncode}):\n{proc.stderr}"
            )
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    rows.sort(key=lambda r: r["measured_bytes"])
    row = rows[len(rows) // 2]
    row["measured_runs"] = [r["measured_bytes"] for r in rows]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("gpt", "llama"), help="one model (default: the table's settings)")
    p.add_argument("--micro-batch", type=int, default=0, help="windows per pass (with --model)")
    p.add_argument("--passes", type=int, default=1, help="passes a step (batch = micro-batch x passes)")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--steps", type=int, default=3, help="steps (the heap's high water settles by the 3rd)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes a setting (median reported)")
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    settings = [(args.model, args.micro_batch or 32)] if args.model else list(DEFAULT_SETTINGS)
    if not args.json:
        print(
            f"{'model':6} {'mb':>4} {'passes':>6} {'ckpt':>5} {'estimate MB':>12} {'measured MB':>12} "
            f"{'ratio':>6}"
        )
    code = 0
    for model, mb in settings:
        try:
            row = measure(
                model, mb, device=args.device, seq_len=args.seq_len, steps=args.steps,
                passes=args.passes, checkpointing=args.checkpointing, threads=args.threads,
                repeats=args.repeats,
            )  # fmt: skip
        except RuntimeError as e:
            print(e, file=sys.stderr)
            code = 1
            continue
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{model:6} {mb:>4} {args.passes:>6} {args.checkpointing!s:>5} "
                  f"{row['estimate_bytes'] / 1e6:>12.1f} {row['measured_bytes'] / 1e6:>12.1f} "
                  f"{row['ratio']:>6.3f}")  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
