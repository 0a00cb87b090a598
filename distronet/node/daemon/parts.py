"""The parts a node is built from, each made by one function (the daemon only calls these).

- :func:`load_identity`  the persistent Ed25519 libp2p key in the data dir (p2pd's key file).
- :func:`optimizer_config` / :func:`exchange_config`  the run's ``[optimizer]`` / ``[exchange]``.
- :func:`start_swarm`  p2pd + DHT membership + gossip, bootstrapped from the coordinator's peers.
- :class:`ShardFeed`  batches from the leased shard; knows when a shard is done.
- :func:`no_dynamo_for_optimizers`  a node never compiles: skip TorchDynamo's lazy import.
- :func:`warm_decoder`  warm the payload decoder's compiled walk while start-up waits on the network.
- :func:`warm_compiled_decoder`  that warm-up in this thread, leaving the marker later processes trust.
- :func:`wait_decoder_warm`  wait for that before the first step.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import logging
import os
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from distronet.node.config import NodeConfig
from distronet.node.daemon.coordinator_client import Lease
from distronet.node.data.batch_share import draw_windows
from distronet.node.data.order import BatchOrder
from distronet.node.exchange.swarm import ExchangeConfig
from distronet.node.models.spec import ModelSpec
from distronet.node.optim.config import DistroConfig, preset
from distronet.node.swarm.admission import Admission
from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.errors import SwarmError
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.stack import Swarm
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity, peer_id_from_b58

__all__ = [
    "ShardFeed",
    "awaiting",
    "check_vocab",
    "exchange_config",
    "load_identity",
    "no_dynamo_for_optimizers",
    "optimizer_config",
    "peer_index",
    "preload_torch",
    "start_swarm",
    "wait_decoder_warm",
    "wait_torch",
    "warm_compiled_decoder",
    "warm_decoder",
]

log = logging.getLogger(__name__)
IDENTITY_FILE = "identity.key"


def load_identity(data_dir: Path) -> tuple[Identity, Path]:
    """The node's key from ``data_dir/identity.key``, generated (0600) on first use."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / IDENTITY_FILE
    if path.exists():
        return Identity.load(path), path
    ident = Identity.generate()
    ident.save(path)
    return ident, path


def optimizer_config(run_id: str, table: dict[str, Any]) -> DistroConfig:
    """``[optimizer]``: ``preset`` (default ``ours_k32``) plus any ``DistroConfig`` field overrides.

    ``name`` (e.g. ``"distro"``) is accepted and must be ``distro``. Raises ``ConfigError``.
    """
    t = dict(table)
    name = t.pop("name", "distro")
    if name != "distro":
        raise ConfigError(f"this node runs only the 'distro' optimizer, the run asks for {name!r}")
    return preset(str(t.pop("preset", "ours_k32")), run_id=run_id, **t)


def exchange_config(table: dict[str, Any]) -> ExchangeConfig:
    """``[exchange]``: ``strategy`` (only ``all-gather``) and ``ExchangeConfig`` timing fields."""
    t = dict(table)
    strategy = t.pop("strategy", "all-gather")
    if strategy != "all-gather":
        raise ConfigError(f"exchange strategy {strategy!r} is not built; use 'all-gather'")
    allowed = {f.name for f in dataclasses.fields(ExchangeConfig)} - {"limits"}
    bad = sorted(set(t) - allowed)
    if bad:
        raise ConfigError(f"run exchange: unknown key(s) {', '.join(bad)}")
    values: dict[str, Any] = {k: float(v) if k.endswith("_s") else int(v) for k, v in t.items()}
    return ExchangeConfig(**values)


def check_vocab(spec: ModelSpec, data: dict[str, Any]) -> None:
    """Refuse a run whose shards hold token ids its model cannot embed: the manifest's
    ``vocab_size`` (a tokenizer's run; a byte-level run has none and needs 256) against the
    model's vocabulary. Raises ``ConfigError`` saying which to change."""
    want = data.get("vocab_size")
    if isinstance(want, int) and not isinstance(want, bool) and want > spec.vocab:
        raise ConfigError(
            f"the run's data has a vocabulary of {want} tokens but its model embeds {spec.vocab}: "
            "raise the model's vocab (vocab_size) or prepare the data with a smaller tokenizer"
        )


def admission(cfg: NodeConfig, run_info: dict[str, Any]) -> Admission:
    """The swarm's admission registry: enforced when the run publishes a coordinator key and
    ``cfg.require_admission`` is on (said in the log either way)."""
    key_b58 = run_info.get("coordinator_key")
    if not isinstance(key_b58, str):
        log.warning("run %s has no coordinator key: the swarm admits any peer", cfg.run_id)
        return Admission(cfg.run_id, None)
    if not cfg.require_admission:
        log.warning("require_admission is off: the swarm of run %s admits any peer", cfg.run_id)
        return Admission(cfg.run_id, None)
    try:
        out = Admission(cfg.run_id, peer_id_from_b58(key_b58))
    except ValueError as e:
        raise ConfigError(f"the run's coordinator_key is not an Ed25519 peer id: {e}") from None
    log.info("admission enforced: coordinator key %s", key_b58)
    return out


