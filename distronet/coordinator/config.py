"""The coordinator's configuration: one frozen dataclass, every field a CLI flag and a
``DISTRO_COORD_<FIELD>`` environment variable (the flag wins), and run files in TOML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomllib

from distronet.coordinator.errors import RunConfigError
from distronet.protocol.coordinator_api import CREATE_RUN, ApiError
from distronet.protocol.errors import ConfigError
from distronet.protocol.run_file import MODEL_CONFIG_MAX_BYTES, read_json_beside

__all__ = ["CoordinatorConfig", "load_run_file"]

HF_CONFIG_MAX_BYTES = MODEL_CONFIG_MAX_BYTES


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything `distro-coordinator serve` needs. Defaults suit one run of up to ~10k nodes."""

    host: str = "127.0.0.1"
    port: int = 8470
    data_dir: str = "./coordinator-data"
    db: str = ""  # default: sqlite:///<data_dir>/coordinator.db
    sqlite_sync: str = "FULL"  # FULL: survives power loss; NORMAL: survives a killed process
    commit_min_interval_s: float = 0.002  # group commits begin at most this often (GroupCommitter)
    operator_token: str | None = None  # required for every operator write; None: writes refused
    node_body_limit: int = 64 * 1024
    operator_body_limit: int = 64 * 1024 * 1024
    peer_rate: float = 20.0  # signed requests per second per peer
    peer_burst: float = 60.0
    ip_rate: float = 50.0  # unsigned requests per second per IP (challenge, join, reads)
    ip_burst: float = 200.0
    clock_skew_s: float = 60.0
    # The hot path's absolute deadlines (new bytes do not extend them): a request head must
    # arrive whole within head_timeout_s of its first byte, its body within body_timeout_s of
    # the head; and one IP address may hold at most max_conns_per_ip connections at once.
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_conns_per_ip: int = 64
    session_ttl_s: float = 3600.0  # a node session (HMAC key) lives this long; then the node opens another
    sweep_interval_s: float = 1.0
    shutdown_timeout_s: float = 10.0
    port_file: str | None = None  # write the bound port here once listening (for --port 0)
    # Young-generation threshold of the cyclic GC in a served process (older generations every
    # 50 and 100 young passes). Python's 700 ran a young pass every few requests (each keeps a
    # few hundred objects alive until its commit), which promoted them and set off full
    # collections that stalled the loop; 0 keeps Python's defaults. Only `serve` applies it.
    gc_threshold: int = 20_000
    # Membership credentials (docs/protocol.md section 16): the coordinator signs them with the
    # Ed25519 key in this file (default: coordinator.key beside a SQLite database, else in
    # data_dir; made on first start; keep it: its peer id is every run's `coordinator_key`),
    # valid credential_ttl_s and renewed by heartbeats (keep it well over heartbeat_interval_s).
    # credential_ttl_s = 0: no key, no credentials, no coordinator_key: the swarms admit anyone.
    signing_key: str = ""
    credential_ttl_s: float = 600.0

    def signing_key_path(self) -> Path:
        if self.signing_key:
            return Path(self.signing_key)
        url = self.db_url()
        folder = Path(url.removeprefix("sqlite:///")).parent if url.startswith("sqlite:///") else None
        return (folder or Path(self.data_dir)) / "coordinator.key"

    def db_url(self) -> str:
        return self.db or f"sqlite:///{Path(self.data_dir).resolve() / 'coordinator.db'}"

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def load_run_file(path: str | Path) -> tuple[dict[str, Any], str | None]:
    """Read a run TOML file: ``(validated CreateRun dict, shard_root)``.

    The file holds the CreateRun fields; ``data.manifest`` may be a path to the manifest JSON
    written by `distro-node data prepare` (relative to the TOML file), whose folder then serves
    the shards named by ``path``. ``model.hf`` may be the path of a Hugging Face ``config.json``
    (relative to the TOML file, without ``..``, inside its folder): it is read and inlined as
    the table, so nodes receive the config itself (they check its contents:
    ``distronet.node.models.spec.check_hf_config``). Raises RunConfigError naming the bad field.
    """
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise RunConfigError(f"cannot read run file {str(p)!r}: {e}") from e
    shard_root: str | None = None
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("manifest"), str):
        mpath = (p.parent / data["manifest"]).resolve()
        try:
            data["manifest"] = json.loads(mpath.read_text())
        except (OSError, ValueError) as e:
            raise RunConfigError(f"{str(p)!r}: cannot read manifest {str(mpath)!r}: {e}") from e
        shard_root = str(mpath.parent)
    model = raw.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf"), str):
        model["hf"] = _read_hf_config(p, model["hf"])
    try:
        return CREATE_RUN.validate(raw, "run"), shard_root
    except ApiError as e:
        raise RunConfigError(f"{str(p)!r}: {e.message}") from None


def _read_hf_config(run_file: Path, rel: str) -> dict[str, Any]:
    """The JSON object of ``rel`` beside ``run_file`` (``protocol.run_file.read_json_beside``: no
    absolute path, no ``..``, no way out of its folder through a symlink, at most
    ``HF_CONFIG_MAX_BYTES``). Raises RunConfigError."""
    try:
        doc = read_json_beside(run_file.parent, rel, "model.hf", HF_CONFIG_MAX_BYTES)
    except ConfigError as e:
        raise RunConfigError(f"{str(run_file)!r}: {e}") from e
    if not isinstance(doc, dict):
        raise RunConfigError(f"{str(run_file)!r}: model.hf {rel!r} must hold a JSON object")
    return doc
