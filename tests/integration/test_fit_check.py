"""The fit estimate against the memory real training takes (``tools/fit_check.py``; issue 18): for
the built-in GPT and the ``bench converge --model llama`` Llama, a fresh process runs three real
training steps (``Trainer`` + ``DistroOptimizer`` over a one-peer hub) and its peak resident set
over the steps, less its resident set before the build, is within 15 % of the estimate (the
median of three fresh processes: one process's peak moves by ~10 % either way, and a single run
on a loaded CI machine measured 22 % over); one setting with activation checkpointing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "fit_check.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fit_check", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc peak counter")
@pytest.mark.parametrize(
    ("model", "micro_batch", "checkpointing"), [("gpt", 64, False), ("llama", 16, False), ("llama", 32, True)]
)
def test_estimate_within_15_percent_of_measured_peak_rss(
    model: str, micro_batch: int, checkpointing: bool
) -> None:
    row = _tool().measure(
        model, micro_batch, device="cpu", steps=3, checkpointing=checkpointing, timeout_s=240
    )
    assert row["micro_batch"] == micro_batch and row["seq_len"] == 128 and row["steps"] == 3
    assert row["checkpointing"] is checkpointing
    # model memory dominates: the estimate's activations and their heap share are > 250 MB here
    assert row["breakdown"]["activations"] + row["breakdown"]["allocator"] > 250e6
    assert len(row["measured_runs"]) == 3 and row["measured_bytes"] == sorted(row["measured_runs"])[1]
    assert abs(row["ratio"] - 1.0) <= 0.15, row
