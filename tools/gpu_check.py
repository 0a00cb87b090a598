"""GPU readiness check (issue 18): the DisTrO step on CUDA, measured in one short run.

    python tools/gpu_check.py --out DIR                      # on a CUDA machine (< 8 min on an H200)
    python tools/gpu_check.py --out DIR --device cpu --small  # the same code path, tiny, seconds (CI)

Writes ``DIR/gpu_check.json`` (every figure) and ``DIR/gpu_check.txt`` (a short summary); the JSON
is rewritten after every section, so a run cut short still leaves what it measured. Sections
(each records its own ``error`` and traceback instead of stopping the run):

* ``environment``: torch, CUDA, the device, numba, cupy, the commit.
* ``static_candidates``: every line of ``distronet/node/optim`` and ``distronet/kernels`` that
  matches a host round-trip pattern (``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()``,
  ``float/int/bool`` of a tensor, ``torch.from_numpy``): candidates for docs/gpu.md's table
  (numpy-only lines match too; the table says which are real).
* ``step``: per preset, one node (``MemoryHub``, one peer: it publishes, collects and applies
  its own packet) training the GPT-2-small shape (``[model] arch = "hf"``, ``model_type = gpt2``:
  12 layers, 768 wide, 12 heads, vocabulary 50257, context 1024) built by the project's
  ``models.build.build_model``, with ``DistroOptimizer``: micro-batch chosen to fit (a forward and
  backward tried at each candidate, largest first), then warm-up steps and measured steps,
  timed per phase (train = forward + backward + the trainer's ``float(loss)``, ``begin_step``,
  ``finish_step``; the device synchronised at each phase's end), peak memory
  (``torch.cuda.max_memory_allocated`` over the measured steps; the process's RSS on the CPU)
  and packet bytes. Then, time allowing, ``--peers`` replicas over one hub (each decoding
  every frame itself, no shared cache): replica 0's phase times and whether the replicas stayed
  bit-identical.
* ``parity``: the same momentum tensors (the DCT of one backward's gradients, made on the
  device, copied to the CPU) packed by ``build_packet`` on the device and on the CPU: frames
  byte-equal, indices equal (apart from exact ties in magnitude: all-zero chunks, e.g.
  embedding rows of tokens not in the batch, select arbitrarily), values within the value
  coding's rounding after decoding both; decode parity (``open_round`` + ``aggregate.round_sums``
  of a two-packet round on the device and on the CPU); the DCT of the same gradients on both.
* ``host_syncs``: one node's steps under ``torch.cuda.set_sync_debug_mode("warn")``: every
  synchronising CUDA operation (device-to-host copies, ``.item()``, host-to-device copies from
  pageable memory, ...) counted per phase per step, by source line, with a profiler's count of
  CUDA synchronise and memcpy calls beside it. Not applicable on the CPU (counted as 0).
* ``cupy``: the comparison slot for cupy kernels against the torch path; today "no cupy
  kernels" (``CUPY_COMPARISONS`` is where one would be registered).

Time guard: ``--budget-s`` (default 420): sections and step loops stop early when it runs out
(recorded as ``skipped``), and a watchdog writes the JSON and exits 3 at budget + 60 s.
Exit status: 0 when every section ran without error, 1 when one recorded an error, 2 for bad
arguments (``--device cuda`` without CUDA), 3 from the watchdog.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, str(ROOT))

from distronet.kernels.coding_values import ValueCoding, quantise, scales_from_codes  # noqa: E402
from distronet.kernels.dct import dct_chunks  # noqa: E402
from distronet.node.backends.base import TorchBackend  # noqa: E402
from distronet.node.exchange.base import Exchange, Forwarding  # noqa: E402
from distronet.node.exchange.memory import MemoryHub  # noqa: E402
from distronet.node.models.build import build_model  # noqa: E402
from distronet.node.models.spec import ModelSpec  # noqa: E402
from distronet.node.optim.aggregate import round_sums  # noqa: E402
from distronet.node.optim.config import DistroConfig, preset  # noqa: E402
from distronet.node.optim.distro import DistroOptimizer  # noqa: E402
from distronet.node.optim.packets import (  # noqa: E402
    TensorPlan,
    build_packet,
    open_frames,
    open_round,
    to_momentum,
)
from distronet.node.optim.roles import tensor_roles  # noqa: E402
from distronet.protocol.errors import RejectCode  # noqa: E402
from distronet.protocol.identity import Identity  # noqa: E402

SCHEMA = 1
GPT2_SMALL: dict[str, Any] = {
    "model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
    "vocab_size": 50257, "n_positions": 1024,
}  # fmt: skip
GPT2_TINY: dict[str, Any] = {
    "model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "n_positions": 64,
    "bos_token_id": 511, "eos_token_id": 511,
}  # fmt: skip
AUDIT_DIRS = ("distronet/node/optim", "distronet/kernels")
AUDIT_PATTERNS: dict[str, str] = {
    ".item()": r"\.item\(\)",
    ".cpu()": r"\.cpu\(\)",
    ".numpy()": r"\.numpy\(\)",
    ".tolist()": r"\.tolist\(\)",
    "float/int/bool of a tensor": (
        r"\b(?:float|int|bool)\((?:torch\.|[A-Za-z_][\w.\[\]]*\.(?:min|max|sum|all|any|norm)\()"
    ),
    "torch.from_numpy": r"torch\.from_numpy\(",
}
NEAR_TIE_RTOL = 1e-4
"""From the gradients (each device its own DCT), a chunk's selections may differ where two
magnitudes are within the DCT's rounding: counted as (near) ties within this relative margin."""
SYNC_MESSAGE = "synchroniz"  # torch's "called a synchronizing CUDA operation"
CUPY_COMPARISONS: dict[str, Callable[[torch.device], dict[str, Any]]] = {}
"""A cupy kernel's comparison against the torch path on the same tensors, by kernel name: a
function of the device returning its figures (ms of each, max difference). None exist."""


