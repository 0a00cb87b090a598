"""What the owner sees: a live status line, and a status file that tools and tests read.

The line shows step, loss, peers, up/down rate against the budget, shard and contribution::

    step 41  loss 3.912  peers 3  up 12.3 kB/s (1%)  down 25.0 kB/s (0%)  shard train-0002
    shards done 1  own 41/41  links 2 direct 0 punched 1 relayed     (one line on the terminal)

and, while no peer is reached past the diagnosis delay, ``REACHING NO PEER: <cause>``.

``StatusFile`` writes the same facts as JSON (atomically), plus the parameter digest of the
last few steps (``digests``: step -> sha256) and the accepted set of the last few rounds
(``accepted``: step -> producers' peer ids) and who led each (``leaders``: step -> the adopted
manifest's leader), so replicas and rounds can be compared from outside; ``rejected`` (gossip and
asks the exchange refused, by reject code) and ``not_admitted`` (peer id -> its announcements and
manifests refused as not admitted, for the latest 64 such peers) show who was kept out, and
``state_donors`` whose state each adoption took; ``reach`` (peer id -> ``direct`` |
``hole_punched`` | ``relayed``, for up to 256 connected peers) with its counts ``reach_direct``,
``reach_hole_punched``, ``reach_relayed``, ``reachability`` and ``hole_punches`` (AutoNAT's verdict
and p2pd's count of successful punches, read from p2pd's metrics page when
``--p2pd-metrics-port`` is set), and ``diagnosis`` / ``diagnosis_text`` (why no peer
is reached, and what to do; empty while one is) show how the node reaches the swarm.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, TextIO

__all__ = ["NodeStatus", "StatusFile", "StatusLine", "human_rate"]

KEEP_DIGESTS = 64
KEEP_ROUNDS = 128
MAX_UNITS = 1000
MAX_REACH = 256  # peers listed by route in the status file (the counts cover all)


@dataclasses.dataclass
class NodeStatus:
    """The node's current facts. Mutable; owned by the daemon."""

    run_id: str
    peer_id: str
    state: str = "created"
    device: str = ""  # what computes the gradients: cuda | mps | cpu | mlx
    step: int = -1
    loss: float = math.nan
    losses: list[float] = dataclasses.field(default_factory=list)  # first and recent, for tests
    peers: int = 0
    up_bps: float = 0.0
    down_bps: float = 0.0
    up_budget: float = math.inf
    down_budget: float = math.inf
    bytes_up: int = 0
    bytes_down: int = 0
    shard: str = ""
    shards_done: int = 0
    own_accepted: int = 0
    rounds: int = 0
    first_step: int = -1
    drift_equal: int = 0  # drift checks that found peers at our step with our exact parameters
    drift_differs: int = 0
    resyncs: int = 0  # times this node adopted the swarm's state (newcomer catch-up, failed round)
    resync_steps: list[int] = dataclasses.field(default_factory=list)  # steps resumed from a state (recent)
    # for each of those states, the signer of the manifest chosen (every donor backing it offered
    # the same step and root): whose state was adopted
    state_donors: list[str] = dataclasses.field(default_factory=list)
    replayed_rounds: int = 0  # rounds the swarm decided that this node replayed to catch up
    fell_behind: int = 0  # rounds that found this node behind the swarm (paused, cut off)
    warmup_until: int = -1  # our packets for steps below this are masked warm-up packets
    warmup_heard: int = 0  # warm-up announcements heard from other producers (masked, live)
    alone_waits: int = 0  # rounds in which we heard nobody and waited for peers in step (unheard)
    dead_frames: int = 0  # manifest frames held by no live peer: their rounds applied without them
    completed_units: list[int] = dataclasses.field(default_factory=list)  # shard units we completed
    pending_reports: int = 0  # reports queued for the coordinator (it is unreachable)
    step_time: float = 0.0  # unix time at which step ``step`` ended (bench rates from outside)
    cpu_steps: int = 0  # steps counted in the two sums below
    cpu_train_s: float = 0.0  # CPU seconds of the steps' own thread (batch, gradients, optimizer, digest)
    cpu_optimizer_s: float = 0.0  # of which the optimizer step (encode, decode, apply)
    digests: dict[int, str] = dataclasses.field(default_factory=dict)
    accepted: dict[int, list[str]] = dataclasses.field(default_factory=dict)  # step -> producers
    leaders: dict[int, str] = dataclasses.field(default_factory=dict)  # step -> the adopted leader
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)  # reject code -> messages refused
    not_admitted: dict[str, int] = dataclasses.field(default_factory=dict)  # peer -> messages refused
    # how each connected peer is reached (peer -> direct | hole_punched | relayed; swarm/reach.py)
    reach: dict[str, str] = dataclasses.field(default_factory=dict)
    reach_direct: int = 0
    reach_hole_punched: int = 0
    reach_relayed: int = 0
    reachability: str = "unknown"  # AutoNAT's verdict (public | private), from p2pd's metrics page
    hole_punches: int = -1  # p2pd's successful hole punches so far (-1: no p2pd metrics page)
    diagnosis: str = ""  # why no peer is reached (a swarm/diagnose.py cause), "" while one is
    diagnosis_text: str = ""  # that diagnosis: the cause with its facts, and the remedy

    def record_digest(self, step: int, digest: str) -> None:
        self.digests[step] = digest
        for old in sorted(self.digests)[:-KEEP_DIGESTS]:
            del self.digests[old]

    def record_round(self, step: int, producers: list[str], leader: str | None = None) -> None:
        """The accepted set of ``step`` (base58 peer ids) and its leader (when known), kept for the
        last ``KEEP_ROUNDS`` rounds."""
        self.accepted[step] = producers
        for old in sorted(self.accepted)[:-KEEP_ROUNDS]:
            del self.accepted[old]
        if leader is not None:
            self.leaders[step] = leader
        for old in [s for s in self.leaders if s not in self.accepted]:
            del self.leaders[old]

    def to_json(self) -> dict[str, Any]:
        """The status as a JSON-ready dict (written after every step: shallow copies only, no
        ``dataclasses.asdict`` deep copy)."""
        d = {f.name: getattr(self, f.name) for f in _FIELDS}
        d["digests"] = {str(k): v for k, v in self.digests.items()}
        d["accepted"] = {str(k): v for k, v in self.accepted.items()}
        d["leaders"] = {str(k): v for k, v in self.leaders.items()}
        d["rejected"] = dict(self.rejected)
        d["not_admitted"] = dict(self.not_admitted)
        d["reach"] = dict(sorted(self.reach.items())[:MAX_REACH])
        d["completed_units"] = self.completed_units[-MAX_UNITS:]
        d["resync_steps"] = self.resync_steps[-MAX_UNITS:]
        d["state_donors"] = self.state_donors[-MAX_UNITS:]
        for k in ("loss", "up_budget", "down_budget"):
            if not math.isfinite(d[k]):
                d[k] = None
        d["losses"] = [x for x in self.losses if math.isfinite(x)]
        return d


