"""The exchange's configuration, its ``FellBehind`` error and a round's state at one replica.

Split out of ``exchange`` (which re-exports the public names) to keep that module readable.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from distronet.node.exchange.base import Round, RoundUnavailable
from distronet.protocol.announce import Announcement
from distronet.protocol.errors import ConfigError
from distronet.protocol.limits import DEFAULT_LIMITS, Limits
from distronet.protocol.manifest import RoundManifest

__all__ = ["ExchangeConfig", "FellBehind", "RoundState", "manifest_topic"]


def manifest_topic(run_id: str) -> str:
    return f"distronet/{run_id}/manifest"


class FellBehind(RoundUnavailable):
    """This replica's round had no other producer while its peers announce (or, asked, report)
    steps past it (up to ``swarm_step``): it was paused or cut off and must adopt the swarm's
    state."""

    def __init__(self, message: str, swarm_step: int) -> None:
        super().__init__(message)
        self.swarm_step = swarm_step


@dataclass(frozen=True)
class ExchangeConfig:
    """Round timing (seconds) and bounds. ``round_deadline_s`` is the initial deadline; the daemon
    adapts it to observed step times with ``AsyncSwarmExchange.round_deadline_s = ...``."""

    round_deadline_s: float = 5.0
    manifest_grace_s: float = 0.5
    manifest_wait_s: float = 3.0
    pull_timeout_s: float = 30.0
    retention: int = 32
    """Rounds kept (their frames, announcements and manifests): how far a late pull, a replay
    (``node/catchup/replay.py``: up to ``retention - 4`` rounds) or a held announcement reaches back."""
    max_manifest_entries: int = 1024
    warmup_mask_steps: int = 3
    """Steps a replica that adopted the swarm's state publishes masked packets (``exchange`` doc)."""
    alone_rounds: int = 0
    """Rounds of one applied unasked, while peers are in the topic, before asking them their step
    (``exchange`` module doc, "Hearing nobody"; ``alone``)."""
    limits: Limits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_mask_steps <= 1000:
            raise ConfigError(f"warmup_mask_steps must be in 0..1000, got {self.warmup_mask_steps}")
        if not 1 <= self.retention <= 4096:
            raise ConfigError(f"retention must be in 1..4096, got {self.retention}")
        if not 0 <= self.alone_rounds <= 1000:
            raise ConfigError(f"alone_rounds must be in 0..1000, got {self.alone_rounds}")


@dataclass
class RoundState:
    """What one replica holds of one round (``exchange`` module doc)."""

    opened_at: float
    announced: dict[bytes, Announcement] = field(default_factory=dict)
    frames: dict[bytes, tuple[bytes, bytes]] = field(default_factory=dict)  # peer -> (sha, frame)
    pulls: dict[bytes, asyncio.Task[None]] = field(default_factory=dict)
    manifests: dict[bytes, RoundManifest] = field(default_factory=dict)  # leader -> manifest
    warm: set[bytes] = field(default_factory=set)  # producers whose packet is a masked warm-up one
    late: set[bytes] = field(default_factory=set)  # producers first heard after the freeze
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    frozen: bool = False
    deciding: asyncio.Task[Round] | None = None
    sealed: bytes | None = None  # the manifest we signed for this step, served on request
    decided: Round | None = None
    adopted: RoundManifest | None = None  # the manifest ``decided`` came from, served on request
