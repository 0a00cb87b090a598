"""``NodeConfig``: everything a volunteer can set, from flags, ``DISTRO_*`` variables or a TOML file.

One frozen dataclass per component, nested into :class:`NodeConfig`. Every field is exactly one
command-line flag (``--max-steps``), one environment variable (``DISTRO_MAX_STEPS``) and one key
in the config file (``max_steps`` at the top level for :class:`NodeConfig`'s own fields, else
under the component's table, e.g. ``[net] up = "10mbit"``). Precedence: flag > environment >
file > default. ``run_id`` is the positional argument; ``--config FILE`` (or ``DISTRO_CONFIG``)
names the file and is the one flag without a field.

The run's own settings (model, optimizer, exchange timing) come from the coordinator, not from
here: a volunteer decides only what concerns their machine.

Process tuning is here too, each with its reason, and applied in the open where it acts:
``train.omp_spincount`` becomes ``GOMP_SPINCOUNT`` before torch loads (``join.py``),
``net.p2pd_gogc`` becomes ``GOGC`` in the p2pd child's environment (``swarm/p2p.py``),
``event_loop`` picks the loop ``join.py`` runs the daemon on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomllib

from distronet.node.models.fit import parse_size
from distronet.node.swarm.budget import parse_rate
from distronet.protocol.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "NetConfig",
    "NodeConfig",
    "ObserveConfig",
    "TrainConfig",
    "add_config_arguments",
    "config_from_args",
    "flag_fields",
]

ENV_PREFIX = "DISTRO_"
DEVICES = ("auto", "cuda", "mps", "mlx", "cpu")
EVENT_LOOPS = ("uvloop", "asyncio")
PRECISIONS = ("auto", "fp32", "bf16")  # backends.base.PRECISIONS (this module does not import torch)


def _f(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class NetConfig:
    """The node's libp2p side and its bandwidth budget."""

    up: str = _f("10mbit", "upload budget for payload traffic (e.g. 10mbit, 2MB/s, unlimited)")
    down: str = _f("100mbit", "download budget for payload traffic")
    listen: str = _f("/ip4/0.0.0.0/tcp/0", "libp2p listen multiaddr (comma-separated for several)")
    nat_traversal: bool = _f(True, "AutoNAT, UPnP, hole punching and relays (turn off on loopback)")
    relays: str = _f(
        "",
        "circuit relays to reserve a slot on when unreachable, full multiaddrs ending in /p2p/<id> "
        "(comma-separated), on top of those the run's coordinator hands out",
    )
    reachability: str = _f(
        "auto",
        "auto (AutoNAT decides) | private (behind NAT: use the relays at once) | public",
    )
    gossip_heartbeat_s: float = _f(1.0, "gossipsub heartbeat in seconds")
    reach_diagnosis_after_s: float = _f(
        60.0, "with no peer reached for this many seconds, log why (cause and remedy) and show it"
    )
    reach_diagnosis_every_s: float = _f(
        600.0, "repeat that diagnosis in the log this often (or on a new cause)"
    )
    p2pd_metrics_port: int = _f(0, "serve p2pd's own libp2p metrics on this port (0: off)")
    p2pd_gogc: int = _f(
        400,
        "GOGC of the p2pd child: Go collects its small heap a quarter as often as at Go's 100, "
        "~1 ms less CPU a step in a 4-node swarm (0: inherit the environment's)",
    )

    def __post_init__(self) -> None:
        parse_rate(self.up), parse_rate(self.down)
        if not self.listen.strip():
            raise ConfigError("listen must name at least one multiaddr")
        if self.gossip_heartbeat_s <= 0:
            raise ConfigError(f"gossip_heartbeat_s must be > 0, got {self.gossip_heartbeat_s}")
        if self.reach_diagnosis_after_s <= 0 or self.reach_diagnosis_every_s <= 0:
            raise ConfigError("reach_diagnosis_after_s and reach_diagnosis_every_s must be > 0")
        if self.reachability not in ("auto", "public", "private"):
            raise ConfigError(f"reachability must be auto, public or private, got {self.reachability!r}")
        for m in self.relay_list:
            if "/p2p/" not in m:
                raise ConfigError(f"a relay address must end in /p2p/<peer id>, got {m!r}")
        if self.p2pd_gogc < 0:
            raise ConfigError(f"p2pd_gogc must be >= 0, got {self.p2pd_gogc}")

    @property
    def relay_list(self) -> tuple[str, ...]:
        """``relays`` split on commas, blanks dropped."""
        return tuple(m.strip() for m in self.relays.split(",") if m.strip())


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How long and how this machine trains."""

    device: str = _f("auto", "auto | cuda | mps | mlx | cpu (mlx: Apple MLX, pip extra [mlx])")
    max_steps: int = _f(0, "stop cleanly once the step counter reaches this (steps 0..N-1; 0: no limit)")
    max_seconds: float = _f(0.0, "stop cleanly after this many seconds of training (0: no limit)")
    checkpoint_every: int = _f(50, "save a local checkpoint every this many steps (0: never)")
    min_peers: int = _f(1, "wait until this many nodes (this one included) are in the mesh before step 0")
    start_timeout_s: float = _f(120.0, "give up waiting for min_peers after this many seconds")
    threads: int = _f(0, "torch CPU threads (0: torch's default)")
    omp_spincount: int = _f(
        20_000,
        "GOMP_SPINCOUNT for torch's OpenMP workers: spinning ~0.1 ms, not libgomp's several ms, "
        "hands the core back to p2pd and the event loop after each region (0: the environment's)",
    )
    drift_every: int = _f(
        10, "compare the parameter hash with peers every this many steps; resync on mismatch (0: off)"
    )
    state_quorum: int = _f(
        2,
        "adopt a peer's state (catch-up, drift repair) only when this many distinct peers agree on it "
        "(fewer only when fewer were asked); docs/decisions/state-quorum.md",
    )

    micro_batch: int = _f(
        0,
        "windows per forward/backward pass, gradients accumulated over the step's batch (same "
        "tokens a step, less memory; 0: the run's model.micro_batch, else the whole batch)",
    )
    activation_checkpointing: bool = _f(
        False, "recompute activations in backward (less memory, ~1/3 more compute; on if the run asks)"
    )
    precision: str = _f("auto", "auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16 (CUDA only)")
    fit_check: bool = _f(
        True, "before downloading anything, refuse a run whose model does not fit this device's memory"
    )
    memory_cap: str = _f(
        "",
        "the most memory training may take here, e.g. 6GB or 512MiB (the fit check holds the run to "
        "it; empty: what the device has free)",
    )

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        counts = ("max_steps", "checkpoint_every", "threads", "drift_every", "omp_spincount", "micro_batch")
        for name in counts:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.memory_cap:
            parse_size(self.memory_cap)
        if self.state_quorum < 1:
            raise ConfigError(f"state_quorum must be >= 1, got {self.state_quorum}")
        if self.min_peers < 1 or self.start_timeout_s <= 0 or self.max_seconds < 0:
            raise ConfigError("min_peers must be >= 1, start_timeout_s > 0 and max_seconds >= 0")


@dataclasses.dataclass(frozen=True)
class ObserveConfig:
    """What the owner sees: the status line, the status file and Prometheus metrics."""

    status: str = _f("auto", "live status line: auto (when a terminal), line (one line per step), off")
    metrics_port: int = _f(0, "serve Prometheus /metrics on this port (0: off)")
    metrics_host: str = _f("127.0.0.1", "address /metrics listens on")
    log_level: str = _f("info", "debug | info | warning | error")

    def __post_init__(self) -> None:
        if self.status not in ("auto", "line", "off"):
            raise ConfigError(f"status must be auto, line or off, got {self.status!r}")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in 0..65535, got {self.metrics_port}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"unknown log_level {self.log_level!r}")


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """The whole node. ``run_id`` and ``coordinator`` are required; the rest has defaults."""

    run_id: str = _f("", "the run to join")
    coordinator: str = _f("", "the coordinator's base URL, e.g. http://coord.example:8470")
    data_dir: str = _f("~/.distro-node", "identity, checkpoints, shards and the status file live here")
    join_token: str = _f("", "join token from the run's operator (runs with token admission)")
    require_admission: bool = _f(
        True,
        "when the run's coordinator publishes a credential key, accept packets, manifests and "
        "pulls only from peers it admitted (off: admit any peer; logged at start)",
    )
    shutdown_timeout_s: float = _f(
        25.0,
        "after SIGINT/SIGTERM, exit within this many seconds: the step in flight gets what is left "
        "after 13 s set aside for leaving the run and stopping p2pd (at least 2 s)",
    )
    event_loop: str = _f(
        "uvloop", "uvloop (~3 ms less CPU a step than asyncio's; asyncio where it is missing) | asyncio"
    )
    net: NetConfig = dataclasses.field(default_factory=NetConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    observe: ObserveConfig = dataclasses.field(default_factory=ObserveConfig)

    def __post_init__(self) -> None:
        if not self.run_id or len(self.run_id) > 64:
            raise ConfigError(f"run id must be 1..64 characters, got {self.run_id!r}")
        if not self.coordinator.startswith(("http://", "https://")):
            raise ConfigError(
                f"--coordinator must be an http(s) URL, got {self.coordinator!r} "
                "(set it with --coordinator, DISTRO_COORDINATOR or `coordinator` in the config file)"
            )
        if self.shutdown_timeout_s <= 0:
            raise ConfigError("shutdown_timeout_s must be > 0")
        if self.event_loop not in EVENT_LOOPS:
            raise ConfigError(f"event_loop must be uvloop or asyncio, got {self.event_loop!r}")

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()


_SECTIONS: dict[str, type[Any]] = {"net": NetConfig, "train": TrainConfig, "observe": ObserveConfig}


def flag_fields() -> list[tuple[str | None, dataclasses.Field[Any]]]:
    """Every settable field as (section or None for top level, field), in declaration order."""
    out: list[tuple[str | None, dataclasses.Field[Any]]] = []
    for f in dataclasses.fields(NodeConfig):
        if f.name in _SECTIONS:
            out += [(f.name, g) for g in dataclasses.fields(_SECTIONS[f.name])]
        else:
            out.append((None, f))
    return out


def _kind(cls: type[Any], name: str) -> type[Any]:
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType):  # pragma: no cover - no optional fields today
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint  # type: ignore[no-any-return]


def _cls_of(section: str | None) -> type[Any]:
    return NodeConfig if section is None else _SECTIONS[section]


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``run_id``, ``--config`` and one flag per field (defaults left None to see what was given)."""
    p.add_argument("run_id", nargs="?", help="the run to join (or DISTRO_RUN_ID / run_id in the file)")
    p.add_argument("--config", default=None, help="TOML config file (env DISTRO_CONFIG)")
    for section, f in flag_fields():
        if f.name == "run_id":
            continue
        kind = _kind(_cls_of(section), f.name)
        flag = "--" + f.name.replace("_", "-")
        env = ENV_PREFIX + f.name.upper()
        text = f"{f.metadata['help']} [env {env}; default {f.default!r}]"
        if kind is bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            p.add_argument(flag, dest=f.name, type=str, default=None, metavar=f.name.upper(), help=text)