def bootstrap_addrs(peers: list[dict[str, Any]], own: str) -> tuple[str, ...]:
    """Full multiaddrs (``…/p2p/<id>``) of the coordinator's bootstrap peers, ours left out."""
    out: list[str] = []
    for p in peers:
        pid = str(p.get("peer_id", ""))
        if not pid or pid == own:
            continue
        for m in p.get("multiaddrs", [])[:8]:
            m = str(m)
            out.append(m if "/p2p/" in m else f"{m}/p2p/{pid}")
    return tuple(out)


async def start_swarm(
    cfg: NodeConfig,
    run_id: str,
    identity: Identity,
    key_path: Path,
    bootstrap: tuple[str, ...],
    relays: tuple[str, ...] = (),
) -> Swarm:
    """p2pd with our key, joined through ``bootstrap``; alone when none is given or none answers.

    ``relays`` (the coordinator's, then ``--relays``) are bootstrap peers too — a relay is a DHT
    node every peer can reach — and p2pd reserves a slot on them when it is unreachable.

    Raises ``SwarmError`` (``DaemonError``, ``MembershipError``) when even a lone start fails.
    """
    net = cfg.net
    metrics = f"127.0.0.1:{net.p2pd_metrics_port}" if net.p2pd_metrics_port else None
    bw = Bandwidth.from_rates(net.up, net.down)
    members = MembershipConfig(run_id=run_id, ttl_s=15.0, dht_wait_timeout_s=2.0)

    def swarm_cfg(boot: tuple[str, ...]) -> SwarmConfig:
        return SwarmConfig(
            host_maddrs=tuple(m.strip() for m in net.listen.split(",") if m.strip()),
            bootstrap=boot,
            identity_path=str(key_path),
            metrics_addr=metrics,
            nat_traversal=net.nat_traversal,
            gossip_heartbeat_s=net.gossip_heartbeat_s,
            gogc=net.p2pd_gogc,
            relays=all_relays,
            reachability=net.reachability,
        )

    all_relays = tuple(dict.fromkeys((*relays, *net.relay_list)))
    bootstrap = tuple(dict.fromkeys((*all_relays, *bootstrap)))

    if bootstrap:
        try:
            return await Swarm.start(identity, swarm_cfg(bootstrap), members, bandwidth=bw)
        except SwarmError as e:
            if all_relays and bootstrap != all_relays:
                log.warning("no bootstrap peer answered (%s); starting with the relays only", e)
                try:
                    return await Swarm.start(identity, swarm_cfg(all_relays), members, bandwidth=bw)
                except SwarmError as e2:
                    e = e2
            log.warning("no bootstrap peer answered (%s); starting alone", e)
    return await Swarm.start(identity, swarm_cfg(()), members, bandwidth=bw)


def no_dynamo_for_optimizers() -> None:
    """Let ``torch.optim.Optimizer``'s ``add_param_group``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict`` run as plain functions in this process.

    torch wraps them in ``torch._disable_dynamo``, which imports TorchDynamo (sympy, inductor
    config, DTensor, ...) on the first call — about 2 CPU-s at every node start, spent only to
    keep ``torch.compile`` from tracing them. The node never compiles, so each wrapper is given
    its own function as the "disabled" version, which the wrapper caches and calls from then on.
    Idempotent; a torch without these wrappers is left as it is.
    """
    import torch  # this module loads before torch does (preload_torch imports it in a thread)

    for name in ("add_param_group", "zero_grad", "state_dict", "load_state_dict"):
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = fn


def _decoder_marker() -> Path:
    from distronet.kernels.coding import jit_cache_dir

    return jit_cache_dir() / "coding_jit.warm"


def warm_compiled_decoder() -> bool:
    """Compile the payload decoder's walk in this process (``kernels.coding.warm``), then leave a
    marker next to numba's cache saying which sources it was built from, so later processes
    trust the cache (:func:`warm_decoder`) and decode compiled from their first packet. Returns
    whether the compiled path is available; a read-only install just gets no marker."""
    from distronet.kernels.coding import jit_stamp, warm

    if not warm():
        return False
    with contextlib.suppress(OSError, importlib.metadata.PackageNotFoundError):
        marker = _decoder_marker()
        marker.parent.mkdir(exist_ok=True)
        # written aside and renamed: node processes starting at once each rewrite it, and one
        # reading it mid-write would take the half-written stamp for a stale cache
        tmp = marker.with_name(f"{marker.name}.tmp.{os.getpid()}.{threading.get_ident()}")
        try:
            tmp.write_text(jit_stamp())
            os.replace(tmp, marker)
        finally:
            tmp.unlink(missing_ok=True)
    return True


def _trust_cached_decoder() -> None:
    """Decode compiled at once when an earlier :func:`warm_compiled_decoder` left numba's cache for
    these very sources: the first decode then loads it (~1 s) instead of the reference decoding."""
    from distronet.kernels.coding import jit_stamp, mark_warm

    with contextlib.suppress(OSError, importlib.metadata.PackageNotFoundError):
        if _decoder_marker().read_text() == jit_stamp():
            mark_warm()


