"""Process tuning is NodeConfig fields, applied in the open: GOMP_SPINCOUNT before torch loads,
GOGC only in p2pd's environment, the event loop from the config."""

from __future__ import annotations

import argparse
import asyncio
import os

import pytest

from distronet.node import join
from distronet.node.config import NodeConfig, TrainConfig, add_config_arguments, config_from_args, flag_fields
from distronet.node.swarm import p2p
from distronet.protocol.errors import ConfigError

REQUIRED = {"run_id": "r", "coordinator": "http://c:1"}


def join_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    return p.parse_args(["r", "--coordinator", "http://c:1"])


def test_tuning_fields_have_defaults_reasons_and_env_names() -> None:
    fields = {f.name: f for _, f in flag_fields()}
    assert fields["omp_spincount"].default == 20_000
    assert fields["p2pd_gogc"].default == 400
    assert fields["event_loop"].default == "uvloop"
    for name in ("omp_spincount", "p2pd_gogc", "event_loop"):
        assert len(fields[name].metadata["help"]) > 40  # a reason, not just a name
    cfg = config_from_args(
        join_args(), {"DISTRO_EVENT_LOOP": "asyncio", "DISTRO_P2PD_GOGC": "100", "DISTRO_OMP_SPINCOUNT": "0"}
    )
    assert (cfg.event_loop, cfg.net.p2pd_gogc, cfg.train.omp_spincount) == ("asyncio", 100, 0)


def test_bad_tuning_values_raise() -> None:
    with pytest.raises(ConfigError, match="event_loop"):
        NodeConfig(**REQUIRED, event_loop="trio")
    with pytest.raises(ConfigError, match="omp_spincount"):
        TrainConfig(omp_spincount=-1)


def test_spin_count_is_exported_from_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    join.tune_torch_env(NodeConfig(**REQUIRED, train=TrainConfig(omp_spincount=0)))
    assert os.environ["GOMP_SPINCOUNT"] == "5"  # 0: the environment's stays
    join.tune_torch_env(NodeConfig(**REQUIRED))
    assert os.environ["GOMP_SPINCOUNT"] == "20000"


def test_gogc_goes_to_the_p2pd_child_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOGC", raising=False)
    assert p2p._child_env(p2p.SwarmConfig(gogc=400)) == {"GOGC": "400"}
    assert p2p._child_env(p2p.SwarmConfig()) == {}
    with p2p._environ_for_spawn({"GOGC": "400"}):
        assert os.environ["GOGC"] == "400"
    assert "GOGC" not in os.environ
    monkeypatch.setenv("GOGC", "50")
    with p2p._environ_for_spawn({"GOGC": "400"}):
        pass
    assert os.environ["GOGC"] == "50"


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_event_loop_from_the_config(loop: str) -> None:
    async def which() -> int:
        name = type(asyncio.get_running_loop()).__module__
        return 1 if name.startswith("uvloop") else 0

    assert join._run(which(), loop) == (1 if loop == "uvloop" else 0)
