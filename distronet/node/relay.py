"""`distro-node relay`: a circuit relay v2 and DHT node for the volunteers behind NAT.

The relay is a p2pd (``-relayService`` with its circuit limits, ``-forceReachabilityPublic``:
go-libp2p starts the relay service only on a host it believes public) plus a hivemind DHT node
on it, so it is the bootstrap peer every node can reach. It trains nothing and announces no
membership record. With ``--run`` it also subscribes to the runs' gossip topics: gossipsub
ignores relayed connections, so without a gossip peer that every home reaches directly the
announcements and manifests of one home never reach another (it forwards them; the payload
itself goes over the circuits). Its full multiaddrs (``…/p2p/<id>``) go into the run file's ``relays`` list,
which the coordinator hands to every joining node (docs/protocol.md §11); the identity in
``--data-dir`` keeps the peer id stable across restarts. ``--addr-file`` receives the multiaddrs
as a JSON list once the relay is up (for scripts and tests).

Limits are p2pd's (``RelayService``): circuits per peer, reservations, bytes and lifetime of one
circuit, buffer size. The bundled p2pd has no rate limit for relayed traffic and no way to
restrict whom it relays for: a relay serves any peer, admitted to the run or not
(docs/decisions/nat-traversal.md); cap its link with the host's shaper (``tc``) if needed.

Exit codes: 0 after SIGINT/SIGTERM, 2 bad flags, 5 p2pd or the DHT did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

from distronet.node.exchange.types import manifest_topic
from distronet.node.exitcodes import ExitCode
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.p2p import RelayService, SwarmConfig, SwarmHost, with_deadline
from distronet.node.swarm.pubsub import Gossip
from distronet.node.swarm.stack import announce_topic
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

__all__ = ["RelayConfig", "add_parser", "run_relay"]

log = logging.getLogger(__name__)
IDENTITY_FILE = "identity.key"


@dataclasses.dataclass(frozen=True)
class RelayConfig:
    """One relay: where it listens, its key's folder, what it announces and its limits."""

    data_dir: str = "./distro-relay"
    listen: str = "/ip4/0.0.0.0/tcp/4002"
    announce: str = ""
    addr_file: str = ""
    runs: tuple[str, ...] = ()
    limits: RelayService = dataclasses.field(default_factory=RelayService)
    log_level: str = "info"

    def __post_init__(self) -> None:
        if not self.listen.strip():
            raise ConfigError("--listen must name at least one multiaddr")
        for m in self._split(self.announce):
            if "/tcp/0" in m:
                raise ConfigError(f"--announce needs explicit ports, got {m!r}")

    @staticmethod
    def _split(text: str) -> tuple[str, ...]:
        return tuple(m.strip() for m in text.split(",") if m.strip())

    def swarm_config(self) -> SwarmConfig:
        return SwarmConfig(
            host_maddrs=self._split(self.listen),
            announce_maddrs=self._split(self.announce),
            identity_path=str(Path(self.data_dir) / IDENTITY_FILE),
            nat_traversal=True,  # AutoNAT service for the nodes, hole-punch coordination
            reachability="public",
            relay_service=self.limits,
            idle_timeout_s=30.0,
        )


def _identity(data_dir: Path) -> Identity:
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / IDENTITY_FILE
    if path.exists():
        return Identity.load(path)
    ident = Identity.generate()
    ident.save(path)
    return ident


async def run_relay(cfg: RelayConfig, stop: asyncio.Event | None = None) -> int:
    """Serve until ``stop`` is set (SIGINT/SIGTERM set it); the exit code."""
    from hivemind.dht.node import DHTNode

    from distronet.node.swarm.membership import SignedRecordValidator

    identity = _identity(Path(cfg.data_dir))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        host = await SwarmHost.start(cfg.swarm_config())
    except SwarmError as e:
        log.error("relay: p2pd did not start: %s", e)
        return int(ExitCode.NETWORK)
    try:
        try:
            dht = await with_deadline(
                DHTNode.create(p2p=host.p2p, record_validator=SignedRecordValidator(identity), num_workers=4),
                20.0,
                "DHT start",
            )
        except (SwarmError, RuntimeError) as e:
            log.error("relay: the DHT node did not start: %s", e)
            return int(ExitCode.NETWORK)
        gossip = Gossip(host)
        try:
            for run_id in cfg.runs:  # a queue of 1: the relay forwards and reads nothing
                for topic in (announce_topic(run_id), manifest_topic(run_id)):
                    await gossip.subscribe(topic, queue_size=1)
            maddrs = await host.maddrs()
            log.info("relay %s up: %s", host.peer_id_b58, ", ".join(maddrs))
            print(json.dumps({"peer_id": host.peer_id_b58, "multiaddrs": maddrs}), flush=True)
            if cfg.addr_file:
                tmp = f"{cfg.addr_file}.tmp"
                Path(tmp).write_text(json.dumps(maddrs))
                os.replace(tmp, cfg.addr_file)
            await stop.wait()
        finally:
            await gossip.close()
            await dht.shutdown()
    finally:
        await host.close()
    return int(ExitCode.OK)


def _main(args: argparse.Namespace) -> int:
    try:
        cfg = RelayConfig(
            data_dir=args.data_dir,
            listen=args.listen,
            announce=args.announce,
            addr_file=args.addr_file,
            runs=tuple(args.run),
            limits=RelayService(
                max_circuits=args.max_circuits,
                max_reservations=args.max_reservations,
                circuit_bytes=args.circuit_bytes,
                circuit_s=args.circuit_s,
                buffer_bytes=args.buffer_bytes,
            ),
            log_level=args.log_level,
        )
    except ConfigError as e:
        print(f"distro-node relay: {e}", file=sys.stderr)
        return int(ExitCode.USAGE)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(logging.WARNING)
    return asyncio.run(run_relay(cfg))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node relay`."""
    d, lim = RelayConfig(), RelayService()
    p = sub.add_parser(
        "relay",
        help="serve circuit relay v2 and the DHT for nodes behind NAT",
        description="A circuit relay v2 + DHT bootstrap node; put its multiaddrs in the run file's relays.",
    )
    p.add_argument("--data-dir", default=d.data_dir, help=f"identity folder [default {d.data_dir}]")
    p.add_argument("--listen", default=d.listen, help=f"listen multiaddrs, comma-separated [{d.listen}]")
    p.add_argument("--announce", default="", help="multiaddrs to announce instead (a public address)")
    p.add_argument("--run", action="append", default=[], help="a run whose gossip to forward (repeatable)")
    p.add_argument("--addr-file", default="", help="write the full multiaddrs here as JSON once up")
    p.add_argument("--max-circuits", type=int, default=lim.max_circuits, help="open circuits per peer")
    p.add_argument("--max-reservations", type=int, default=lim.max_reservations, help="reserved slots")
    p.add_argument("--circuit-bytes", type=int, default=lim.circuit_bytes, help="bytes per circuit and way")
    p.add_argument("--circuit-s", type=float, default=lim.circuit_s, help="lifetime of one circuit (s)")
    p.add_argument("--buffer-bytes", type=int, default=lim.buffer_bytes, help="buffer of one circuit")
    p.add_argument("--log-level", default=d.log_level, choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=_main)
