"""`distro-coordinator`: every config field is a flag and an env var; run files in TOML."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from distronet.coordinator.cli import build_parser, config_from_args
from distronet.coordinator.config import CoordinatorConfig, load_run_file
from distronet.coordinator.errors import RunConfigError


def _serve_flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    serve = sub.choices["serve"]  # type: ignore[index]
    return {a.dest for a in serve._actions} - {"help", "run", "log_level"}


def test_every_field_has_a_flag_and_every_flag_a_field() -> None:
    assert _serve_flags() == {f.name for f in dataclasses.fields(CoordinatorConfig)}


def test_flags_beat_env_beat_defaults() -> None:
    args = build_parser().parse_args(["serve", "--port", "9000"])
    env = {"DISTRO_COORD_PORT": "9100", "DISTRO_COORD_PEER_RATE": "7.5", "DISTRO_COORD_DB": "sqlite:///x.db"}
    cfg = config_from_args(args, env)
    assert (cfg.port, cfg.peer_rate, cfg.db, cfg.host) == (9000, 7.5, "sqlite:///x.db", "127.0.0.1")
    with pytest.raises(RunConfigError, match="DISTRO_COORD_PORT"):
        config_from_args(build_parser().parse_args(["serve"]), {"DISTRO_COORD_PORT": "eighty"})


def test_default_database_is_one_sqlite_file_in_the_data_dir(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(data_dir=str(tmp_path))
    assert cfg.db_url() == f"sqlite:///{tmp_path.resolve() / 'coordinator.db'}"


def test_run_file_reads_the_manifest_next_to_it(tmp_path: Path) -> None:
    shards = [{"id": "a", "path": "a.bin", "sha256": "0" * 64, "tokens": 10, "bytes": 10}]
    (tmp_path / "m.json").write_text(
        json.dumps({"version": 1, "tokenizer": "byte", "dtype": "uint16", "shards": shards})
    )
    (tmp_path / "run.toml").write_text(
        'id = "demo"\n[model]\nlayers = 4\n[data]\nmanifest = "m.json"\nepochs = 2\n'
        '[admission]\npolicy = "token"\n'
    )
    spec, root = load_run_file(tmp_path / "run.toml")
    assert spec["id"] == "demo" and spec["model"] == {"layers": 4} and spec["data"]["epochs"] == 2
    assert spec["admission"]["policy"] == "token" and root == str(tmp_path.resolve())
    (tmp_path / "bad.toml").write_text('id = "demo"\n[data]\nmanifest = "m.json"\nepochs = 0\n')
    with pytest.raises(RunConfigError, match=r"data\.epochs"):
        load_run_file(tmp_path / "bad.toml")
    (tmp_path / "broken.toml").write_text("id = ")
    with pytest.raises(RunConfigError, match="cannot read run file"):
        load_run_file(tmp_path / "broken.toml")


async def test_the_serve_function_creates_run_files_and_owns_the_process_gc(tmp_path: Path) -> None:
    """`serve` and the tests share `local_coordinator`; owning the process applies the GC
    threshold and freezes the long-lived state, and the run files exist before it listens."""
    import gc

    import aiohttp

    from distronet.coordinator.local import local_coordinator

    shards = [{"id": "a", "path": "a.bin", "sha256": "0" * 64, "tokens": 10, "bytes": 10}]
    (tmp_path / "m.json").write_text(
        json.dumps({"version": 1, "tokenizer": "byte", "dtype": "uint16", "shards": shards})
    )
    (tmp_path / "run.toml").write_text('id = "demo"\n[data]\nmanifest = "m.json"\n')
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", gc_threshold=12_345)
    old = gc.get_threshold()
    try:
        async with (
            local_coordinator(cfg, run_files=[str(tmp_path / "run.toml")], owns_process=True) as lc,
            aiohttp.ClientSession() as http,
        ):
            assert gc.get_threshold()[0] == 12_345 and lc.app.gc_freeze and gc.get_freeze_count() > 0
            async with http.get(lc.url + "/api/v1/runs") as r:
                assert (await r.json()) == {"runs": ["demo"]}
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()
    async with local_coordinator(cfg) as lc:  # not the owner: process-wide settings untouched
        assert gc.get_threshold() == old and not lc.app.gc_freeze and "demo" in lc.app.svc.runs
