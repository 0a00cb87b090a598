"""`distro-node bench converge --quick --json`: the CI smoke run of the convergence benchmark."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

FIELDS = {"config", "val_loss", "upload_bytes_per_step", "ratio_vs_ring_allreduce", "seconds", "lr"}


@pytest.mark.slow
def test_quick_bench_json_rows_and_losses_fall() -> None:
    cmd = [
        sys.executable,
        "-m",
        "distronet.node.cli",
        "bench",
        "converge",
        "--quick",
        "--json",
        "--jobs",
        "2",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["config"] for r in rows] == ["adamw", "demo-ref", "ours-k32", "ours-k4-1bit"]
    uniform = math.log(256)  # the loss of an untrained byte-level model
    by_name = {r["config"]: r for r in rows}
    for r in rows:
        assert set(r) >= FIELDS, r
        assert r["lr"] > 0 and r["seconds"] > 0
        assert r["val_loss"] < uniform - 0.8, r  # learned something in 40 steps
        assert r["replicas_identical"], r
    adamw = by_name["adamw"]
    assert adamw["ratio_vs_ring_allreduce"] == 1.0
    for name in ("demo-ref", "ours-k32", "ours-k4-1bit"):
        assert by_name[name]["upload_bytes_per_step"] < adamw["upload_bytes_per_step"] / 20
        assert by_name[name]["ratio_vs_ring_allreduce"] == pytest.approx(
            by_name[name]["upload_bytes_per_step"] / adamw["upload_bytes_per_step"]
        )
    assert by_name["ours-k4-1bit"]["upload_bytes_per_step"] < by_name["ours-k32"]["upload_bytes_per_step"]
