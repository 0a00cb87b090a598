"""A real coordinator in the root namespace and real ``distro-node join`` processes in shaped ones.

:class:`NetnsSwarm` is :class:`distronet.node.demo.LocalSwarm` (status files, step waits, stop
and clean-up) with two differences: the coordinator listens on the bridge address of a
:class:`~distronet.node.bench.netns.ShapedNet`, and node ``i`` runs inside namespace ``i``
(``ip netns exec``), listening on its own address, with the budget it is given.
:func:`write_shaped_run` writes the run (data shards from ``demo.write_run``; model, optimizer
and exchange timing as given).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distronet.node.bench.netns import CountedNet
from distronet.node.demo import LocalSwarm, SwarmFailure, write_run
from distronet.protocol.identity import Identity

__all__ = [
    "SMALL_GPT",
    "SMALL_OPTIMIZER",
    "NetnsSwarm",
    "SwarmFailure",
    "new_relay",
    "small_exchange",
    "write_shaped_run",
]

# The run the namespace tests and benches train: small enough that the state every node
# downloads at the start takes a few seconds at a home budget.
SMALL_GPT: dict[str, Any] = {
    "arch": "gpt",
    "depth": 2,
    "width": 32,
    "heads": 4,
    "context": 64,
    "seed": 1,
    "batch": 8,
    "seq_len": 64,
}
SMALL_OPTIMIZER: dict[str, Any] = {"preset": "ours_k32", "lr": 3e-3, "chunk": 16, "k": 64}


def small_exchange(round_deadline_s: float) -> dict[str, Any]:
    """The exchange timing of those runs, at ``round_deadline_s``."""
    return {
        "round_deadline_s": round_deadline_s,
        "manifest_grace_s": 0.2,
        "manifest_wait_s": 1.5,
        "pull_timeout_s": 10.0,
        "retention": 32,
    }


def new_relay(folder: Path, ip: str, port: int) -> str:
    """A fresh relay identity in ``folder/relay0`` (where ``NetnsSwarm.start_relay`` looks for
    it) and the relay's full multiaddr at ``ip``:``port``, for the run file's ``relays``."""
    (folder / "relay0").mkdir(parents=True, exist_ok=True)
    ident = Identity.generate()
    ident.save(folder / "relay0" / "identity.key")
    return f"/ip4/{ip}/tcp/{port}/p2p/{ident.peer_id_b58}"


def _toml_table(name: str, values: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())


def write_shaped_run(
    folder: Path,
    run_id: str,
    *,
    model: dict[str, Any],
    optimizer: dict[str, Any],
    exchange: dict[str, Any],
    shards: int = 8,
    shard_tokens: int = 20_000,
    relays: Sequence[str] = (),
) -> Path:
    """The run TOML under ``folder`` (shards of the built-in corpus beside it); its path.

    ``optimizer`` holds ``DistroConfig`` overrides (``preset``, ``k``, ``overlap``, ...);
    ``exchange`` the ``ExchangeConfig`` timing (``round_deadline_s``, ...); ``relays`` the
    run's circuit relays (full multiaddrs, handed to every joining node).
    """
    run = write_run(folder, run_id, shards=shards, shard_tokens=shard_tokens, model=model)
    run.write_text(
        f'id = "{run_id}"\nheartbeat_interval_s = 2.0\nnode_timeout_s = 15.0\n'
        + (f"relays = {json.dumps(list(relays))}\n" if relays else "")
        + _toml_table("model", model)
        + _toml_table("optimizer", {"name": "distro", **optimizer})
        + _toml_table("exchange", {"strategy": "all-gather", **exchange})
        + _toml_table(
            "data",
            {"manifest": "data/manifest.json", "epochs": 100, "lease_ttl_s": 60, "max_leases_per_node": 1},
        )
        + _toml_table("credit", {"min_steps": 0})  # trusted completions: no receipts sent yet
    )
    return run


class NetnsSwarm(LocalSwarm):
    """Coordinator on ``net.host_ip``; node ``i`` inside ``net.ns(i)``. A context manager."""

    def __init__(self, net: CountedNet, folder: Path, run_toml: Path, run_id: str) -> None:
        super().__init__(folder, run_toml, run_id, log=False)
        self.net = net
        self.where: list[int] = []  # node i runs in namespace where[i]
        self.relays: list[subprocess.Popen[bytes]] = []

    def start_relay(self, where: int, *extra: str, port: int = 4002, timeout: float = 30.0) -> list[str]:
        """`distro-node relay` in namespace ``where``, listening on its address and ``port``;
        its full multiaddrs once it is up. Raises SwarmFailure when it exits or runs late."""
        d = self.folder / f"relay{len(self.relays)}"
        d.mkdir(exist_ok=True)
        addr_file = d / "addrs.json"
        addr_file.unlink(missing_ok=True)
        cmd = [*self.net.exec_prefix(where), sys.executable, "-m", "distronet.node.cli", "relay",
               "--data-dir", str(d), "--listen", f"/ip4/{self.net.node_ip(where)}/tcp/{port}",
               "--addr-file", str(addr_file), "--log-level", "warning", *extra]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(cmd, env=env, stdout=self._out(d.name), stderr=subprocess.STDOUT)
        self.relays.append(proc)
        end = time.monotonic() + timeout
        while not addr_file.exists():
            if proc.poll() is not None or time.monotonic() > end:
                raise SwarmFailure(f"relay in namespace {where} did not come up; see {d}.log")
            time.sleep(0.05)
        maddrs: list[str] = json.loads(addr_file.read_text())
        return maddrs

    def __enter__(self) -> NetnsSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for p in self.relays:
                self.stop(p, timeout=10.0)

    def start_coordinator(
        self, timeout: float = 30.0, *, port: int = 0, host: str = "", extra: Sequence[str] = ()
    ) -> str:
        """The coordinator on the bridge address (every namespace reaches it), with per-client rate
        limits loose enough for nodes that all come through one subnet."""
        loose = ("--peer-rate", "200", "--peer-burst", "400", "--ip-rate", "500", "--ip-burst", "1000")
        return super().start_coordinator(
            timeout, port=port, host=host or self.net.host_ip, extra=(*loose, *extra)
        )

    def start_node(
        self, *extra: str, min_peers: int = 1, status: str = "off", where: int | None = None
    ) -> int:
        """Start the next node (index = how many were started) in namespace ``where`` (default:
        the namespace of the same index); its index.

        ``extra`` flags follow the defaults, so ``--up``/``--down`` given there win. The nodes log
        at ``DISTRO_BENCH_LOG_LEVEL`` (default ``warning``; ``info`` shows each round's manifest).
        """
        i = len(self.nodes)
        ns = i if where is None else where
        if not 0 <= ns < self.net.n:
            raise SwarmFailure(f"only {self.net.n} namespaces were built")
        d = self.folder / f"node{i}"
        d.mkdir(exist_ok=True)
        env = {**os.environ, "DISTRO_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [*self.net.exec_prefix(ns), sys.executable, "-m", "distronet.node.cli", "join", self.run_id,
               "--coordinator", self.url, "--data-dir", str(d),
               "--listen", f"/ip4/{self.net.node_ip(ns)}/tcp/0", "--no-nat-traversal",
               "--gossip-heartbeat-s", "0.5", "--min-peers", str(min_peers), "--status", status,
               "--log-level", os.environ.get("DISTRO_BENCH_LOG_LEVEL", "warning"), *extra]  # fmt: skip
        self.nodes.append(
            subprocess.Popen(cmd, env=env, stdout=self._out(f"node{i}"), stderr=subprocess.STDOUT)
        )
        self.node_dirs.append(d)
        self.where.append(ns)
        return i
