"""DistroConfig: presets, validation, learning-rate and k schedules."""

from __future__ import annotations

import itertools
import math

import pytest

from distronet.kernels.coding import ValueCoding
from distronet.node.optim.config import PRESETS, DistroConfig, UpdateRule, lr_at, preset
from distronet.protocol.errors import ConfigError


def test_presets_as_documented() -> None:
    ref = preset("demo_reference")
    assert (ref.beta, ref.chunk, ref.k, ref.value_coding) == (0.999, 64, 32, ValueCoding.FP32)
    assert ref.lr_in_momentum and ref.update is UpdateRule.SIGN
    ps = preset("psyche")
    assert (ps.beta, ps.k, ps.value_coding, ps.update) == (0.995, 4, ValueCoding.SIGN1, UpdateRule.SIGN)
    k4 = preset("ours_k4_1bit")
    assert (k4.k, k4.value_coding, k4.beta, k4.chunk, k4.dense_1d) == (4, ValueCoding.SIGN1, 0.95, 48, False)
    assert preset("ours_k32").k == 32
    assert set(PRESETS) >= {"demo_reference", "psyche", "ours_k32", "ours_k4_1bit"}
    assert preset("psyche", lr=0.5).lr == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.0},
        {"lr": math.nan},
        {"beta": 1.0},
        {"chunk": 0},
        {"k": 0},
        {"weight_decay": -1.0},
        {"decay": "step"},
        {"min_lr_ratio": 2.0},
        {"update": "lion"},
        {"value_coding": "FP64"},
        {"k": 4, "k_start": 2},
        {"run_id": ""},
        {"update": "ortho", "fallback": "ortho"},
        {"beta2": 1.0},
    ],
)
def test_bad_config_raises(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        DistroConfig(**kwargs)  # type: ignore[arg-type]


def test_unknown_preset_and_field() -> None:
    with pytest.raises(ConfigError):
        preset("adamw")
    with pytest.raises(ConfigError):
        preset("psyche", momentum=0.9)


def test_enums_from_strings() -> None:
    cfg = DistroConfig(update="ortho", value_coding="INT8")  # type: ignore[arg-type]
    assert cfg.update is UpdateRule.ORTHO and cfg.value_coding is ValueCoding.INT8


def test_lr_warmup_then_cosine() -> None:
    cfg = DistroConfig(lr=1.0, warmup_steps=10, total_steps=110, decay="cosine", min_lr_ratio=0.1)
    ramp = [lr_at(cfg, s) for s in range(10)]
    assert ramp == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lr_at(cfg, 10) == pytest.approx(1.0)
    assert lr_at(cfg, 60) == pytest.approx(0.55)
    assert lr_at(cfg, 110) == pytest.approx(0.1) and lr_at(cfg, 500) == pytest.approx(0.1)
    values = [lr_at(cfg, s) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))
    lin = DistroConfig(lr=1.0, total_steps=100, decay="linear", min_lr_ratio=0.0)
    assert lr_at(lin, 50) == pytest.approx(0.5)
    assert lr_at(DistroConfig(lr=0.3), 10_000) == 0.3


def test_k_schedule() -> None:
    cfg = DistroConfig(k=4, k_start=32, k_decay_steps=100)
    assert cfg.k_at(0) == 32 and cfg.k_at(50) == 18 and cfg.k_at(100) == 4 and cfg.k_at(1000) == 4
    assert DistroConfig(k=8).k_at(0) == 8
