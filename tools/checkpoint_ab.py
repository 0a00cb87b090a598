"""A node's checkpoint, saved and loaded both ways, alternating: torch.save / torch.load (format 1,
what nodes wrote before; fsynced like format 2) against ``daemon/checkpoint.py``'s format 2.

    python tools/checkpoint_ab.py [REPEATS]

The default GPT's ``state_dict`` and an optimizer state of its shape (one momentum tensor and a
tensor step per parameter, betas a tuple). Prints the median ms of each and both file sizes.
"""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from distronet.node.daemon.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from distronet.node.models.build import build_model
from distronet.node.models.spec import ModelSpec


def main(repeats: int) -> None:
    torch.manual_seed(0)
    model = build_model(ModelSpec.from_run({}), torch.device("cpu"))
    params = list(model.parameters())
    state = {i: {"m": torch.randn_like(p), "step": torch.tensor(5.0)} for i, p in enumerate(params)}
    groups = [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(range(len(params)))}]
    ck = Checkpoint("r", 10, "d", model.state_dict(), {"state": state, "param_groups": groups}, {"x": [1]})
    folder = Path(tempfile.mkdtemp())
    old, new = folder / "checkpoint.pt", folder / "checkpoint.safetensors"
    t: dict[str, list[float]] = {"torch save": [], "torch load": [], "format 2 save": [], "format 2 load": []}
    for _ in range(repeats):
        a = time.perf_counter()
        with open(old, "wb") as fh:
            torch.save({"format": 1, **ck.__dict__}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        b = time.perf_counter()
        torch.load(old, weights_only=True)  # a file this tool just wrote
        c = time.perf_counter()
        save_checkpoint(new, ck)
        d = time.perf_counter()
        load_checkpoint(new, run_id="r")
        e = time.perf_counter()
        for key, dt in zip(t, (b - a, c - b, d - c, e - d), strict=True):
            t[key].append(dt)
    print(", ".join(f"{k} {1e3 * statistics.median(v):.1f} ms" for k, v in t.items()))
    n = sum(p.numel() for p in params)
    print(f"bytes: torch {old.stat().st_size:,}, format 2 {new.stat().st_size:,}; parameters {n:,}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
