"""The convergence benchmark's row registry, lr schedule, ring figure and recorded defaults."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch

from distronet.node.bench.converge_rows import ROWS, default_lrs, resolve_rows, write_defaults
from distronet.node.bench.converge_train import QUICK, make_data, ring_allreduce_bytes, run_row, scheduled_lr
from distronet.protocol.errors import ConfigError


def test_every_row_gets_the_same_sweep_budget() -> None:
    assert len({len(spec.lr_grid) for spec in ROWS.values()}) == 1
    assert all(spec.preset for spec in ROWS.values() if spec.kind == "distro")


def test_unknown_row_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="nope"):
        resolve_rows(["adamw", "nope"])


def test_ring_allreduce_figure() -> None:
    assert ring_allreduce_bytes(1000, 4) == 2 * 3 / 4 * 4 * 1000
    assert ring_allreduce_bytes(1000, 1) == 0.0


def test_schedule_warms_up_then_decays_to_floor() -> None:
    s = dataclasses.replace(QUICK, steps=100, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [scheduled_lr(1.0, t, s) for t in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[-1] == pytest.approx(0.1, abs=0.01)


def test_sweep_winners_become_defaults(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    assert default_lrs(path)["adamw"] == ROWS["adamw"].fallback_lr
    write_defaults({"adamw": 0.0123}, {"adamw": {"0.0123": 2.0}}, {"steps": 1}, path)
    write_defaults({"ours-k32": 0.0042}, {}, {"steps": 1}, path)
    lrs = default_lrs(path)
    assert lrs["adamw"] == 0.0123 and lrs["ours-k32"] == 0.0042
    assert json.loads(path.read_text())["sweep"]["adamw"] == {"0.0123": 2.0}


def test_adamw_row_is_deterministic_and_learns() -> None:
    s = dataclasses.replace(QUICK, peers=2, steps=6, eval_windows=8, warmup_steps=2)
    data = make_data(s)
    a = run_row(ROWS["adamw"], 3e-3, s, data)
    b = run_row(ROWS["adamw"], 3e-3, s, data)
    assert a.val_loss == b.val_loss
    assert a.val_loss < torch.log(torch.tensor(256.0)).item()
    assert a.upload_bytes_per_step == ring_allreduce_bytes(a.parameters, 2)


def test_set_overrides_parse_json_values_and_refuse_adamw() -> None:
    from distronet.node.bench.converge import _field_overrides
    from distronet.protocol.errors import DistroError

    got = _field_overrides(["ours-k32.update=ortho", "ours-k32.k=16", "demo-ref.beta=0.9"])
    assert got == {"ours-k32": {"update": "ortho", "k": 16}, "demo-ref": {"beta": 0.9}}
    for bad in ("adamw.lr=1", "ours-k32=3", "nope.k=1"):
        with pytest.raises(DistroError):
            _field_overrides([bad])
