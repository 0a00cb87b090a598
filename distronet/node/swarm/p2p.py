"""One p2pd per node, serving hivemind's DHT, our streams and gossipsub.

``SwarmHost.start(config)`` launches the p2pd that the hivemind wheel bundles through
``hivemind.P2P.create`` with ``-pubsub`` added (a per-start subclass overrides the static
``_make_process_args``), waits for it with a deadline, and hands out the ``P2P`` object that the
DHT (`membership`), the payload streams (`pull`) and the gossip client (`pubsub`) share.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from hivemind.p2p import P2P, PeerID
from hivemind.proto import p2pd_pb2 as pb
from hivemind.utils.multiaddr import Multiaddr

from distronet.node.swarm import control
from distronet.node.swarm.errors import DaemonError
from distronet.protocol.errors import ConfigError

__all__ = ["REACHABILITY", "RelayService", "SwarmConfig", "SwarmHost", "with_deadline"]

REACHABILITY = ("auto", "public", "private")


@dataclass(frozen=True)
class RelayService:
    """Circuit relay v2 service limits (p2pd's ``-relay*`` flags; docs/decisions/nat-traversal.md).

    ``max_circuits``: open relayed connections per peer; ``max_reservations``: reserved slots in
    all; ``circuit_bytes``: bytes one circuit may carry in each direction before the relay resets
    it; ``circuit_s``: how long one circuit may live; ``buffer_bytes``: each circuit's buffer.
    p2pd has no rate limit for relayed traffic, and no way to restrict whom it serves.
    """

    max_circuits: int = 16
    max_reservations: int = 128
    circuit_bytes: int = 1 << 32
    circuit_s: float = 1800.0
    buffer_bytes: int = 1 << 16

    def __post_init__(self) -> None:
        for name, low, high in (
            ("max_circuits", 1, 10_000),
            ("max_reservations", 1, 100_000),
            ("circuit_bytes", 1 << 16, 1 << 50),
            ("buffer_bytes", 1 << 10, 1 << 28),
        ):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"relay {name} must be in {low}..{high}, got {value}")
        if not 1.0 <= self.circuit_s <= 7 * 86400:
            raise ConfigError(f"relay circuit_s must be in 1..604800 s, got {self.circuit_s}")


T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwarmConfig:
    """How a node's p2pd is started.

    ``host_maddrs`` are listened on (loopback by default); ``bootstrap`` are full multiaddrs with
    ``/p2p/<id>``; ``identity_path`` is an existing libp2p protobuf private-key file (Ed25519 from
    ``distronet.protocol.identity``) — None gives a throwaway key. ``nat_traversal`` turns on
    AutoNAT, UPnP port mapping and relays (off for loopback tests). ``gossip_heartbeat_s`` sets
    gossipsub's heartbeat (default 1 s in p2pd; tests use less so meshes form quickly).
    ``idle_timeout_s``: p2pd exits by itself this long after our control connection is gone, so a
    crashed node leaves no daemon behind. ``gogc`` is the ``GOGC`` of the p2pd child (0: it
    inherits ours).

    ``relays`` are full multiaddrs of circuit relays (``…/p2p/<id>``): with ``nat_traversal`` p2pd
    keeps a reservation on them (``-autoRelay -trustedRelays``) once it thinks it is unreachable,
    and announces ``<relay>/p2p-circuit`` addresses. ``reachability`` forces that verdict
    (``public``/``private``) instead of waiting for AutoNAT (``auto``). ``relay_service`` makes
    this p2pd a relay for others (None: it relays nothing, so no stranger spends its bandwidth).
    """

    host_maddrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    announce_maddrs: tuple[str, ...] = ()
    bootstrap: tuple[str, ...] = ()
    identity_path: str | None = None
    metrics_addr: str | None = None
    nat_traversal: bool = True
    gossip_heartbeat_s: float | None = None
    startup_timeout_s: float = 15.0
    idle_timeout_s: float = 30.0
    call_timeout_s: float = 10.0
    close_timeout_s: float = 5.0
    gogc: int = 0
    relays: tuple[str, ...] = ()
    reachability: str = "auto"
    relay_service: RelayService | None = None

    def __post_init__(self) -> None:
        if self.reachability not in REACHABILITY:
            raise ConfigError(f"reachability must be one of {REACHABILITY}, got {self.reachability!r}")
        for m in self.relays:
            if "/p2p/" not in m:
                raise ConfigError(f"a relay address must end in /p2p/<peer id>, got {m!r}")


CANCEL_GRACE_S = 1.0
"""How long :func:`with_deadline` waits for a late call to take its cancellation."""


async def with_deadline(aw: Awaitable[T], timeout: float, what: str) -> T:
    """Await ``aw`` for at most ``timeout`` seconds; raise ``DaemonError`` naming ``what`` if late.

    As ``asyncio.wait_for``, a late call is cancelled, and one that finishes while being cancelled
    gives its result (or raises its error), so a connection made at the deadline is not dropped
    unclosed. Unlike it, the cancellation is waited for :data:`CANCEL_GRACE_S` at most: hivemind's
    DHT calls can swallow it, and ``wait_for`` then waited forever (a node's membership close
    hung that way, with p2pd alive). A call abandoned so runs on; its outcome is dropped.
    """
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    except asyncio.CancelledError:
        _abandon(task)
        raise
    if not done or task.cancelled():
        _abandon(task)
        raise DaemonError(f"{what}: no answer within {timeout:.1f} s")
    return task.result()


def _abandon(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and stop waiting for it; its error, if any, is retrieved when it ends."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


class _PubsubP2P(P2P):  # type: ignore[misc]
    """hivemind's P2P with extra p2pd flags. Subclassed per start (``_flags``, ``_instances``)."""

    _flags: ClassVar[dict[str, Any]] = {}
    _instances: ClassVar[list[P2P]] = []

    def __init__(self) -> None:
        super().__init__()
        type(self)._instances.append(self)

    @classmethod
    def _make_process_args(cls, *args: Any, **kwargs: Any) -> list[str]:
        kwargs.update(cls._flags)
        out: list[str] = P2P._make_process_args(*args, **kwargs)
        return out


def _daemon_flags(config: SwarmConfig) -> dict[str, Any]:
    flags: dict[str, Any] = {"pubsub": 1, "pubsubRouter": "gossipsub"}
    if config.metrics_addr:
        flags["metricsAddr"] = config.metrics_addr
    if config.gossip_heartbeat_s is not None:
        flags["gossipsubHeartbeatInterval"] = f"{config.gossip_heartbeat_s}s"
        flags["gossipsubHeartbeatInitialDelay"] = f"{min(0.1, config.gossip_heartbeat_s)}s"
    if _uses_relays(config):
        # static relays only: with discovery on, p2pd's autorelay waits for 4 candidates
        # (3 minutes' boot delay) before it reserves a slot on the one relay a run has
        flags["relayDiscovery"] = 0
    relay = config.relay_service
    if relay is None:
        flags["relayService"] = 0  # p2pd's default is to relay for anyone
    else:
        flags.update(
            relay=1,
            relayService=1,
            relayMaxCircuits=relay.max_circuits,
            relayMaxReservations=relay.max_reservations,
            relayDataLimit=relay.circuit_bytes,
            relayTimeLimit=f"{relay.circuit_s}s",
            relayBufferSize=relay.buffer_bytes,
        )
    return flags


def _uses_relays(config: SwarmConfig) -> bool:
    """Whether p2pd should reserve slots on ``config.relays`` (``-autoRelay``)."""
    return config.nat_traversal and bool(config.relays)


def _child_env(config: SwarmConfig) -> dict[str, str]:
    """The variables the p2pd child gets on top of this process's environment."""
    return {"GOGC": str(config.gogc)} if config.gogc else {}


@contextlib.contextmanager
def _environ_for_spawn(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in ``os.environ`` while p2pd is spawned, restored after: hivemind's
    ``P2P.create`` copies ``os.environ`` into the child and takes no env of its own. The node
    starts one p2pd at a time and nothing else spawns meanwhile."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SwarmHost:
    """A running p2pd and the hivemind ``P2P`` client attached to it. Build with :meth:`start`."""

    def __init__(self, p2p: P2P, config: SwarmConfig) -> None:
        self.p2p = p2p
        self.config = config
        self._closed = False
        self._killed = False

    @classmethod
    async def start(cls, config: SwarmConfig) -> SwarmHost:
        """Launch p2pd and connect to it.

        Raises:
            ConfigError: ``identity_path`` given but missing (hivemind would write an RSA key there).
            DaemonError: p2pd did not start and answer within ``startup_timeout_s`` (+ one call).
        """
        if config.identity_path is not None and not os.path.isfile(config.identity_path):
            raise ConfigError(
                f"identity file {config.identity_path!r} does not exist; create it with "
                "distronet.protocol.identity.Identity.generate().save(path)"
            )
        cls_p2p: type[_PubsubP2P] = type(
            "_RunP2P", (_PubsubP2P,), {"_flags": _daemon_flags(config), "_instances": []}
        )
        # Relays are dialled after the start, not as p2pd bootstrap peers: autorelay connects to
        # them first, and p2pd's bootstrap then skips a connected peer without counting it, so a
        # list of relays alone would fail with "failed to connect to bootstrap peers".
        relays = config.relays if _uses_relays(config) else ()
        boot = [m for m in config.bootstrap if m not in relays]
        create = cls_p2p.create(
            initial_peers=boot or None,
            host_maddrs=list(config.host_maddrs),
            announce_maddrs=list(config.announce_maddrs) or None,
            identity_path=config.identity_path,
            idle_timeout=config.idle_timeout_s,
            startup_timeout=config.startup_timeout_s,
            auto_nat=config.nat_traversal,
            nat_port_map=config.nat_traversal,
            use_relay=config.nat_traversal or config.relay_service is not None,
            use_auto_relay=_uses_relays(config),
            trusted_relays=list(config.relays) if _uses_relays(config) else None,
            force_reachability=None if config.reachability == "auto" else config.reachability,
            check_if_identity_free=False,
        )
        try:
            with _environ_for_spawn(_child_env(config)):
                p2p = await with_deadline(
                    create, config.startup_timeout_s + config.call_timeout_s, "p2pd start"
                )
        except BaseException as e:
            for half_built in cls_p2p._instances:  # never leave a daemon behind a failed start
                half_built._terminate()
            if isinstance(e, DaemonError | asyncio.CancelledError):
                raise
            if "failed to connect to bootstrap peers" in str(e):  # p2pd exits when none answers
                raise DaemonError(
                    f"none of the {len(config.bootstrap)} bootstrap peer(s) answered; "
                    "check the addresses or retry when the run's peers are up"
                ) from e
            raise DaemonError(f"p2pd failed to start: {e}") from e
        host = cls(p2p, config)
        for m in relays:  # also puts their addresses in p2pd's peerstore, for the DHT's pings
            try:
                await host.connect(m)
            except DaemonError as e:
                log.warning("relay %s did not answer: %s", m, e)
        return host

    @property
    def peer_id(self) -> PeerID:
        pid: PeerID = self.p2p.peer_id
        return pid

    @property
    def peer_id_b58(self) -> str:
        return str(self.p2p.peer_id.to_base58())

    @property
    def pid(self) -> int | None:
        """The p2pd process id (for tests and metrics), or None once it is gone."""
        child = self.p2p._child
        return None if child is None else int(child.pid)

    @property
    def alive(self) -> bool:
        child = self.p2p._child
        return not self._closed and not self._killed and child is not None and child.returncode is None

    @property
    def control_maddr(self) -> Multiaddr:
        """The daemon's control socket (what the gossip client connects to)."""
        return self.p2p.daemon_listen_maddr

    @functools.cached_property
    def control_path(self) -> str:
        """The control socket's file path, parsed once (a multiaddr lookup costs ~0.1 ms in
        Python, and every stream open and pubsub request needs it)."""
        return str(self.control_maddr["unix"])

    async def maddrs(self) -> list[str]:
        """Our dialable multiaddrs, each ending in ``/p2p/<peer id>`` (for others' bootstrap)."""
        got = await with_deadline(
            self.p2p.get_visible_maddrs(latest=True), self.config.call_timeout_s, "identify"
        )
        return [str(m) for m in got]

    async def connect(self, maddr: str) -> None:
        """Dial a peer by full multiaddr. Raises DaemonError when it fails or runs late."""
        m = Multiaddr(maddr)
        peer = PeerID.from_base58(m["p2p"])
        bare = m.decapsulate(Multiaddr(f"/p2p/{m['p2p']}"))
        req = pb.Request(
            type=pb.Request.CONNECT, connect=pb.ConnectRequest(peer=peer.to_bytes(), addrs=[bare.to_bytes()])
        )
        try:
            await control.request(self.control_path, req, self.config.call_timeout_s)
        except DaemonError as e:
            raise DaemonError(f"cannot connect to {maddr}: {e}") from e

    async def disconnect(self, peer: PeerID) -> None:
        """Close our connections to ``peer``. Raises DaemonError when p2pd fails or runs late."""
        req = pb.Request(type=pb.Request.DISCONNECT, disconnect=pb.DisconnectRequest(peer=peer.to_bytes()))
        try:
            await control.request(self.control_path, req, self.config.call_timeout_s)
        except DaemonError as e:
            raise DaemonError(f"cannot disconnect {peer.to_base58()}: {e}") from e

    @functools.cached_property
    def relay_ids(self) -> frozenset[str]:
        """The base58 peer ids of ``config.relays``."""
        return frozenset(m.rsplit("/p2p/", 1)[1] for m in self.config.relays)

    async def relayed_peers(self) -> set[str]:
        """Peers (base58) we reach only through a relay: every connection's remote address
        holds ``/p2p-circuit``. Raises DaemonError when p2pd does not answer in time."""
        direct: set[str] = set()
        relayed: set[str] = set()
        for peer, addr in await self.connections():
            (relayed if "/p2p-circuit" in addr else direct).add(peer)
        return relayed - direct

    async def _list_peers(self) -> list[Any]:
        """p2pd's ``LIST_PEERS``: one ``PeerInfo`` message a connected peer. Raises DaemonError."""
        req = pb.Request(type=pb.Request.LIST_PEERS)
        resp = await control.request(
            self.control_path, req, self.config.call_timeout_s, limit=control.MAX_LIST_FRAME
        )
        return list(resp.peers)

    async def connected_peers(self) -> list[PeerID]:
        return [control.peer_id(info.id) for info in await self._list_peers()]

    async def connections(self, limit: int = 4096) -> list[tuple[str, str]]:
        """Our open connections as ``(peer id, remote multiaddr)``, one per connection (p2pd's
        ``LIST_PEERS``), at most ``limit``. Raises DaemonError when p2pd does not answer in time."""
        out: list[tuple[str, str]] = []
        for info in (await self._list_peers())[:limit]:
            peer = control.peer_id(info.id).to_base58()
            out.extend((peer, str(Multiaddr(a))) for a in info.addrs[:4])  # one address a connection
        return out

    async def close(self) -> None:
        """Stop p2pd: SIGTERM, then SIGKILL after ``close_timeout_s``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        child = self.p2p._child
        try:
            await asyncio.wait_for(self.p2p.shutdown(), self.config.close_timeout_s)
        except asyncio.TimeoutError:
            if child is not None and child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.kill()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(child.wait(), self.config.close_timeout_s)
        await asyncio.sleep(0)  # let cancelled control tasks finish before reaping them
        self._reap_client_tasks()

    def _reap_client_tasks(self) -> None:
        """Mark hivemind's control-connection tasks as retrieved (they fail once p2pd is gone)."""
        control = getattr(getattr(self.p2p, "_client", None), "control", None)
        for task in (getattr(control, "_read_task", None), getattr(control, "_write_task", None)):
            if task is not None and task.done() and not task.cancelled():
                task.exception()

    def kill(self) -> None:
        """SIGKILL p2pd without any goodbye (crash simulation for tests and chaos)."""
        pid = self.pid
        self._killed = True
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
