"""NodeConfig: every flag is a field and every field a flag, env var and file key; precedence."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from distronet.node.config import ENV_PREFIX, NodeConfig, add_config_arguments, config_from_args, flag_fields
from distronet.protocol.errors import ConfigError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    return p


def parse(argv: list[str], env: dict[str, str] | None = None) -> NodeConfig:
    return config_from_args(parser().parse_args(argv), env or {})


def test_every_flag_has_a_field_and_every_field_a_flag() -> None:
    flags = {a.dest for a in parser()._actions if a.dest not in ("help", "config")}
    fields = {f.name for _, f in flag_fields()}
    assert flags == fields
    assert len(fields) == len(flag_fields())  # names are unique across sections


def test_defaults_and_flags() -> None:
    cfg = parse(
        ["r1", "--coordinator", "http://c:1", "--max-steps", "7", "--no-nat-traversal", "--up", "2mbit"]
    )
    assert (cfg.run_id, cfg.coordinator, cfg.train.max_steps) == ("r1", "http://c:1", 7)
    assert cfg.net.nat_traversal is False and cfg.net.up == "2mbit" and cfg.net.down == "100mbit"


def test_every_field_is_settable_by_env_and_flag_wins(tmp_path: Path) -> None:
    env = {ENV_PREFIX + "COORDINATOR": "http://env:1", ENV_PREFIX + "RUN_ID": "envrun",
           ENV_PREFIX + "MAX_STEPS": "3", ENV_PREFIX + "NAT_TRAVERSAL": "false",
           ENV_PREFIX + "DOWN": "5mbit"}  # fmt: skip
    cfg = parse(["--max-steps", "9"], env)
    assert cfg.run_id == "envrun" and cfg.coordinator == "http://env:1" and cfg.net.down == "5mbit"
    assert cfg.train.max_steps == 9 and cfg.net.nat_traversal is False


def test_config_file_sections_and_precedence(tmp_path: Path) -> None:
    f = tmp_path / "node.toml"
    f.write_text(
        'run_id = "filerun"\ncoordinator = "http://file:1"\n[net]\nup = "1mbit"\n[train]\nmax_steps = 4\n'
    )
    cfg = parse(["--config", str(f)], {ENV_PREFIX + "MAX_STEPS": "6"})
    assert cfg.run_id == "filerun" and cfg.net.up == "1mbit" and cfg.train.max_steps == 6
    cfg = parse([], {ENV_PREFIX + "CONFIG": str(f)})
    assert cfg.train.max_steps == 4


@pytest.mark.parametrize(
    ("argv", "env", "text"),
    [
        (["r"], {}, "--coordinator"),
        (["r", "--coordinator", "http://c", "--max-steps", "x"], {}, "--max-steps"),
        (["r", "--coordinator", "http://c", "--device", "tpu"], {}, "device"),
        (["r", "--coordinator", "http://c", "--up", "fast"], {}, "rate"),
        (["r", "--coordinator", "http://c"], {ENV_PREFIX + "NAT_TRAVERSAL": "maybe"}, "DISTRO_NAT_TRAVERSAL"),
    ],
)
def test_bad_settings_say_what_and_where(argv: list[str], env: dict[str, str], text: str) -> None:
    with pytest.raises(ConfigError, match=text):
        parse(argv, env)


def test_unknown_file_keys_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "node.toml"
    f.write_text('coordinator = "http://c"\n[net]\nupp = "1mbit"\n')
    with pytest.raises(ConfigError, match=r"net\.upp"):
        parse(["r", "--config", str(f)])


def test_memory_cap_and_fit_check_flags() -> None:
    url = ["r", "--coordinator", "http://c:1"]
    cfg = parse([*url, "--memory-cap", "512MiB", "--no-fit-check"])
    assert cfg.train.memory_cap == "512MiB" and cfg.train.fit_check is False
    assert parse(url).train.fit_check is True and parse(url).train.memory_cap == ""
    with pytest.raises(ConfigError, match="not a size"):
        parse([*url, "--memory-cap", "lots"])
