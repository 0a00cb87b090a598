"""The three measurements of `distro-node bench network`, one function each.

- :func:`compute_only`: ``n`` processes train side by side with no network
  (:mod:`distronet.node.bench.network_compute`); the median of their step rates.
- :func:`shaped_swarm`: ``n`` real nodes in network namespaces on tc-shaped links
  (:mod:`distronet.node.bench.netns`) with overlap on; each node's step rate over ``steps``
  steps after a warm-up, and the busiest 10 s window on each veth against the node's budget.
- :func:`join_to_first_accept`: a real local swarm on loopback; seconds from starting
  ``distro-node join`` for a newcomer until a peer applies a round whose accepted set holds
  the newcomer's packet.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from distronet.node.bench.netns import LinkShape, ShapedNet, VethSampler
from distronet.node.bench.netns_swarm import NetnsSwarm, SwarmFailure, write_shaped_run
from distronet.node.budget import parse_rate
from distronet.node.demo import LocalSwarm

__all__ = ["JoinResult", "ShapedResult", "compute_only", "join_to_first_accept", "shaped_swarm"]

POLL_S = 0.05


def compute_only(
    model: dict[str, Any], optimizer: dict[str, Any], *, n: int, steps: int, warmup: int
) -> list[tuple[float, float]]:
    """Each of ``n`` concurrent compute-only processes' (steps per second, CPU seconds per step),
    one torch thread each.

    Raises SwarmFailure when a process fails or runs past a generous deadline.
    """
    arg = {"model": model, "optimizer": optimizer, "steps": steps, "warmup": warmup, "threads": 1}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "distronet.node.bench.network_compute", json.dumps({**arg, "peer": i})],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(n)
    ]
    rates: list[tuple[float, float]] = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode != 0:
                raise SwarmFailure(f"compute-only worker failed: {err.decode(errors='replace')[-500:]}")
            doc = json.loads(out.decode().strip().splitlines()[-1])
            rates.append((float(doc["steps_per_s"]), float(doc["cpu_s_per_step"])))
    except subprocess.TimeoutExpired:
        raise SwarmFailure("compute-only workers did not finish within 600 s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return rates


@dataclasses.dataclass(frozen=True)
class ShapedResult:
    """Per node: steps/s, CPU seconds per step (node + p2pd), resyncs while timed (a resync
    jumps steps), busiest-window bytes / (budget × window) up and down; whether netem delay was
    applied; whether the replicas were identical at the end."""

    rates: list[float]
    cpu_s_per_step: list[float]
    resyncs: list[int]
    up_ratio: list[float]
    down_ratio: list[float]
    delay_applied: bool
    identical: bool


def _step_rates(
    swarm: LocalSwarm, n: int, start: int, stop: int, timeout: float
) -> tuple[list[float], list[float]]:
    """Per node, steps per second between the first poll that saw it at step >= ``start`` and
    the first that saw it at >= ``stop`` (nan when both were the same poll: a resync jump), and
    CPU seconds per step of the node process and its p2pd over the same steps."""
    first: list[tuple[float, int] | None] = [None] * n
    last: list[tuple[float, int] | None] = [None] * n
    cpu_first: list[float] = [0.0] * n
    cpu_last: list[float] = [0.0] * n
    end = time.monotonic() + timeout
    while any(t is None for t in last):
        now = time.monotonic()
        if now > end:
            raise SwarmFailure(f"nodes did not advance from step {start} to {stop} within {timeout:.0f} s")
        for i in range(n):
            if swarm.nodes[i].poll() is not None:
                raise SwarmFailure(f"node {i} exited with {swarm.nodes[i].returncode}; see {swarm.folder}")
            step = int(swarm.status(i).get("step", -1))
            if first[i] is None and step >= start:
                first[i], cpu_first[i] = (now, step), _cpu_seconds(swarm.nodes[i].pid)
            if last[i] is None and step >= stop:
                last[i], cpu_last[i] = (now, step), _cpu_seconds(swarm.nodes[i].pid)
        time.sleep(POLL_S)
    rates, cpu = [], []
    for i, (a, b) in enumerate(zip(first, last, strict=True)):
        assert a is not None and b is not None
        moved = b[1] - a[1]
        rates.append(moved / (b[0] - a[0]) if b[0] > a[0] else float("nan"))
        cpu.append((cpu_last[i] - cpu_first[i]) / moved if moved > 0 else float("nan"))
    return rates, cpu


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children (the node and its p2pd)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def shaped_swarm(
    folder: Path,
    *,
    n: int,
    link: LinkShape,
    up: str,
    down: str,
    model: dict[str, Any],
    optimizer: dict[str, Any],
    exchange: dict[str, Any],
    warmup: int,
    steps: int,
    prefix: str = "dnb",
    subnet: str = "10.78.0",
) -> ShapedResult:
    """Run ``n`` nodes on shaped links; see the module docstring. Raises SwarmFailure, NetnsError."""
    from distronet.node.demo import common_digests

    run = write_shaped_run(folder, "netbench", model=model, optimizer=optimizer, exchange=exchange)
    with (
        ShapedNet(n, link, prefix=prefix, subnet=subnet) as net,
        NetnsSwarm(net, folder, run, "netbench") as swarm,
    ):
        swarm.start_coordinator()
        with VethSampler(net, interval_s=0.5) as sampler:
            for _ in range(n):
                swarm.start_node("--up", up, "--down", down, min_peers=n)
            swarm.wait_steps(list(range(n)), 0, timeout=240.0)
            before = [int(swarm.status(i).get("resyncs", 0)) for i in range(n)]
            rates, cpu = _step_rates(swarm, n, warmup, warmup + steps, timeout=60.0 + 20.0 * steps)
            resyncs = [int(swarm.status(i).get("resyncs", 0)) - b for i, b in enumerate(before)]
            _, digests = common_digests(swarm, list(range(n)))
            swarm.stop_all()
        budgets = {"up": parse_rate(up) * 10.0, "down": parse_rate(down) * 10.0}
        return ShapedResult(
            rates=rates,
            cpu_s_per_step=cpu,
            resyncs=resyncs,
            up_ratio=[sampler.peak(i, "up").nbytes / budgets["up"] for i in range(n)],
            down_ratio=[sampler.peak(i, "down").nbytes / budgets["down"] for i in range(n)],
            delay_applied=net.delay_applied,
            identical=len(digests) == 1,
        )


@dataclasses.dataclass(frozen=True)
class JoinResult:
    seconds: float
    first_step: int


def join_to_first_accept(
    folder: Path, *, model: dict[str, Any], peers: int, round_deadline_s: float
) -> JoinResult:
    """Seconds from starting a newcomer's ``distro-node join`` to a peer applying its packet."""
    from distronet.node.demo import write_run

    run = write_run(folder, "joinbench", model=model, round_deadline_s=round_deadline_s)
    with LocalSwarm(folder, run, "joinbench") as swarm:
        swarm.start_coordinator()
        for _ in range(peers):
            swarm.start_node(min_peers=peers)
        swarm.wait_steps(list(range(peers)), 2, timeout=240.0)
        old = {swarm.status(i).get("peer_id") for i in range(peers)}
        started = time.monotonic()
        swarm.start_node()
        end = started + 120.0
        while time.monotonic() < end:
            if swarm.nodes[peers].poll() is not None:
                raise SwarmFailure(f"the newcomer exited with {swarm.nodes[peers].returncode}")
            for i in range(peers):
                for step, producers in swarm.status(i).get("accepted", {}).items():
                    if any(p not in old for p in producers):
                        seconds = time.monotonic() - started
                        swarm.stop_all()
                        return JoinResult(seconds, int(step))
            time.sleep(POLL_S)
        raise SwarmFailure("no peer accepted a packet of the newcomer within 120 s")


def median(values: list[float]) -> float:
    """The median of the values that are numbers (nan when none is)."""
    real = [v for v in values if not math.isnan(v)]
    return statistics.median(real) if real else float("nan")