def _convert(kind: type[Any], raw: Any, where: str) -> Any:
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        try:
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off", ""):
                    return False
                raise ValueError(text)
            return kind(text)
        except ValueError:
            pass
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    raise ConfigError(f"{where}: expected {kind.__name__}, got {raw!r}")


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(Path(path).expanduser(), "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
    known_top = {f.name for s, f in flag_fields() if s is None} | set(_SECTIONS)
    unknown = sorted(set(doc) - known_top)
    for section, cls in _SECTIONS.items():
        table = doc.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: [{section}] must be a table")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown += [f"{section}.{k}" for k in sorted(set(table) - names)]
    if unknown:
        raise ConfigError(f"config file {path}: unknown key(s) {', '.join(unknown)}")
    return doc


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """Build the config: flag > ``DISTRO_*`` environment > config file > default.

    Raises ``ConfigError`` naming the bad setting and where it came from.
    """
    env = os.environ if environ is None else environ
    path = args.config or env.get(ENV_PREFIX + "CONFIG")
    doc = _read_file(path) if path else {}
    values: dict[str | None, dict[str, Any]] = {None: {}, **{s: {} for s in _SECTIONS}}
    for section, f in flag_fields():
        kind = _kind(_cls_of(section), f.name)
        env_name = ENV_PREFIX + f.name.upper()
        from_file = doc.get(f.name) if section is None else doc.get(section, {}).get(f.name)
        for raw, where in (
            (getattr(args, f.name, None), "--" + f.name.replace("_", "-")),
            (env.get(env_name), env_name),
            (from_file, f"{path}: {f.name if section is None else f'{section}.{f.name}'}"),
        ):
            if raw is not None:
                values[section][f.name] = _convert(kind, raw, where)
                break
    nested = {s: cls(**values[s]) for s, cls in _SECTIONS.items()}
    return NodeConfig(**values[None], **nested)
