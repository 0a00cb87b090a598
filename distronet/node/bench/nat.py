"""`distro-node bench nat`: step rate and bytes on the wire, direct against relayed (root only).

Two rows, each a fresh :class:`~distronet.node.bench.netns_nat.NatNet` with a coordinator on the
public bridge, `distro-node relay` in public namespace 0 and ``nodes`` real `distro-node join`
processes (the chaos NAT test's 44k-parameter GPT, ``--up 2mbit --down 10mbit`` on 20/50 mbit
links):

- ``direct``: the nodes on the public segment (``--reachability public``): every pair dials
  the other's address;
- ``relayed``: each node alone behind its own symmetric NAT (``--reachability private``): every
  pair goes through the relay's circuits.

Once every node is past ``warmup`` steps, the row measures ``steps`` more: ``steps_per_s`` (the
slowest node's), each node's mean upload and download on its ``eth0`` over that window
(``up_Bps``, ``down_Bps``: payload, gossip, DHT and framing), the relay's own upload, and which
pairs were relayed (asked of p2pd at the end).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from distronet.node.exitcodes import ExitCode

__all__ = ["add_parser", "run_row"]

UP, DOWN = "2mbit", "10mbit"


def run_row(mode: str, nodes: int, warmup: int, steps: int, folder: Path) -> dict[str, Any]:
    """One row (module doc). Raises NetnsError or SwarmFailure when the swarm cannot be built."""
    from distronet.node.bench.nat_probe import connections, control_socket, link_kinds
    from distronet.node.bench.netns import LinkShape
    from distronet.node.bench.netns_nat import Home, NatKind, NatNet
    from distronet.node.bench.netns_swarm import (
        SMALL_GPT,
        SMALL_OPTIMIZER,
        NetnsSwarm,
        new_relay,
        small_exchange,
        write_shaped_run,
    )

    public = 1 + (nodes if mode == "direct" else 0)
    homes = [] if mode == "direct" else [Home(NatKind.SYMMETRIC, 1)] * nodes
    reach = "public" if mode == "direct" else "private"
    with NatNet(
        public, homes, LinkShape("20mbit", "50mbit", 20.0), prefix="dnb", public_net="192.0.0.192/27"
    ) as net:
        relay = new_relay(folder, net.node_ip(0), 4002)
        run = write_shaped_run(
            folder,
            "natbench",
            model=SMALL_GPT,
            optimizer=SMALL_OPTIMIZER,
            exchange=small_exchange(0.5),
            relays=[relay],
        )
        with NetnsSwarm(net, folder, run, "natbench") as swarm:
            swarm.start_relay(0, "--run", "natbench")
            swarm.start_coordinator()
            for ns in range(1, net.n):
                swarm.start_node("--nat-traversal", "--reachability", reach, "--up", UP, "--down", DOWN,
                                 min_peers=nodes, where=ns)  # fmt: skip
            idx = list(range(nodes))
            swarm.wait_steps(idx, warmup, timeout=180.0)
            s0 = min(swarm.status(i)["step"] for i in idx)
            c0, t0 = [net.counters(n) for n in range(net.n)], time.monotonic()
            swarm.wait_steps(idx, s0 + steps, timeout=600.0)
            t1, c1 = time.monotonic(), [net.counters(n) for n in range(net.n)]
            s1 = min(swarm.status(i)["step"] for i in idx)
            peers = {i: swarm.status(i)["peer_id"] for i in idx}
            kinds = {i: link_kinds(connections(control_socket(swarm.nodes[i].pid))) for i in idx}
            swarm.stop_all()
    span = t1 - t0
    ups = [(c1[n][0] - c0[n][0]) / span for n in range(1, net.n)]
    downs = [(c1[n][1] - c0[n][1]) / span for n in range(1, net.n)]
    pairs = [
        kinds[a].get(peers[b]) or kinds[b].get(peers[a]) or "none" for a, b in itertools.combinations(idx, 2)
    ]
    return {
        "mode": mode,
        "nodes": nodes,
        "steps": s1 - s0,
        "steps_per_s": round((s1 - s0) / span, 3),
        "up_Bps": round(statistics.mean(ups)),
        "down_Bps": round(statistics.mean(downs)),
        "relay_up_Bps": round((c1[0][0] - c0[0][0]) / span),
        "pairs_relayed": pairs.count("relayed"),
        "pairs_direct": pairs.count("direct"),
    }


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench nat`."""
    p = sub.add_parser("nat", help="step rate and bytes on the wire, direct against relayed (root, nft)")
    p.add_argument("--nodes", type=int, default=4, help="training nodes per row (2..8)")
    p.add_argument("--warmup", type=int, default=5, help="steps before the measured window")
    p.add_argument("--steps", type=int, default=40, help="steps measured per row")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Both rows, printed."""
    from distronet.node.bench.netns_nat import missing_nat_requirements

    why = missing_nat_requirements()
    if why is not None:
        print(f"distro-node bench nat: {why}")
        return int(ExitCode.USAGE)
    if not 2 <= args.nodes <= 8 or args.steps < 1 or args.warmup < 1:
        print("distro-node bench nat: --nodes 2..8, --steps and --warmup >= 1")
        return int(ExitCode.USAGE)
    rows = []
    for mode in ("direct", "relayed"):
        with tempfile.TemporaryDirectory(prefix=f"natbench-{mode}-") as tmp:
            rows.append(run_row(mode, args.nodes, args.warmup, args.steps, Path(tmp)))
    if args.json:
        print(json.dumps(rows, indent=1))
        return int(ExitCode.OK)
    for r in rows:
        print(
            f"{r['mode']:>8}: {r['steps_per_s']:.2f} steps/s over {r['steps']} steps; per node up "
            f"{r['up_Bps'] / 1e3:.1f} kB/s, down {r['down_Bps'] / 1e3:.1f} kB/s; relay up "
            f"{r['relay_up_Bps'] / 1e3:.1f} kB/s; "
            f"pairs {r['pairs_direct']} direct, {r['pairs_relayed']} relayed"
        )
    return int(ExitCode.OK)
