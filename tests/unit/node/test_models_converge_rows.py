"""The convergence benchmark's row registry, lr schedule, ring figure and recorded defaults."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from distronet.node.bench.converge_rows import (
    LLAMA_GRID_FACTORS,
    ROWS,
    default_lrs,
    resolve_rows,
    sweep_grid,
    write_defaults,
)
from distronet.node.bench.converge_train import (
    QUICK,
    QUICK_LLAMA,
    BenchSetting,
    make_data,
    ring_allreduce_bytes,
    run_row,
    scheduled_lr,
)
from distronet.node.models.gpt import GPT
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


def test_llama_sweep_is_recorded_apart_and_changes_no_default(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    write_defaults({"adamw": 0.004}, {"adamw": {"0.004": 2.0}}, {"steps": 600}, path)
    write_defaults({"adamw": 0.008}, {"adamw": {"0.008": 5.0}}, {"steps": 300}, path, model="llama")
    doc = json.loads(path.read_text())
    assert default_lrs(path)["adamw"] == 0.004
    assert doc["llama"] == {
        "setting": {"steps": 300},
        "winner": {"adamw": 0.008},
        "sweep": {"adamw": {"0.008": 5.0}},
    }
    assert doc["sweep"]["adamw"] == {"0.004": 2.0} and doc["setting"] == {"steps": 600}
    write_defaults({"ours-k32": 0.002}, {}, {"steps": 600}, path)  # a GPT sweep keeps the llama record
    assert json.loads(path.read_text())["llama"]["winner"] == {"adamw": 0.008}
    spec = ROWS["ours-k32"]
    assert sweep_grid(spec, "gpt", 0.004) == spec.lr_grid
    assert sweep_grid(spec, "llama", 0.004) == tuple(0.004 * f for f in LLAMA_GRID_FACTORS)


def test_missing_fortunes_names_the_package(tmp_path: Path) -> None:
    from distronet.node.bench.converge_llama import english_tokens
    from distronet.node.data.errors import CorpusError

    with pytest.raises(CorpusError, match="apt-get install fortunes"):
        english_tokens(512, tmp_path / "work", folder=tmp_path / "no-fortunes")


@pytest.fixture(scope="module")
def llama_quick(tmp_path_factory: pytest.TempPathFactory) -> BenchSetting:
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from distronet.node.data.english import ENGLISH_DIR

    if not ENGLISH_DIR.is_dir():  # .ci/run installs it: in CI its absence is a failure, not a skip
        missing = "Debian's fortunes is not installed (apt-get install fortunes)"
        pytest.fail(missing) if os.environ.get("CI") else pytest.skip(missing)
    work = tmp_path_factory.mktemp("converge-llama")
    return dataclasses.replace(QUICK_LLAMA, steps=4, warmup_steps=1, eval_windows=8, work_dir=str(work))


def test_llama_tokens_are_a_cached_bpe(llama_quick: BenchSetting, monkeypatch: pytest.MonkeyPatch) -> None:
    from distronet.node.bench import converge_llama

    assert llama_quick.llama is not None
    vocab = llama_quick.llama.vocab
    first = converge_llama.english_tokens(vocab, llama_quick.cache_dir())
    assert first.train.dtype == np.uint16 and first.vocab_size == vocab
    assert int(first.train.max()) < vocab and first.val.size > 1000
    assert (first.folder / "tokenizer.json").is_file()
    assert first.train.size < 0.6 * 2_000_000  # a BPE: far fewer tokens than the fortunes' bytes

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached tokens were tokenized again")

    monkeypatch.setattr(converge_llama, "prepare_builtin_tokenized", no_training)
    again = converge_llama.english_tokens(vocab, llama_quick.cache_dir())
    assert again.digest == first.digest and np.array_equal(again.train, first.train)


def test_llama_rows_carry_the_model_and_are_deterministic(llama_quick: BenchSetting) -> None:
    assert llama_quick.llama is not None
    data = make_data(llama_quick)
    for name, lr in (("adamw", 3e-3), ("ours-k4-1bit", 6e-3)):
        a = run_row(ROWS[name], lr, llama_quick, data)
        b = run_row(ROWS[name], lr, llama_quick, data)
        assert a.val_loss == b.val_loss and a.train_loss == b.train_loss, name
        assert a.upload_bytes_per_step == b.upload_bytes_per_step
        row = a.to_json()
        assert row["model"] == "llama" and row["config"] == name
        assert row["parameters"] == llama_quick.llama.parameters() == 42_080
        assert row["replicas_identical"]
        assert a.val_loss < math.log(llama_quick.llama.vocab)  # learned something in 4 steps
    gpt = run_row(ROWS["adamw"], 3e-3, dataclasses.replace(QUICK, peers=1, steps=1, eval_windows=2))
    assert gpt.model == "gpt" and gpt.parameters == GPT(QUICK.model).num_parameters()
