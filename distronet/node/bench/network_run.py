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

import contextlib
import dataclasses
import json
import math
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from distronet.node.bench.netns import LinkShape, ShapedNet, VethSampler
from distronet.node.bench.netns_swarm import NetnsSwarm, SwarmFailure, write_shaped_run
from distronet.node.demo import LocalSwarm
from distronet.node.swarm.budget import parse_rate

__all__ = [
    "ComputeResult",
    "CpuSplit",
    "JoinResult",
    "ShapedResult",
    "compute_only",
    "join_to_first_accept",
    "shaped_swarm",
]

POLL_S = 0.05
# The timed swarm is polled more slowly (the harness's own CPU is not the swarm's): its rates come
# from the steps' own end times (status ``step_time``), so the poll interval does not blur them.
RATE_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class ComputeResult:
    """One compute-only process: steps per second, CPU seconds per step (the process), and the
    optimizer's share of them (encode + decode of its own packet + apply)."""

    rate: float
    cpu_s_per_step: float
    optimizer_cpu_s_per_step: float


def compute_only(
    model: dict[str, Any], optimizer: dict[str, Any], *, n: int, steps: int, warmup: int
) -> list[ComputeResult]:
    """Each of ``n`` concurrent compute-only processes' rate and CPU per step, one torch thread each.

    The processes time their steps between one ``go`` and one ``stop`` (``network_compute``'s
    barrier), so every timed step runs beside ``n - 1`` others training — as a swarm's nodes do —
    and none beside one still starting up or already done. Raises SwarmFailure when a process
    fails or runs past a generous deadline.
    """
    arg = {
        "model": model,
        "optimizer": optimizer,
        "steps": steps,
        "warmup": warmup,
        "threads": 1,
        "barrier": True,
    }
    deadline = time.monotonic() + 600.0
    with contextlib.ExitStack() as stack:
        errs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(n)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "distronet.node.bench.network_compute",
                    json.dumps({**arg, "peer": i}),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errs[i],
            )
            for i in range(n)
        ]
        lines = [_LineReader(p) for p in procs]
        try:
            for r in lines:
                r.expect("ready", deadline, errs)
            for p in procs:
                _say(p, b"go\n")
            docs = [r.expect("steps_per_s", deadline, errs) for r in lines]
            for p in procs:
                _say(p, b"stop\n")
                if p.stdin is not None:
                    p.stdin.close()
            for p in procs:
                p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise SwarmFailure("compute-only workers did not finish within 600 s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    return [
        ComputeResult(
            float(d["steps_per_s"]), float(d["cpu_s_per_step"]), float(d["optimizer_cpu_s_per_step"])
        )
        for d in docs
    ]


def _say(proc: subprocess.Popen[bytes], line: bytes) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.write(line)
            proc.stdin.flush()


class _LineReader:
    """JSON lines of one worker's stdout, read on a thread so waiting for one has a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw)
        self.lines.put(b"")

    def expect(self, key: str, deadline: float, errs: list[Any]) -> dict[str, Any]:
        """The next JSON line holding ``key``. Raises SwarmFailure when the worker ends first."""
        while True:
            try:
                raw = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise subprocess.TimeoutExpired("compute-only worker", 600.0) from None
            if not raw:
                self.proc.wait(10)
                err = b""
                for f in errs:
                    f.seek(0)
                    err += f.read()[-400:]
                raise SwarmFailure(
                    f"compute-only worker failed ({self.proc.returncode}): {err.decode(errors='replace')}"
                )
            with contextlib.suppress(ValueError):
                doc = json.loads(raw)
                if isinstance(doc, dict) and key in doc:
                    return doc


@dataclasses.dataclass(frozen=True)
class CpuSplit:
    """CPU seconds per step of one node over the timed steps: the whole node process + its p2pd
    (``total``), the steps' own thread (``train``: batch, gradients, optimizer, digest) and the
    optimizer inside it (``optimizer``), the event-loop thread (``loop``), the node's other
    threads (``other``) and p2pd (``p2pd``). nan where not measured."""

    total: float
    train: float
    optimizer: float
    loop: float
    other: float
    p2pd: float


@dataclasses.dataclass(frozen=True)
class ShapedResult:
    """Per node: steps/s, CPU per step (:class:`CpuSplit`), resyncs while timed (a resync jumps
    steps), busiest-window bytes / (budget × window) up and down; whether netem delay was
    applied; whether the replicas were identical at the end."""

    rates: list[float]
    cpu: list[CpuSplit]
    resyncs: list[int]
    up_ratio: list[float]
    down_ratio: list[float]
    delay_applied: bool
    identical: bool

    @property
    def cpu_s_per_step(self) -> list[float]:
        return [c.total for c in self.cpu]


@dataclasses.dataclass(frozen=True)
class _Mark:
    """One poll's view of a node: when its step ended (the status's ``step_time``; the poll's
    time when absent), its step, its CPU counters (see :func:`_cpu_seconds`) and the status
    file's training-thread sums."""

    t: float
    step: int
    loop: float
    process: float
    p2pd: float
    train: float
    optimizer: float


