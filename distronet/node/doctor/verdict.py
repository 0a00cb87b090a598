"""What `distro-node doctor` found, and the verdict drawn from it: pure arithmetic, no torch.

:class:`Report` gathers the measurements (machine, step, link, the run's round); :func:`round_traffic`
turns the run's packet size and peer count into bytes per round and the seconds they take;
:func:`judge` decides whether this machine keeps up with the run's round deadline and, when it
does not, says why and what to change; :func:`render` is the text a volunteer reads.

The rule: a node keeps up when its step fits its memory and ``step + transfer`` fits the
run's ``round_deadline_s``. ``transfer`` is the longer of the round's upload and download (they
run at once): in an all-gather round each of ``peers`` others pulls this node's packet (upload
``peers × packet``, the worst case: a peer may pull from any holder) and this node pulls theirs
(download ``peers × packet``), each at the lower of the measured link rate and the owner's
budget as the node's limiter meters it (``swarm.budget.WireModel``: payload overhead, a
reserve for control traffic).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from distronet.node.swarm.budget import WireModel, format_rate
from distronet.protocol.errors import ConfigError

__all__ = [
    "TIGHT",
    "Link",
    "Machine",
    "Report",
    "RoundTraffic",
    "StepPlan",
    "StepTime",
    "Verdict",
    "judge",
    "metered_rate",
    "render",
    "round_traffic",
]

TIGHT = 0.8  # step + transfer over this share of the round: keeps up, with little headroom


@dataclass(frozen=True)
class Machine:
    """The machine: ``device`` is what trains (the backend's own description)."""

    cpu: str
    cores: int
    torch_threads: int
    cuda: str | None  # the CUDA device's name and memory, None when torch sees none
    mlx: str  # "installed" | "not installed"
    device: str
    memory_total: int  # bytes of RAM
    memory_available: int  # bytes of RAM available now (MemAvailable)


@dataclass(frozen=True)
class StepPlan:
    """How many steps: ``warmup`` untimed (first-call costs: allocation, the decoder's compile),
    then ``steps`` timed; ``micro_batch`` is the node's own (0: the run's)."""

    warmup: int = 2
    steps: int = 5
    micro_batch: int = 0
    checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.warmup < 0 or not 1 <= self.steps <= 100 or self.micro_batch < 0:
            raise ConfigError("doctor: need --warmup >= 0, --steps in 1..100 and --micro-batch >= 0")


@dataclass(frozen=True)
class StepTime:
    """Real training steps of the run's model on this machine (``doctor.measure``)."""

    model: str  # "gpt" | "hf:llama" ...
    source: str  # "run <id>" | "local"
    params: int
    batch: int  # windows this node trains on a step
    seq_len: int
    micro_batch: int  # windows per forward/backward pass (0: the whole batch)
    warmup: int
    times_s: tuple[float, ...]  # each timed step: forward + backward + optimizer step (codec included)
    decoded_peers: int  # the others' packets each timed step decoded besides its own
    median_s: float
    packet_bytes: int  # this node's sealed packet of one step
    peak_bytes: int  # peak memory of the steps (``peak_kind``)
    peak_kind: str  # "process RSS" | "CUDA allocated"
    usable_bytes: int  # what this device can give the node
    estimate_bytes: int | None = None  # the fit estimate (models/fit.py) of the same training

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.usable_bytes


@dataclass(frozen=True)
class Link:
    """The measured rate to the coordinator (bytes/s of payload), ``None`` when not measured."""

    coordinator: str | None
    down_rate: float | None
    up_rate: float | None
    probe_bytes: int
    probes: int
    note: str = ""  # why the rate was not measured, when it was not


@dataclass(frozen=True)
class RoundTraffic:
    """One round's bytes for this node and the seconds they take (module docstring)."""

    deadline_s: float
    peers: int  # the others this node exchanges with
    up_bytes: int
    down_bytes: int
    up_budget: float  # bytes/s (math.inf: unlimited)
    down_budget: float
    up_rate: float  # the rate the round's upload gets: min(measured, metered budget)
    down_rate: float
    up_limited_by: str  # "budget" | "link"
    down_limited_by: str
    transfer_s: float


@dataclass(frozen=True)
class Verdict:
    keeps_up: bool
    line: str  # "verdict: ..." as printed
    reasons: tuple[str, ...] = ()
    remedies: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    run: str | None
    machine: Machine
    step: StepTime
    link: Link
    round: RoundTraffic
    verdict: Verdict

    def as_json(self) -> dict[str, object]:
        """Every field (rates in bytes/s, sizes in bytes, times in seconds); ``inf`` is None."""
        doc = dataclasses.asdict(self)
        doc["step"]["fits"] = self.step.fits
        return _finite(doc)  # type: ignore[return-value]


def _finite(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def metered_rate(budget: float, wire: WireModel = WireModel()) -> float:
    """Payload bytes/s the node's limiter lets through under a ``budget`` of wire bytes/s: the
    budget less its control reserve, each payload byte costing ``1 + overhead`` on the wire."""
    if math.isinf(budget):
        return math.inf
    return (budget - wire.reserve_for(budget)) / (1.0 + wire.overhead)


def round_traffic(
    packet_bytes: int,
    peers: int,
    deadline_s: float,
    up_budget: float,
    down_budget: float,
    link: Link,
) -> RoundTraffic:
    """The round's bytes for this node and how long they take (module docstring)."""
    up_bytes = down_bytes = packet_bytes * peers

    def rate(budget: float, measured: float | None) -> tuple[float, str]:
        allowed = metered_rate(budget)
        if measured is not None and measured < allowed:
            return measured, "link"
        return allowed, "budget"

    up_rate, up_by = rate(up_budget, link.up_rate)
    down_rate, down_by = rate(down_budget, link.down_rate)
    transfer = max(up_bytes / up_rate, down_bytes / down_rate)
    return RoundTraffic(
        deadline_s, peers, up_bytes, down_bytes, up_budget, down_budget,
        up_rate, down_rate, up_by, down_by, transfer,
    )  # fmt: skip


def judge(step: StepTime, traffic: RoundTraffic) -> Verdict:
    """Whether this machine keeps up with the run's round deadline; if not, why and what to do."""
    deadline, transfer = traffic.deadline_s, traffic.transfer_s
    need = step.median_s + transfer
    figures = f"step {step.median_s:.2f} s + transfer {transfer:.2f} s of a {deadline:.1f} s round"
    reasons: list[str] = []
    remedies: list[str] = []
    if not step.fits:
        reasons.append(f"peak memory {_size(step.peak_bytes)} is over the {_size(step.usable_bytes)} usable")
        remedies.append(
            "lower --micro-batch (passes of fewer windows, the same tokens a step) or turn on "
            "--activation-checkpointing, or use a device with more memory"
        )
    if need > deadline:
        if step.median_s > deadline / 2 and step.median_s >= transfer:
            reasons.append(f"a step takes {step.median_s:.2f} s")
            remedies.append(
                "train on a faster device (a GPU: --device cuda), or ask the run's operator for a "
                "longer round_deadline_s"
            )
        else:
            slow = (
                "up"
                if traffic.up_bytes / traffic.up_rate >= traffic.down_bytes / traffic.down_rate
                else "down"
            )
            by = traffic.up_limited_by if slow == "up" else traffic.down_limited_by
            rate = traffic.up_rate if slow == "up" else traffic.down_rate
            nbytes = traffic.up_bytes if slow == "up" else traffic.down_bytes
            reasons.append(
                f"the round's {slow}load of {_size(nbytes)} takes {transfer:.2f} s "
                f"at {format_rate(rate)} ({by})"
            )
            remedies.append(
                f"raise --{slow} (the budget is below the link)"
                if by == "budget"
                else "a faster connection, or a run with a smaller packet (k, value coding) or fewer "
                "peers per round (the operator's settings)"
            )
    if reasons:
        line = f"verdict: cannot keep up ({figures}): {'; '.join(reasons)}; remedy: {'; '.join(remedies)}"
        return Verdict(False, line, tuple(reasons), tuple(remedies))
    share = need / deadline if deadline > 0 else math.inf
    tight = f", {100 * (1 - share):.0f} % headroom: little" if share > TIGHT else ""
    return Verdict(True, f"verdict: can keep up ({figures}{tight})")


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def render(rep: Report) -> str:
    """The report as the lines `distro-node doctor` prints."""
    m, s, ln, t = rep.machine, rep.step, rep.link, rep.round
    mb = f"micro-batch {s.micro_batch}" if s.micro_batch else "one pass"
    peak = f"{_size(s.peak_bytes)} {s.peak_kind} of {_size(s.usable_bytes)} usable"
    estimate = (
        "not computed"
        if s.estimate_bytes is None
        else f"{_size(s.estimate_bytes)} for training this model (the join's fit check; models/fit.py)"
    )
    link = (
        "not measured" + (f": {ln.note}" if ln.note else "")
        if ln.down_rate is None or ln.up_rate is None
        else f"down {format_rate(ln.down_rate)}, up {format_rate(ln.up_rate)} to the coordinator "
        f"({_size(ln.probe_bytes)} probes, median of {ln.probes})"
    )
    decoded = f"{s.decoded_peers + 1} packets" + (
        f" of the round's {t.peers + 1}" if s.decoded_peers < t.peers else ""
    )
    times = ", ".join(f"{x:.3f}" for x in s.times_s)
    what = f"run {rep.run} at {ln.coordinator}" if rep.run else "local model (no --coordinator)"
    lines = [
        f"distro-node doctor: {what}",
        f"device    {m.device}",
        f"cpu       {m.cpu}, {m.cores} cores (torch threads: {m.torch_threads})",
        f"cuda      {m.cuda or 'none'}",
        f"mlx       {m.mlx}",
        f"memory    {_size(m.memory_total)} total, {_size(m.memory_available)} available",
        f"model     {s.model} ({s.source}): {s.params:,} parameters, "
        f"{s.batch} x {s.seq_len} tokens a step, {mb}",
        f"step      {s.median_s:.3f} s median of {len(s.times_s)} after {s.warmup} warm-up ({times} s)",
        f"          forward + backward + DisTrO step (encode, seal; open, verify, decode {decoded}; apply)",
        f"peak      {peak}: {'fits' if s.fits else 'does NOT fit'}",
        f"estimate  {estimate}",
        f"packet    {s.packet_bytes:,} bytes a step",
        f"link      {link}",
        f"budget    up {format_rate(t.up_budget)}, down {format_rate(t.down_budget)} (--up, --down)",
        f"round     {t.peers} peer(s): up {t.up_bytes:,} B at {format_rate(t.up_rate)} ({t.up_limited_by}), "
        f"down {t.down_bytes:,} B at {format_rate(t.down_rate)} ({t.down_limited_by}): {t.transfer_s:.3f} s",
        f"deadline  {t.deadline_s:.1f} s a round",
        rep.verdict.line,
    ]
    return "\n".join(lines)
