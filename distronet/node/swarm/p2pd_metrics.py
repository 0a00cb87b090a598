"""What p2pd's own Prometheus endpoint (``-metricsAddr``, the node's ``--p2pd-metrics-port``)
tells about reach, which its control API does not: AutoNAT's verdict and the hole punches.

go-libp2p 0.32 (the bundled p2pd) exports ``libp2p_autonat_reachability_status`` (0 unknown,
1 public, 2 private; the AutoNAT client runs whatever the flags) and, when started with
``-autonat`` (which also starts DCUtR hole punching), ``libp2p_holepunch_outcomes_total
{side, num_attempts, outcome}``. :func:`parse` reads both from the text format;
:func:`fetch` gets the text over loopback HTTP with a deadline and a size cap.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import aiohttp

__all__ = ["MAX_BYTES", "P2pdReach", "fetch", "parse"]

MAX_BYTES = 4 << 20  # a metrics page larger than this is not read
_REACHABILITY = {0: "unknown", 1: "public", 2: "private"}


@dataclass(frozen=True)
class P2pdReach:
    reachability: str = "unknown"  # AutoNAT: public | private | unknown
    hole_punches: int = -1  # successful hole punches (either side) so far; -1: not exported


def _value(line: str) -> float | None:
    try:
        v = float(line.rsplit(" ", 1)[-1])
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse(text: str) -> P2pdReach:
    """The reach facts in a Prometheus text page (lines it does not know are ignored)."""
    reach, punches = "unknown", -1
    for line in text.splitlines():
        if line.startswith("libp2p_autonat_reachability_status "):
            v = _value(line)
            reach = _REACHABILITY.get(int(v), "unknown") if v is not None else "unknown"
        elif line.startswith("# TYPE libp2p_holepunch_outcomes_total"):
            punches = max(punches, 0)
        elif line.startswith("libp2p_holepunch_outcomes_total{") and 'outcome="success"' in line:
            v = _value(line)
            if v is not None and v >= 0:
                punches = max(punches, 0) + int(v)
    return P2pdReach(reach, punches)


async def fetch(port: int, timeout_s: float = 2.0) -> P2pdReach | None:
    """p2pd's page on ``127.0.0.1:port``, parsed; None when it does not answer in time, errs, or
    is over ``MAX_BYTES``."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as s,
            s.get(f"http://127.0.0.1:{port}/metrics") as r,
        ):
            if r.status != 200:
                return None
            body = await r.content.read(MAX_BYTES + 1)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    if len(body) > MAX_BYTES:
        return None
    return parse(body.decode("utf-8", errors="replace"))