_FIELDS = dataclasses.fields(NodeStatus)


def human_rate(bps: float) -> str:
    """Bytes/s as ``12.3 kB/s``."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.1f} {unit}"
    return f"{bps:.0f} B/s"


def _pct(rate: float, budget: float) -> str:
    return "" if not math.isfinite(budget) or budget <= 0 else f" ({100 * rate / budget:.0f}%)"


class StatusLine:
    """Renders ``NodeStatus`` on one terminal line (``live``: redrawn with ``\\r``) or one line per call."""

    def __init__(self, out: TextIO | None = None, *, live: bool | None = None, prefix: str = "") -> None:
        self.out = out or sys.stderr
        self.live = self.out.isatty() if live is None else live
        self.prefix = prefix

    @staticmethod
    def render(s: NodeStatus) -> str:
        return (
            f"step {s.step}  loss {s.loss:.3f}  peers {s.peers}  "
            f"up {human_rate(s.up_bps)}{_pct(s.up_bps, s.up_budget)}  "
            f"down {human_rate(s.down_bps)}{_pct(s.down_bps, s.down_budget)}  "
            f"shard {s.shard or '-'}  shards done {s.shards_done}  own {s.own_accepted}/{s.rounds}  "
            f"links {s.reach_direct} direct {s.reach_hole_punched} punched {s.reach_relayed} relayed"
            + (f"  REACHING NO PEER: {s.diagnosis} (see the log)" if s.diagnosis else "")
        )

    def show(self, s: NodeStatus) -> None:
        text = self.prefix + self.render(s)
        if self.live:
            self.out.write("\r\x1b[2K" + text)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def end(self) -> None:
        if self.live:
            self.out.write("\n")
            self.out.flush()


class StatusFile:
    """``status.json`` in the data dir, replaced atomically on every ``write``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, s: NodeStatus) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(s.to_json(), separators=(",", ":")))
        os.replace(tmp, self.path)

    @staticmethod
    def read(path: Path) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(path.read_text())
        return doc