def _warm_decoder() -> None:
    try:
        warm_compiled_decoder()
    except Exception as e:  # the decoder then uses its reference path, as without numba
        log.debug("payload decoder not warmed ahead: %s", e)


def _in_background(name: str, target: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    _background[name] = t
    return t


def _wait_background(name: str, timeout: float) -> bool:
    """Block until the thread ``name`` started by this process has finished (at most
    ``timeout`` seconds); True when none runs any more."""
    t = _background.get(name)
    if t is not None:
        t.join(timeout)
    return t is None or not t.is_alive()


_background: dict[str, threading.Thread] = {}


def warm_decoder() -> threading.Thread:
    """Warm the payload decoder's compiled walk (:func:`warm_compiled_decoder`: numba's import
    and its on-disk cache, ~1-2 CPU-s) in a daemon thread; when the cache is known to fit
    (the marker), decoding takes the compiled path from now on.

    Started before the coordinator calls and p2pd's start, it runs while those wait on the
    network (the GIL is free then), instead of inside the first step's decode, so a newcomer
    is in step sooner. Returns the thread (tests join it).
    """
    _trust_cached_decoder()
    return _in_background("warm-decoder", _warm_decoder)


def wait_decoder_warm(timeout: float) -> bool:
    """Wait for :func:`warm_decoder`'s thread (at most ``timeout`` s); True when it is done.
    Called before the first step, so that the warm-up's CPU lands before training rather than
    inside the first steps (where the first decode would wait on numba's compile lock anyway)."""
    return _wait_background("warm-decoder", timeout)


def _preload_torch() -> None:
    try:
        import torch  # noqa: F401  (the import is the point: ~1-2 CPU-s, in this thread)

        no_dynamo_for_optimizers()
    except Exception as e:  # the node's own import of torch then raises it where it is used
        log.debug("torch not preloaded: %s", e)


def preload_torch() -> threading.Thread:
    """Import torch (~1-2 CPU-s, the largest part of a node's start) in a daemon thread.

    Started by ``join`` before anything else, it runs while the node reads the run from the
    coordinator, joins it and starts p2pd (the daemon module and everything it runs before
    ``Node._backend`` import no torch), and applies :func:`no_dynamo_for_optimizers`."""
    return _in_background("preload-torch", _preload_torch)


def wait_torch(timeout: float) -> bool:
    """Wait for :func:`preload_torch`'s thread (at most ``timeout`` s); True when it is done.
    Called before the node builds its model."""
    return _wait_background("preload-torch", timeout)


def peer_index(peer_id: bytes) -> int:
    """A stable non-negative index for the data order of this peer."""
    return int.from_bytes(hashlib.sha256(peer_id).digest()[:4], "big") >> 1


class ShardFeed:
    """Batches for each step from the shard currently leased; ``done`` once it has been read through.

    A shard of ``n`` tokens lasts ``max(1, n // (batch * seq_len))`` steps.
    """

    def __init__(self, seed: int, peer: int, batch: int, seq_len: int) -> None:
        self.seed, self.peer, self.batch, self.seq_len = seed, peer, batch, seq_len
        self.lease: Lease | None = None
        self._order: BatchOrder | None = None
        self._start = 0
        self.steps_in_shard = 0

    def switch(self, lease: Lease, tokens: np.ndarray, at_step: int) -> None:
        self.lease, self._start = lease, at_step
        self._order = BatchOrder(tokens, lease.shard_id, self.seed, self.peer, self.batch, self.seq_len)
        self.steps_in_shard = max(1, tokens.size // (self.batch * self.seq_len))

    def done(self, step: int) -> bool:
        """True when ``step`` (the next to run) is past this shard's share of steps."""
        return self.lease is not None and step - self._start >= self.steps_in_shard

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        if self._order is None:
            raise ConfigError("no shard leased yet")
        return self._order.xy(max(0, step - self._start))

    def draw(self, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` windows of the shard's order at ``step`` (``batch_share.draw_windows``): the first
        ``batch`` are exactly ``self(step)``, the rest the same stream read further. Raises
        ``ConfigError`` before a shard is leased or for ``n < 1``."""
        if self._order is None:
            raise ConfigError("no shard leased yet")
        return draw_windows(self._order, max(0, step - self._start), n)


def awaiting(task: asyncio.Future[Any]) -> str:
    """The chain of coroutines ``task`` is suspended in, outermost first (a traceback's format):
    where a task that does not finish is stuck."""
    frames: list[traceback.FrameSummary] = []
    aw: Any = task.get_coro() if isinstance(task, asyncio.Task) else None
    while aw is not None and len(frames) < 40:
        frame = getattr(aw, "cr_frame", None) or getattr(aw, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            frames.append(traceback.FrameSummary(code.co_filename, frame.f_lineno, code.co_name))
        aw = getattr(aw, "cr_await", None) or getattr(aw, "gi_yieldfrom", None)
    return "".join(traceback.format_list(frames)) or f"{task!r}\n"