def _mark(swarm: LocalSwarm, i: int, now: float, step: int) -> _Mark:
    st = swarm.status(i)
    loop, process, p2pd = _cpu_seconds(swarm.nodes[i].pid)
    return _Mark(float(st.get("step_time") or now), int(st.get("step", step)), loop, process, p2pd,
                 float(st.get("cpu_train_s", "nan")),
                 float(st.get("cpu_optimizer_s", "nan")))  # fmt: skip


def _split(a: _Mark, b: _Mark) -> tuple[float, CpuSplit]:
    """(steps per second, CPU per step) between two marks of one node."""
    moved = b.step - a.step
    rate = moved / (b.t - a.t) if b.t > a.t else float("nan")
    if moved <= 0:
        nan = float("nan")
        return rate, CpuSplit(nan, nan, nan, nan, nan, nan)
    loop, process = (b.loop - a.loop) / moved, (b.process - a.process) / moved
    p2pd, train = (b.p2pd - a.p2pd) / moved, (b.train - a.train) / moved
    split = CpuSplit(total=process + p2pd, train=train, optimizer=(b.optimizer - a.optimizer) / moved,
                     loop=loop, other=process - loop - train, p2pd=p2pd)  # fmt: skip
    return rate, split


def _step_rates(
    swarm: LocalSwarm, n: int, start: int, stop: int, timeout: float
) -> tuple[list[float], list[CpuSplit]]:
    """Per node, steps per second between the first poll that saw it at step >= ``start`` and
    the first that saw it at >= ``stop``, timed by those steps' end times (nan when both were the
    same poll: a resync jump), and its CPU per step over the same steps (read at the polls)."""
    first: list[_Mark | None] = [None] * n
    last: list[_Mark | None] = [None] * n
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
                first[i] = _mark(swarm, i, now, step)
            if last[i] is None and step >= stop:
                last[i] = _mark(swarm, i, now, step)
        time.sleep(RATE_POLL_S)
    rates, cpu = [], []
    for a, b in zip(first, last, strict=True):
        assert a is not None and b is not None
        rate, split = _split(a, b)
        rates.append(rate)
        cpu.append(split)
    return rates, cpu


def _cpu_seconds(pid: int) -> tuple[float, float, float]:
    """CPU seconds (user + system) of process ``pid``'s main thread (the node's event loop), of
    the whole process, and of its children (p2pd); nan when it is gone."""
    import psutil

    nan = float("nan")
    try:
        proc = psutil.Process(pid)
        kids = proc.children(recursive=True)
        t = proc.cpu_times()
        main = next((th.user_time + th.system_time for th in proc.threads() if th.id == pid), nan)
    except psutil.Error:
        return nan, nan, nan
    total = 0.0
    for p in kids:
        try:
            c = p.cpu_times()
        except psutil.Error:
            continue
        total += c.user + c.system
    return main, t.user + t.system, total


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
            cpu=cpu,
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
    started_unix: float = 0.0  # when the newcomer's process was started (its log's clock)


def join_to_first_accept(
    folder: Path,
    *,
    model: dict[str, Any],
    peers: int,
    round_deadline_s: float,
    newcomer_args: tuple[str, ...] = (),
) -> JoinResult:
    """Seconds from starting a newcomer's ``distro-node join`` (with ``newcomer_args`` appended,
    e.g. a log level) to a peer applying its packet. Its log stays in ``folder``."""
    from distronet.node.demo import write_run

    run = write_run(folder, "joinbench", model=model, round_deadline_s=round_deadline_s)
    with LocalSwarm(folder, run, "joinbench") as swarm:
        swarm.start_coordinator()
        for _ in range(peers):
            swarm.start_node(min_peers=peers)
        swarm.wait_steps(list(range(peers)), 2, timeout=240.0)
        old = {swarm.status(i).get("peer_id") for i in range(peers)}
        started, started_unix = time.monotonic(), time.time()
        swarm.start_node(*newcomer_args)
        end = started + 120.0
        while time.monotonic() < end:
            if swarm.nodes[peers].poll() is not None:
                raise SwarmFailure(f"the newcomer exited with {swarm.nodes[peers].returncode}")
            for i in range(peers):
                for step, producers in swarm.status(i).get("accepted", {}).items():
                    if any(p not in old for p in producers):
                        seconds = time.monotonic() - started
                        swarm.stop_all()
                        return JoinResult(seconds, int(step), started_unix)
            time.sleep(POLL_S)
        raise SwarmFailure("no peer accepted a packet of the newcomer within 120 s")


def median(values: list[float]) -> float:
    """The median of the values that are numbers (nan when none is)."""
    real = [v for v in values if not math.isnan(v)]
    return statistics.median(real) if real else float("nan")
