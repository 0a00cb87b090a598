"""``tools/gpu_check.py``, the GPU readiness script (docs/gpu.md): on the CPU with ``--small`` it runs
the code path a CUDA run takes and writes every figure; its parts that judge (packet parity, the
attribution of a synchronising call to a source line) fail where they should."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_cpu_small_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(TOOL), "--out", str(out), "--device", "cpu", "--small"]
    cmd += ["--presets", "ours_k32", "--steps", "1", "--warmup", "1", "--budget-s", "240"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=290, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    sec = doc["sections"]
    assert doc["schema"] == 1 and "aborted" not in doc
    assert set(sec) == {"environment", "static_candidates", "parity/ours_k32", "host_syncs/ours_k32",
                        "step/ours_k32", "cupy"}  # fmt: skip
    assert not [name for name, s in sec.items() if "error" in s or "skipped" in s]
    assert sec["environment"]["device"] == "cpu" and sec["environment"]["commit"]

    step = sec["step/ours_k32"]
    assert step["model"]["model_type"] == "gpt2" and step["micro_batch"] == 2 and step["seq_len"] == 32
    assert step["parameters"] == 136_960  # gpt2: wte 512x64, wpe 64x64, 2 blocks of 49,984, ln_f
    one = step["one_node"]
    assert one["steps_measured"] == 1 and one["replicas"] == 1
    for key in ("train_ms", "begin_step_ms", "finish_step_ms", "step_ms", "tokens_per_s", "daemon_digest_ms"):
        assert one[key] > 0, key
    assert one["step_ms"] == pytest.approx(
        one["train_ms"] + one["begin_step_ms"] + one["finish_step_ms"], abs=0.05
    )
    assert one["peak_rss_bytes"] > 0 and one["packet_bytes"] > 100
    swarm = step["swarm"]
    assert (
        swarm["replicas"] == 2 and swarm["replicas_identical"] is True and swarm["accepted_last_round"] == 2
    )

    par = sec["parity/ours_k32"]
    assert par["ok"] is True and par["same_momentum"]["frames_identical"] is True
    assert par["same_momentum"]["sent_identical"] is True and par["decode_on_device"] == ["cpu"]
    assert par["same_momentum"]["chunks"] > 0 and par["dct_max_rel_err"] == 0.0

    syncs = sec["host_syncs/ours_k32"]
    assert syncs["mode"] is None and syncs["optimizer_per_step"] == 0 and syncs["phases"] == {}

    assert sec["cupy"]["result"] == "no cupy kernels" and sec["cupy"]["modules_using_cupy"] == []

    cands = sec["static_candidates"]["candidates"]
    assert cands and cands[0]["file"].startswith("distronet/")
    for c in cands:  # each names a real line holding what it says
        line = (ROOT / c["file"]).read_text().splitlines()[c["line"] - 1]
        assert line.strip() == c["code"]

    text = (out / "gpu_check.txt").read_text()
    assert (
        "step/ours_k32 one_node" in text and "parity/ours_k32: ok True" in text and "no cupy kernels" in text
    )


def test_cuda_requested_without_cuda_exits_2(gc: ModuleType, tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    assert gc.main(["--out", str(tmp_path), "--device", "cuda"]) == 2
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert "CUDA is not available" in doc["error"]


def _frame(path: str, line: int, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(path, line, name)


def test_sync_site_names_the_innermost_project_line(gc: ModuleType) -> None:
    stack = [
        _frame(str(ROOT / "tools/gpu_check.py"), 10, "main"),
        _frame(str(ROOT / "distronet/node/optim/distro.py"), 212, "begin_step"),
        _frame(str(ROOT / "distronet/node/optim/packets.py"), 254, "build_packet"),
        _frame("/usr/lib/python3/site-packages/torch/_tensor.py", 99, "__int__"),
    ]
    assert gc.sync_site(stack) == (
        "distronet/node/optim/packets.py:254 in build_packet < distronet/node/optim/distro.py:212 "
        "in begin_step [site-packages/torch/_tensor.py:99]"
    )
    tool_only = [_frame(str(ROOT / "tools/gpu_check.py"), 300, "train_phase")]
    assert gc.sync_site(tool_only) == "tools/gpu_check.py:300 in train_phase"
    # a virtual environment inside the checkout is a library, not the project
    venv = [*tool_only, _frame(str(ROOT / ".venv/lib/site-packages/transformers/x.py"), 5, "f")]
    assert gc.sync_site(venv) == "tools/gpu_check.py:300 in train_phase [site-packages/transformers/x.py:5]"


def _synchronising_call() -> None:
    warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)


def test_sync_capture_counts_by_phase_and_passes_other_warnings_on(gc: ModuleType) -> None:
    with pytest.warns(UserWarning, match="not a sync") as passed, gc.sync_capture(torch.device("cpu")) as log:
        log.phase = "begin_step"
        _synchronising_call()
        _synchronising_call()
        log.phase = "finish_step"
        _synchronising_call()
        warnings.warn("not a sync", UserWarning, stacklevel=1)
    assert sum(log.sites["begin_step"].values()) == 2 and sum(log.sites["finish_step"].values()) == 1
    assert log.messages == {"called a synchronizing CUDA operation": 3}
    assert all(site.startswith("test_gpu_check.py:") for site in log.sites["begin_step"])
    assert len(passed) == 1


@pytest.mark.parametrize("preset_name", ["ours_k32", "ours_k4_1bit", "demo_reference"])
def test_compare_packets_passes_equal_packets_and_catches_unequal_ones(
    gc: ModuleType, preset_name: str
) -> None:
    from distronet.node.optim.packets import make_plans, run_digest

    cfg = gc.preset(preset_name)
    plans = make_plans([("w", (64, 128))], cfg)
    digest = run_digest(plans)
    shape = (plans[0].layout.n_chunks, plans[0].layout.chunk_numel)
    m = torch.randn(shape, generator=torch.Generator().manual_seed(0))

    def compare(inputs: tuple[torch.Tensor, torch.Tensor], sent: tuple[torch.Tensor, torch.Tensor],
                rtol: float = 0.0) -> dict:  # fmt: skip
        frames = tuple(
            gc.build_packet(plans, gc._held(plans, [x]), cfg, 0, gc.identity(0), digest)[0] for x in sent
        )
        return gc.compare_packets(plans, cfg, ([inputs[0]], [inputs[1]]), frames, digest, rtol=rtol)

    same = compare((m, m), (m, m))
    assert same["frames_identical"] and same["index_mismatch_chunks"] == 0
    assert same["value_max_diff_levels"] == 0.0 and same["values_within_rounding"]

    # another chunk selection in chunk 0 (its smallest sent coefficient pushed far below): not a tie
    moved = m.clone()
    k = plans[0].k(cfg.extraction.k_at(0))
    moved[0, moved[0].abs().argsort(descending=True)[k - 1]] = 0.0
    other = compare((m, moved), (m, moved))
    assert other["index_mismatch_not_tie"] == 1 and not other["frames_identical"]

    # the same indices with values off by far more than the coding's rounding (claimed equal inputs)
    scaled = compare((m, m), (m, 3.0 * m))
    assert scaled["index_mismatch_chunks"] == 0 and not scaled["values_within_rounding"]

    # inputs that differ by rounding only: within the coding's rounding
    near = m * (1 + 1e-7 * torch.randn(shape, generator=torch.Generator().manual_seed(1)))
    close = compare((m, near), (m, near), rtol=gc.NEAR_TIE_RTOL)
    assert close["index_mismatch_not_tie"] == 0 and close["values_within_rounding"]


def test_static_candidates_find_a_planted_round_trip(gc: ModuleType, tmp_path: Path) -> None:
    for d in gc.AUDIT_DIRS:
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / gc.AUDIT_DIRS[1] / "k.py").write_text(
        "x = 1\ny = t.cpu()  # copy\nz = bool(torch.isfinite(u).all())\n# w = v.item()\nn = int(a.max())\n"
    )
    got = gc.static_candidates(tmp_path)
    assert [(c["line"], c["pattern"]) for c in got["candidates"]] == [
        (2, ".cpu()"),
        (3, "float/int/bool of a tensor"),
        (5, "float/int/bool of a tensor"),
    ]