# ---------------------------------------------------------------------------------------------
# run bookkeeping


class Run:
    """The results document, the output files and the time budget."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.budget_s = budget_s
        self.doc: dict[str, Any] = {"schema": SCHEMA, "sections": {}}
        self.errors = 0
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def write(self) -> None:
        with self._lock:
            self.doc["elapsed_s"] = round(time.monotonic() - self.t0, 2)
            text = json.dumps(self.doc, indent=1, default=str)
            tmp = self.out / "gpu_check.json.tmp"
            tmp.write_text(text)
            tmp.replace(self.out / "gpu_check.json")

    def section(self, name: str, fn: Callable[[], Any], need_s: float = 0.0) -> Any:
        """Run one section into ``doc["sections"][name]``: its result, or ``skipped``/``error``."""
        if self.left() < need_s:
            self.doc["sections"][name] = {
                "skipped": f"time budget ({self.left():.0f} s left, needs {need_s:.0f})"
            }
            self.write()
            return None
        t = time.monotonic()
        try:
            res = fn()
        except Exception as e:  # a failing section is a finding: record it and go on
            res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=12)}
        if isinstance(res, dict):
            res.setdefault("seconds", round(time.monotonic() - t, 2))
            self.errors += "error" in res  # raised, or recorded by a section that went on after it
        self.doc["sections"][name] = res
        self.write()
        return res


def _watchdog(run: Run, after_s: float) -> threading.Timer:
    def fire() -> None:
        run.doc["aborted"] = f"watchdog: still running {after_s:.0f} s after the start"
        with contextlib.suppress(Exception):
            run.write()
        os._exit(3)

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "commit": _commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            capability=f"{props.major}.{props.minor}",
            bf16_supported=bool(torch.cuda.is_bf16_supported()),
            matmul_allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
        )
    for mod in ("numba", "transformers", "cupy"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as e:  # a missing or broken optional package is reported
            env[mod] = f"unavailable ({type(e).__name__})"
    from distronet.kernels.coding import warm

    t = time.perf_counter()
    env["compiled_decoder"] = bool(warm())  # as a node does at start-up (numba's cache after once)
    env["compiled_decoder_warm_s"] = round(time.perf_counter() - t, 2)
    return env


# ---------------------------------------------------------------------------------------------
# static audit


def static_candidates(root: Path = ROOT) -> dict[str, Any]:
    """Lines of the optimizer and kernels matching a host round-trip pattern (``AUDIT_PATTERNS``)."""
    found = []
    for d in AUDIT_DIRS:
        for path in sorted((root / d).glob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                for name, pat in AUDIT_PATTERNS.items():
                    if re.search(pat, code):
                        rel = path.relative_to(root).as_posix()
                        found.append({"file": rel, "line": n, "pattern": name, "code": line.strip()})
    return {"dirs": list(AUDIT_DIRS), "count": len(found), "candidates": found}


# ---------------------------------------------------------------------------------------------
# the model, a node, a step


class _Counting(Forwarding):
    """An exchange that records the size of each frame it publishes."""

    def __init__(self, inner: Exchange) -> None:
        super().__init__(inner)
        self.sizes: list[int] = []

    def publish(self, step: int, frame: bytes) -> None:
        self.sizes.append(len(frame))
        self.inner.publish(step, frame)


def model_spec(small: bool, seq_len: int, batch: int) -> ModelSpec:
    hf = GPT2_TINY if small else GPT2_SMALL
    return ModelSpec.from_run({"arch": "hf", "hf": dict(hf), "seed": 0, "batch": batch, "seq_len": seq_len})


def identity(i: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(f"gpu-check/{i}".encode()).digest())


def make_node(
    model: nn.Module, cfg: DistroConfig, hub: MemoryHub, i: int
) -> tuple[DistroOptimizer, _Counting]:
    ident = identity(i)
    ex = _Counting(hub.join(ident.peer_id))
    opt = DistroOptimizer(model.named_parameters(), cfg, ex, ident, roles=tensor_roles(model))
    return opt, ex


def batch_of(spec: ModelSpec, batch: int, step: int, peer: int) -> tuple[np.ndarray, np.ndarray]:
    """Random tokens (a step's cost does not depend on which): ``(batch, seq_len)`` x and y."""
    rng = np.random.default_rng([step, peer])
    w = rng.integers(0, spec.vocab, size=(batch, spec.seq_len + 1), dtype=np.int64)
    return w[:, :-1], w[:, 1:]


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_phase(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    backend: TorchBackend,
    xy: tuple[np.ndarray, np.ndarray],
    precision: str,
) -> float:
    """What ``daemon.trainer.Trainer.step`` does before ``optimizer.step()``: batch to the device,
    forward, backward, and its ``float(loss)`` (a host round-trip of the trainer's, per step)."""
    device = backend.device
    xt = torch.from_numpy(np.ascontiguousarray(xy[0])).to(device)
    yt = torch.from_numpy(np.ascontiguousarray(xy[1])).to(device)
    opt.zero_grad(set_to_none=True)
    with autocast(device, precision):
        loss = backend.loss(model, xt, yt)
    loss.backward()
    return float(loss.detach())


def _ms(xs: Sequence[float]) -> float | None:
    return round(1000.0 * statistics.median(xs), 2) if xs else None


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


def choose_micro_batch(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    backend: TorchBackend,
    spec: ModelSpec,
    candidates: Sequence[int],
    precision: str,
    limit_bytes: int | None,
) -> tuple[int, list[dict[str, Any]]]:
    """The largest candidate whose forward + backward peaks under 85 % of ``limit_bytes`` (the
    device's memory; on the CPU the first candidate, tried once). Returns it and the trials."""
    device = backend.device
    trials: list[dict[str, Any]] = []
    chosen: int | None = None
    for b in sorted(set(candidates), reverse=True):
        row: dict[str, Any] = {"micro_batch": b}
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            t = time.perf_counter()
            train_phase(model, opt, backend, batch_of(spec, b, 0, 0), precision)
            _sync(device)
            row["train_ms"] = round(1000 * (time.perf_counter() - t), 1)
            peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else _rss()
            row["peak_bytes"] = peak
            fits = limit_bytes is None or peak <= 0.85 * limit_bytes
            row["fits"] = fits
        except torch.cuda.OutOfMemoryError:
            row["fits"], row["oom"] = False, True
        opt.zero_grad(set_to_none=True)
        trials.append(row)
        if row["fits"]:
            chosen = b
            break
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if chosen is None:
        raise RuntimeError(f"no micro-batch of {sorted(candidates)} fits: {trials}")
    return chosen, trials


def _phase_times(
    models: list[nn.Module],
    opts: list[DistroOptimizer],
    backend: TorchBackend,
    spec: ModelSpec,
    batch: int,
    steps: int,
    warmup: int,
    precision: str,
    run: Run,
    reserve_s: float,
) -> dict[str, Any]:
    """Steps of every replica (all publish, then all collect); replica 0's phases timed."""
    device = backend.device
    times: dict[str, list[float]] = {"train": [], "begin_step": [], "finish_step": [], "step": []}
    losses: list[float] = []
    peak = 0
    done = 0
    for s in range(warmup + steps):
        if s == warmup:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            peak = _rss()
        if s >= warmup and done and run.left() < reserve_s:
            break
        t_step: dict[str, float] = {}
        for i, (model, opt) in enumerate(zip(models, opts, strict=True)):
            _sync(device)
            t = time.perf_counter()
            loss = train_phase(model, opt, backend, batch_of(spec, batch, s, i), precision)
            _sync(device)
            t1 = time.perf_counter()
            opt.begin_step()
            _sync(device)
            if i == 0:
                t_step["train"], t_step["begin_step"] = t1 - t, time.perf_counter() - t1
                losses.append(loss)
        for i, opt in enumerate(opts):
            t = time.perf_counter()
            opt.finish_step()
            _sync(device)
            if i == 0:
                t_step["finish_step"] = time.perf_counter() - t
        if device.type != "cuda":
            peak = max(peak, _rss())
        if s >= warmup:
            done += 1
            t_step["step"] = t_step["train"] + t_step["begin_step"] + t_step["finish_step"]
            for k, v in t_step.items():
                times[k].append(v)
    out: dict[str, Any] = {f"{k}_ms": _ms(v) for k, v in times.items()}
    out["steps_measured"] = done
    out["warmup_steps"] = warmup
    out["step_ms_all"] = [round(1000 * v, 2) for v in times["step"]]
    if device.type == "cuda":
        out["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        out["max_memory_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    else:
        out["peak_rss_bytes"] = peak
    step_s = statistics.median(times["step"]) if times["step"] else None
    out["tokens_per_s"] = round(batch * spec.seq_len / step_s, 1) if step_s else None
    out["loss_first_last"] = [round(losses[0], 4), round(losses[-1], 4)] if losses else None
    return out


def _digest_ms(model: nn.Module, opt: DistroOptimizer, device: torch.device) -> float:
    """ms of ``daemon.trainer.replica_digest``, which the daemon runs after every step
    (``daemon/loops.py``): a copy of every parameter to the host on a device."""
    from distronet.node.daemon.trainer import replica_digest

    _sync(device)
    t = time.perf_counter()
    replica_digest(model, opt)
    return round(1000 * (time.perf_counter() - t), 2)


def step_section(
    args: argparse.Namespace, run: Run, device: torch.device, preset_name: str
) -> dict[str, Any]:
    backend = TorchBackend(device)
    cfg = preset(preset_name, total_steps=1000)
    spec = model_spec(args.small, args.seq_len, 1)
    model = build_model(spec, device)
    hub = MemoryHub()
    opt, ex = make_node(model, cfg, hub, 0)
    params = sum(p.numel() for p in model.parameters())
    out: dict[str, Any] = {
        "preset": preset_name,
        "model": dict(GPT2_TINY if args.small else GPT2_SMALL),
        "parameters": params,
        "tensors": len(opt.plans),
        "seq_len": spec.seq_len,
        "precision": args.precision,
    }
    if device.type == "cuda":
        out["memory_after_build_bytes"] = int(torch.cuda.memory_allocated(device))
        limit = (
            int(args.memory_gb * 2**30)
            if args.memory_gb
            else torch.cuda.get_device_properties(device).total_memory
        )
    else:
        limit = None
    if args.micro_batch:
        batch, trials = args.micro_batch, list[dict[str, Any]]()
    else:
        batch, trials = choose_micro_batch(model, opt, backend, spec, args.candidates, args.precision, limit)
    out["micro_batch"], out["micro_batch_trials"] = batch, trials
    run.doc["sections"][f"step/{preset_name}"] = out
    run.write()
    try:
        one = _phase_times(
            [model], [opt], backend, spec, batch, args.steps, args.warmup, args.precision, run, 60
        )
    except Exception as e:  # the fit trials above are worth keeping: record and stop here
        out["error"] = f"one node: {type(e).__name__}: {e}"
        out["one_node"] = {"error": out["error"], "trace": traceback.format_exc(limit=10)}
        return out
    one["packet_bytes"] = ex.sizes[-1] if ex.sizes else None
    one["replicas"] = 1
    one["daemon_digest_ms"] = _digest_ms(model, opt, device)
    out["one_node"] = one
    run.write()
    del opt, model, hub
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.peers > 1 and run.left() > 90:
        from distronet.node.daemon.trainer import param_digest

        hub = MemoryHub()
        models = [build_model(spec, device) for _ in range(args.peers)]
        nodes = [make_node(m, cfg, hub, i) for i, m in enumerate(models)]
        opts = [o for o, _ in nodes]
        swarm = _phase_times(
            models, opts, backend, spec, batch, args.steps, args.warmup, args.precision, run, 45
        )
        swarm["packet_bytes"] = nodes[0][1].sizes[-1] if nodes[0][1].sizes else None
        swarm["replicas"] = args.peers
        digests = {param_digest(m) for m in models}
        swarm["replicas_identical"] = len(digests) == 1
        swarm["accepted_last_round"] = len(opts[0].reports[-1].accepted) if opts[0].reports else 0
        out["swarm"] = swarm
        del opts, nodes, models, hub
        if device.type == "cuda":
            torch.cuda.empty_cache()
    elif args.peers > 1:
        out["swarm"] = {"skipped": "time budget"}
    return out


# ---------------------------------------------------------------------------------------------
# parity


def _levels(coding: ValueCoding, val: np.ndarray) -> np.ndarray:
    """Per chunk of ``val`` ``(n, k)`` (pre-quantisation values), the value coding's rounding
    step: the scale for INT8 (one integer level) and SIGN1 (|deq| is the scale), the spacing of
    float16/bfloat16 at the chunk's largest value, 0 for FP32 (exact)."""
    if coding in (ValueCoding.INT8, ValueCoding.SIGN1):
        coded, _ = quantise(val, coding)
        assert coded.scale_codes is not None
        scales: np.ndarray = scales_from_codes(coded.scale_codes, coding.scale_step(val.shape[1]))
        return scales.astype(np.float64)
    top = np.abs(val).max(axis=1).astype(np.float64) if val.size else np.zeros(val.shape[0])
    if coding == ValueCoding.FP16:
        return top * 2.0**-10
    if coding == ValueCoding.BF16:
        return top * 2.0**-7
    return np.zeros(val.shape[0])


def _tie_chunk(a: np.ndarray, b: np.ndarray, rtol: float) -> bool:
    """Whether two selections of one chunk (their magnitudes ``a``, ``b``) differ only by a tie:
    equal sorted magnitudes (within ``rtol`` of the chunk's largest; 0: exactly)."""
    sa, sb = np.sort(np.abs(a.astype(np.float64))), np.sort(np.abs(b.astype(np.float64)))
    top = max(float(sa.max(initial=0.0)), float(sb.max(initial=0.0)))
    return bool(np.all(np.abs(sa - sb) <= rtol * top))


def compare_packets(
    plans: Sequence[TensorPlan],
    cfg: DistroConfig,
    momenta: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
    frames: tuple[bytes, bytes],
    digest: bytes,
    rtol: float = 0.0,
) -> dict[str, Any]:
    """Decode packets ``frames`` (a, b) built from ``momenta`` (a's and b's, CPU) and compare them
    tensor by tensor: chunks whose indices differ (a tie within ``rtol``, or not), and on the
    chunks whose indices agree, the largest value difference beyond the inputs' own difference,
    in units of the value coding's rounding step (``_levels``; within rounding: <= 1)."""
    shapes = [(p.layout.n_chunks, p.layout.chunk_numel) for p in plans]
    fa, fb = open_frames(list(frames), run_id=cfg.run_id, digest=digest, shapes=shapes, workers=1)
    if isinstance(fa, RejectCode) or isinstance(fb, RejectCode):
        raise RuntimeError(f"a parity packet was refused: {fa!r}, {fb!r}")
    chunks = tie_chunks = bad_chunks = 0
    worst = 0.0
    bad_tensors: list[str] = []
    for plan, ma, mb, a, b in zip(plans, momenta[0], momenta[1], fa.tensors(), fb.tensors(), strict=True):
        xa, xb = ma.numpy(), mb.numpy()
        coding = cfg.extraction.dense_value_coding if plan.dense else cfg.extraction.value_coding
        chunks += a.idx.shape[0]
        same_rows = np.all(a.idx == b.idx, axis=1)
        for r in np.flatnonzero(~same_rows):
            if _tie_chunk(xa[r, a.idx[r]], xb[r, b.idx[r]], rtol):
                tie_chunks += 1
            else:
                bad_chunks += 1
                bad_tensors.append(plan.name)
        if not same_rows.any():
            continue
        ia = a.idx[same_rows]
        va = np.take_along_axis(xa[same_rows], ia, axis=1).astype(np.float64)
        vb = np.take_along_axis(xb[same_rows], ia, axis=1).astype(np.float64)
        level = _levels(coding, va.astype(np.float32))[:, None]
        excess = np.abs(a.val[same_rows].astype(np.float64) - b.val[same_rows]) - np.abs(va - vb)
        excess = np.maximum(excess, 0.0)
        ratio = np.where(excess == 0, 0.0, excess / np.where(level > 0, level, 1.0))
        ratio = np.where((excess > 0) & (level == 0), np.inf, ratio)
        worst = max(worst, float(ratio.max()))
    return {
        "frames_identical": frames[0] == frames[1],
        "chunks": chunks,
        "index_mismatch_chunks": tie_chunks + bad_chunks,
        "index_mismatch_ties": tie_chunks,
        "index_mismatch_not_tie": bad_chunks,
        "tie_rtol": rtol,
        "mismatch_tensors": sorted(set(bad_tensors))[:10],
        "value_max_diff_levels": worst,
        "values_within_rounding": worst <= 1.0 + 1e-6,
    }


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    scale = float(b64.abs().max()) or 1.0
    return float((a64 - b64).abs().max()) / scale


def _held(plans: Sequence[TensorPlan], chunks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Chunk-order coefficients in each plan's momentum layout (what ``build_packet`` reads)."""
    return [to_momentum(plan, c) for plan, c in zip(plans, chunks, strict=True)]


def parity_section(args: argparse.Namespace, device: torch.device, preset_name: str) -> dict[str, Any]:
    cpu = torch.device("cpu")
    backend = TorchBackend(device)
    cfg = preset(preset_name, total_steps=1000)
    spec = model_spec(args.small, min(args.seq_len, 128), 1)
    model = build_model(spec, device)
    hub = MemoryHub()
    opt, _ = make_node(model, cfg, hub, 0)
    train_phase(model, opt, backend, batch_of(spec, 2, 0, 0), args.precision)
    params = [p for _, p in model.named_parameters()]  # the optimizer's order (its plans')
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    # cloned: a transform's result may be a view of a scratch buffer the next transform reuses
    dev_m = [
        dct_chunks(g.detach().float(), plan.layout).clone() for plan, g in zip(opt.plans, grads, strict=True)
    ]
    cpu_g = [g.detach().float().cpu() for g in grads]
    cpu_m_own = [dct_chunks(g, plan.layout).clone() for plan, g in zip(opt.plans, cpu_g, strict=True)]
    dct_err = max(_rel_err(a, b) for a, b in zip(dev_m, cpu_m_own, strict=True))
    cpu_m = [m.cpu() for m in dev_m]  # the same momentum tensors, bit for bit
    ident = identity(0)
    frame_dev, sent_dev = build_packet(opt.plans, _held(opt.plans, dev_m), cfg, 0, ident, opt.digest)
    frame_cpu, sent_cpu = build_packet(opt.plans, _held(opt.plans, cpu_m), cfg, 0, ident, opt.digest)
    same = compare_packets(opt.plans, cfg, (cpu_m, cpu_m), (frame_dev, frame_cpu), opt.digest)
    same["sent_identical"] = all(
        torch.equal(a.idx.cpu(), b.idx) and torch.equal(a.val.cpu(), b.val)
        for a, b in zip(sent_dev, sent_cpu, strict=True)
    )
    same["sent_on_device"] = sorted({f"{s.idx.device.type}/{s.val.device.type}" for s in sent_dev})
    # from the gradients: each device its own DCT, then its own top-k (rounding may swap near-ties)
    frame_own, _ = build_packet(opt.plans, _held(opt.plans, cpu_m_own), cfg, 0, ident, opt.digest)
    grads_path = compare_packets(
        opt.plans, cfg, (cpu_m, cpu_m_own), (frame_dev, frame_own), opt.digest, rtol=NEAR_TIE_RTOL
    )
    # decode parity: a round of two packets (the second from another peer, another momentum)
    other = [m.roll(1, dims=0) * 0.5 for m in cpu_m]
    frame_two, _ = build_packet(opt.plans, _held(opt.plans, other), cfg, 0, identity(1), opt.digest)
    frames = {ident.peer_id: frame_cpu, identity(1).peer_id: frame_two}
    sums_dev = round_sums(open_round(frames, opt.plans, cfg, 0, opt.digest, device), opt.plans, device)
    sums_dev = [t.clone() for t in sums_dev]  # the CPU's sums may land in the same scratch buffer
    sums_cpu = round_sums(open_round(frames, opt.plans, cfg, 0, opt.digest, cpu), opt.plans, cpu)
    decode_err = max(_rel_err(a, b) for a, b in zip(sums_dev, sums_cpu, strict=True))
    return {
        "preset": preset_name,
        "value_coding": cfg.extraction.value_coding.name,
        "dense_value_coding": cfg.extraction.dense_value_coding.name,
        "same_momentum": same,
        "from_gradients": grads_path,
        "dct_max_rel_err": dct_err,
        "decode_max_rel_err": decode_err,
        "decode_on_device": sorted({t.device.type for t in sums_dev}),
        "ok": bool(
            same["index_mismatch_not_tie"] == 0
            and same["values_within_rounding"]
            and dct_err < 1e-4
            and decode_err < 1e-4
        ),
    }


# ---------------------------------------------------------------------------------------------
# host round-trips


class SyncLog:
    """Synchronising CUDA operations by phase and by source site."""

    def __init__(self) -> None:
        self.phase = "other"
        self.sites: dict[str, Counter[str]] = {}
        self.messages: Counter[str] = Counter()

    def add(self, site: str, message: str) -> None:
        self.sites.setdefault(self.phase, Counter())[site] += 1
        self.messages[message[:120]] += 1


def _rel(filename: str, root: Path) -> str | None:
    """``filename`` relative to ``root`` when it is this project's (``distronet/`` or ``tools/``)."""
    p = Path(filename).resolve()
    if not p.is_relative_to(root):
        return None
    rel = p.relative_to(root).as_posix()
    return rel if rel.startswith(("distronet/", "tools/")) else None


def sync_site(stack: Sequence[traceback.FrameSummary], root: Path = ROOT) -> str:
    """Where a synchronising call was made: ``file:line in function`` of the innermost frame of
    this project (of ``distronet/`` when there is one, else of this tool), up to two of its
    ``distronet`` callers after ``<``, and in brackets the innermost frame outside the project
    (a library's line) when the call was made there."""
    ours = [(f, r) for f in stack if (r := _rel(f.filename, root)) is not None]
    lib = [(f, r) for f, r in ours if r.startswith("distronet/")] or ours
    if not lib:
        return f"{Path(stack[-1].filename).name}:{stack[-1].lineno}" if stack else "unknown"
    names = [f"{r}:{f.lineno} in {f.name}" for f, r in lib]
    site = " < ".join([names[-1], *reversed(names[-3:-1])])
    last = stack[-1] if stack else None
    if last is not None and _rel(last.filename, root) is None:
        parts = Path(last.filename).parts
        short = "/".join(parts[-3:])
        site += f" [{short}:{last.lineno}]"
    return site


@contextlib.contextmanager
def sync_capture(device: torch.device) -> Iterator[SyncLog]:
    """Count synchronising CUDA operations (``set_sync_debug_mode("warn")``) with their sites."""
    log = SyncLog()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:  # fmt: skip
            text = str(message)
            if SYNC_MESSAGE in text:
                stack = traceback.extract_stack()[:-1]
                while stack and stack[-1].filename == warnings.__file__:
                    stack.pop()  # the warnings module's own frames
                log.add(sync_site(stack), text)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        prev = torch.cuda.get_sync_debug_mode() if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield log
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(prev)


def _profile_counts(device: torch.device, fn: Callable[[], None]) -> dict[str, int]:
    """CUDA runtime synchronise and memcpy calls (and memcpy activities) the profiler sees in ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        _sync(device)
    names: Counter[str] = Counter()
    for e in prof.events():
        n = e.name
        if ("Synchronize" in n and n.startswith("cuda")) or "Memcpy" in n or "memcpy" in n:
            names[n] += 1
    return dict(names)


def host_syncs_section(args: argparse.Namespace, device: torch.device, preset_name: str) -> dict[str, Any]:
    backend = TorchBackend(device)
    cfg = preset(preset_name, total_steps=1000)
    spec = model_spec(args.small, min(args.seq_len, 256), 1)
    model = build_model(spec, device)
    hub = MemoryHub()
    opt, _ = make_node(model, cfg, hub, 0)
    steps = 2
    out: dict[str, Any] = {
        "preset": preset_name,
        "steps": steps,
        "mode": "warn" if device.type == "cuda" else None,
    }
    if device.type != "cuda":
        out["note"] = "no CUDA device: nothing to synchronise (counted as 0); the code path ran"
    from distronet.node.daemon.trainer import replica_digest

    # one warm-up step outside the capture: first-use caches (DCT bases, index tables) fill there;
    # when it fails, the captured steps fail at the same place, after counting what came before
    try:
        train_phase(model, opt, backend, batch_of(spec, 1, 0, 0), args.precision)
        opt.begin_step()
        opt.finish_step()
    except Exception as e:  # recorded; the capture below shows where it failed
        out["warmup_error"] = f"{type(e).__name__}: {e}"
        opt = make_node(model, cfg, MemoryHub(), 0)[0]  # a fresh optimizer at step 0
    error = None
    with sync_capture(device) as log:
        try:
            for s in range(1, steps + 1):
                log.phase = "train"
                train_phase(model, opt, backend, batch_of(spec, 1, s, 0), args.precision)
                log.phase = "begin_step"
                opt.begin_step()
                log.phase = "finish_step"
                opt.finish_step()
                log.phase = "daemon_digest"  # daemon/loops.py digests the replica after every step
                replica_digest(model, opt)
                log.phase = "other"
        except Exception as e:  # the sites seen up to the failure are the finding
            error = f"{type(e).__name__}: {e} (in phase {log.phase})"
            out["traceback"] = traceback.format_exc(limit=8)
    phases = {}
    for phase, sites in log.sites.items():
        phases[phase] = {
            "per_step": sum(sites.values()) / steps,
            "sites": [{"site": s, "per_step": n / steps} for s, n in sites.most_common()],
        }
    out["phases"] = phases
    out["optimizer_per_step"] = sum(
        phases.get(p, {}).get("per_step", 0) for p in ("begin_step", "finish_step")
    )
    out["messages"] = dict(log.messages)
    if error:
        out["error"] = error
    elif device.type == "cuda":

        def one() -> None:
            opt.begin_step()
            opt.finish_step()

        try:
            out["profiler_one_optimizer_step"] = _profile_counts(device, one)
        except Exception as e:  # a cross-check only
            out["profiler_one_optimizer_step"] = {"error": f"{type(e).__name__}: {e}"}
    return out


# ---------------------------------------------------------------------------------------------
# cupy


def cupy_section(device: torch.device, root: Path = ROOT) -> dict[str, Any]:
    """The cupy comparison slot: kernels found in the source (``import cupy``) and their figures."""
    try:
        import cupy  # type: ignore[import-not-found,unused-ignore]  # noqa: F401

        importable, why = True, None
    except Exception as e:  # not installed, or no CUDA for it
        importable, why = False, f"{type(e).__name__}: {e}"
    users = sorted(
        p.relative_to(root).as_posix()
        for p in (root / "distronet").rglob("*.py")
        if re.search(r"^\s*(?:import cupy|from cupy)", p.read_text(), re.M)
    )
    out: dict[str, Any] = {
        "cupy_importable": importable,
        "cupy_import_error": why,
        "modules_using_cupy": users,
    }
    if not users and not CUPY_COMPARISONS:
        out["result"] = "no cupy kernels"
        return out
    if not importable:
        out["result"] = "cupy kernels exist but cupy does not import here"
        return out
    out["comparisons"] = {name: fn(device) for name, fn in CUPY_COMPARISONS.items()}
    missing = [u for u in users if not any(Path(u).stem in n for n in CUPY_COMPARISONS)]
    out["result"] = f"modules without a comparison in CUPY_COMPARISONS: {missing}" if missing else "compared"
    return out


# ---------------------------------------------------------------------------------------------
# summary


def _gib(n: Any) -> str:
    return f"{n / 2**30:.2f} GiB" if isinstance(n, int | float) else "?"


def summary(doc: dict[str, Any]) -> str:
    s = doc["sections"]
    env = s.get("environment") or {}
    lines = [
        f"gpu_check: commit {str(env.get('commit', '?'))[:12]}, "
        f"{env.get('device_name', env.get('device', '?'))}, torch {env.get('torch', '?')} "
        f"(CUDA {env.get('torch_cuda')})",
        f"args {doc.get('args')}",
    ]
    for name, sec in s.items():
        if not isinstance(sec, dict):
            continue
        if "error" in sec and not name.startswith("host_syncs"):
            lines.append(f"{name}: ERROR {sec['error']}")
            continue
        if "skipped" in sec:
            lines.append(f"{name}: skipped ({sec['skipped']})")
            continue
        if name.startswith("step/"):
            for row in ("one_node", "swarm"):
                r = sec.get(row)
                if not isinstance(r, dict) or "step_ms" not in r:
                    if isinstance(r, dict):
                        lines.append(f"{name} {row}: {r}")
                    continue
                mem = r.get("max_memory_allocated_bytes", r.get("peak_rss_bytes"))
                extra = (
                    f", replicas identical: {r['replicas_identical']}" if "replicas_identical" in r else ""
                )
                lines.append(
                    f"{name} {row} ({r['replicas']} replica(s), {sec['parameters']:,} params, micro-batch "
                    f"{sec['micro_batch']} x {sec['seq_len']}, {sec['precision']}): step {r['step_ms']} ms "
                    f"(train {r['train_ms']}, begin_step {r['begin_step_ms']}, "
                    f"finish_step {r['finish_step_ms']}), "
                    f"{r['tokens_per_s']} tokens/s, peak {_gib(mem)}, packet {r.get('packet_bytes')} B{extra}"
                )
        elif name.startswith("parity/"):
            sm, fg = sec["same_momentum"], sec["from_gradients"]
            lines.append(
                f"{name}: ok {sec['ok']}; same momentum: frames identical {sm['frames_identical']}, "
                f"index mismatches {sm['index_mismatch_not_tie']} (+{sm['index_mismatch_ties']} ties) of "
                f"{sm['chunks']} chunks, values max {sm['value_max_diff_levels']:.3g} levels; "
                f"from gradients: {fg['index_mismatch_not_tie']} mismatched chunks (+"
                f"{fg['index_mismatch_ties']} near ties), {fg['value_max_diff_levels']:.3g} levels; "
                f"DCT rel err {sec['dct_max_rel_err']:.2e}, decode rel err {sec['decode_max_rel_err']:.2e}"
            )
        elif name.startswith("host_syncs/"):
            head = f"{name}: optimizer {sec.get('optimizer_per_step')} syncs/step"
            if sec.get("error"):
                head += f" (stopped: {sec['error']})"
            lines.append(head)
            for phase, p in sec.get("phases", {}).items():
                top = "; ".join(f"{x['per_step']:g}x {x['site']}" for x in p["sites"][:6])
                lines.append(f"  {phase}: {p['per_step']:g}/step: {top}")
        elif name == "cupy":
            lines.append(f"cupy: {sec.get('result')} (importable: {sec.get('cupy_importable')})")
        elif name == "static_candidates":
            lines.append(f"static candidates: {sec.get('count')} lines in {', '.join(sec.get('dirs', []))}")
    if doc.get("aborted"):
        lines.append(f"ABORTED: {doc['aborted']}")
    lines.append(f"elapsed {doc.get('elapsed_s')} s")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json and gpu_check.txt")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--small", action="store_true", help="a tiny GPT-2 config (seconds, for CI)")
    ap.add_argument("--presets", default="ours_k32,ours_k4_1bit", help="optimizer presets, comma-separated")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="fp32 (the trainer's today) or bf16 autocast around the forward")  # fmt: skip
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per window (default 1024; 32 --small)")
    ap.add_argument("--micro-batch", type=int, default=0, help="windows per step (default: chosen to fit)")
    ap.add_argument("--candidates", default="16,8,4,2,1", help="micro-batches tried, largest first")
    ap.add_argument("--memory-gb", type=float, default=0.0, help="memory to fit in (default: the device's)")
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default 5; 2 --small)")
    ap.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    ap.add_argument("--peers", type=int, default=2, help="replicas of the swarm row (1: none)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="time guard in seconds (default 420)")
    args = ap.parse_args(argv)
    args.seq_len = args.seq_len or (32 if args.small else 1024)
    args.steps = args.steps or (2 if args.small else 5)
    if args.small and args.candidates == "16,8,4,2,1":
        args.candidates = "2"
    args.candidates = [int(c) for c in str(args.candidates).split(",") if c.strip()]
    args.presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args.budget_s)
    run.doc["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    run.doc["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        run.doc["error"] = f"--device {args.device}: CUDA is not available (torch {torch.__version__})"
        run.write()
        print(run.doc["error"], file=sys.stderr)
        return 2
    if device.type not in ("cuda", "cpu"):
        print(f"--device {args.device}: only cuda and cpu", file=sys.stderr)
        return 2
    if device.type == "cuda":
        if device.index is None:  # torch.device("cuda") names no card; the parameters say cuda:N
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    _watchdog(run, args.budget_s + 60)
    run.section("environment", lambda: environment(device))
    run.section("static_candidates", static_candidates)
    for name in args.presets:
        run.section(f"parity/{name}", functools.partial(parity_section, args, device, name), need_s=30)
        run.section(
            f"host_syncs/{name}", functools.partial(host_syncs_section, args, device, name), need_s=30
        )
    for name in args.presets:
        run.section(f"step/{name}", functools.partial(step_section, args, run, device, name), need_s=60)
    run.section("cupy", lambda: cupy_section(device))
    run.doc["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.write()
    text = summary(run.doc)
    (args.out / "gpu_check.txt").write_text(text)
    print(text, end="")
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())
