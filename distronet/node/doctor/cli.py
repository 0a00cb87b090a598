"""`distro-node doctor [--coordinator URL RUN]`: can this machine keep up with a run?

With ``--coordinator URL RUN`` the doctor reads the run's definition (``GET /api/v1/runs/RUN``,
a few KB) and measures that run's model, micro-batch, sequence length and round deadline, and
the transfer rate to that coordinator; without it, a named local model (``--model gpt``, the
built-in GPT at the run defaults, or ``llama``) offline, the node's budgets standing in for the
link. It prints the device, memory, the median of a few real training steps, their peak memory
against what is usable, the packet and a round's bytes, and a verdict line (``doctor.verdict``).

Exit codes (``ExitCode``): 0 keeps up, 9 cannot keep up (the verdict says why and what to
change), 2 bad flags or a run this node cannot train, 3 coordinator unreachable, 4 no such run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from distronet.node.config import DEVICES, NetConfig, TrainConfig
from distronet.node.daemon.parts import exchange_config, optimizer_config, warm_compiled_decoder
from distronet.node.doctor.link import DoctorError, fetch_run, measure_link
from distronet.node.doctor.verdict import Link, Report, StepPlan, judge, render, round_traffic
from distronet.node.exchange.types import ExchangeConfig
from distronet.node.exitcodes import ExitCode
from distronet.node.models.spec import HF_EXTRA_HINT, ModelSpec, hf_installed
from distronet.node.swarm.budget import parse_rate
from distronet.protocol.errors import ConfigError
from distronet.protocol.limits import MAX_PROBE_BYTES

__all__ = ["LOCAL_MODELS", "add_parser", "local_model"]

LOCAL_PEERS = 3  # offline: a round of four nodes, as the tests' swarms
# The local models: the built-in GPT at the run defaults (ModelSpec's batch 8 x 64), and the
# Llama of `bench converge --model llama` (5.26M parameters, 4,096-token vocabulary).
LOCAL_MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"arch": "gpt"},
    "llama": {
        "arch": "hf",
        "batch": 8,
        "seq_len": 128,
        "hf": {
            "model_type": "llama", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 688,
            "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 128, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
            "initializer_range": 0.02,
        },
    },
}  # fmt: skip


def local_model(name: str, batch: int | None, seq_len: int | None) -> ModelSpec:
    """The named local model, with ``batch``/``seq_len`` when given. Raises ``ConfigError``."""
    if name not in LOCAL_MODELS:
        raise ConfigError(f"--model must be one of {', '.join(LOCAL_MODELS)}, got {name!r}")
    table = dict(LOCAL_MODELS[name])
    if batch is not None:
        table["batch"] = batch
    if seq_len is not None:
        table["seq_len"] = seq_len
    return ModelSpec.from_run(table)


def _rates(args: argparse.Namespace) -> tuple[float, float]:
    return parse_rate(args.up), parse_rate(args.down)


def _diagnose(args: argparse.Namespace, plan: StepPlan) -> Report:
    """Everything the doctor measures, in order: the run, the link, the steps. Raises
    ``DoctorError`` and ``ConfigError``."""
    up_budget, down_budget = _rates(args)
    if args.coordinator:
        url, run_id = args.coordinator[0].rstrip("/"), args.coordinator[1]
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--coordinator must be an http(s) URL, got {url!r}")
        info = asyncio.run(fetch_run(url, run_id))
        spec = ModelSpec.from_run(info["model"])
        dcfg = optimizer_config(run_id, info["optimizer"])
        deadline = exchange_config(info["exchange"]).round_deadline_s
        live = info.get("progress", {}).get("peers_live", 0)
        peers = args.peers if args.peers is not None else max(1, live if isinstance(live, int) else 0)
        link = asyncio.run(measure_link(url, run_id, args.probe_bytes, args.probes))
        source = f"run {run_id}"
    else:
        run_id = None
        spec = local_model(args.model, args.batch, args.seq_len)
        dcfg = optimizer_config("doctor", {})
        deadline = args.round_deadline_s or ExchangeConfig().round_deadline_s
        peers = LOCAL_PEERS if args.peers is None else args.peers
        link = Link(None, None, None, 0, 0, "no --coordinator: the budgets stand in")
        source = "local"
    if spec.arch == "hf" and not hf_installed():
        raise ConfigError(f"this model (arch 'hf') needs transformers, not installed here: {HF_EXTRA_HINT}")

    # as `join` before torch loads, and before its first step: the same OpenMP spinning, and
    # the payload decoder's compiled walk ready (else the first decodes take the reference path)
    spin = TrainConfig().omp_spincount
    if spin and "torch" not in sys.modules:
        os.environ["GOMP_SPINCOUNT"] = str(spin)
    import torch  # loads here: the flags and the coordinator were checked first

    warm_compiled_decoder()

    from distronet.node.backends import pick_backend
    from distronet.node.doctor.machine import describe_machine
    from distronet.node.doctor.measure import measure_steps

    if args.threads:
        torch.set_num_threads(args.threads)
    backend = pick_backend(args.device)
    machine = describe_machine(backend)
    step = measure_steps(spec, dcfg, backend, plan, peers=peers, source=source)
    traffic = round_traffic(step.packet_bytes, peers, deadline, up_budget, down_budget, link)
    return Report(run_id, machine, step, link, traffic, judge(step, traffic))


def _main(args: argparse.Namespace) -> int:
    try:
        if args.peers is not None and not 0 <= args.peers <= 4096:
            raise ConfigError(f"--peers must be in 0..4096, got {args.peers}")
        if not 1 <= args.probe_bytes <= MAX_PROBE_BYTES or not 1 <= args.probes <= 10:
            raise ConfigError(f"--probe-bytes must be in 1..{MAX_PROBE_BYTES} and --probes in 1..10")
        if args.threads < 0:
            raise ConfigError(f"--threads must be >= 0, got {args.threads}")
        if args.round_deadline_s is not None and args.round_deadline_s <= 0:
            raise ConfigError("--round-deadline-s must be > 0")
        _rates(args)
        plan = StepPlan(args.warmup, args.steps, args.micro_batch, args.activation_checkpointing)
        rep = _diagnose(args, plan)
    except DoctorError as e:
        print(f"distro-node doctor: {e}", file=sys.stderr)
        return int(e.exit_code)
    except ConfigError as e:
        print(f"distro-node doctor: {e}", file=sys.stderr)
        return int(ExitCode.USAGE)
    print(json.dumps(rep.as_json(), indent=2) if args.json else render(rep))
    return int(ExitCode.OK if rep.verdict.keeps_up else ExitCode.CANNOT_KEEP_UP)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node doctor`."""
    net = NetConfig()
    p = sub.add_parser(
        "doctor",
        help="can this machine keep up with a run? (device, memory, step time, link, verdict)",
        description="Measure this machine against a run (or a local model) and say whether it keeps up "
        "with the run's round deadline. Exit 0: keeps up; 9: cannot; 3: coordinator unreachable; "
        "4: no such run; 2: bad flags.",
    )
    p.add_argument("--coordinator", nargs=2, metavar=("URL", "RUN"), help="measure against this run")
    p.add_argument(
        "--model", default="gpt", choices=sorted(LOCAL_MODELS), help="local model (no --coordinator)"
    )
    p.add_argument("--batch", type=int, default=None, help="local model: windows a step (default 8)")
    p.add_argument("--seq-len", type=int, default=None, help="local model: tokens a window")
    p.add_argument(
        "--round-deadline-s", type=float, default=None, help="local model: the round deadline (5.0)"
    )
    p.add_argument(
        "--micro-batch", type=int, default=0, help="windows a pass (0: the run's, else the whole batch)"
    )
    p.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute activations in backward"
    )
    p.add_argument("--device", default="auto", choices=DEVICES, help="what trains (as join's --device)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--steps", type=int, default=5, help="timed steps (the median is reported)")
    p.add_argument(
        "--peers",
        type=int,
        default=None,
        help=f"others in a round (default: the run's live nodes; {LOCAL_PEERS} offline)",
    )
    p.add_argument("--up", default=net.up, help=f"upload budget, as join's --up (default {net.up})")
    p.add_argument("--down", default=net.down, help=f"download budget, as join's --down (default {net.down})")
    p.add_argument("--probe-bytes", type=int, default=1 << 20, help="bytes each transfer probe carries")
    p.add_argument("--probes", type=int, default=3, help="transfer probes each way (the median is reported)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_main)
