"""The optimizer's round decode, old vs new, side by side in one process (issue 5 / issue 2).

What ``DistroOptimizer._apply`` runs per round, minus the update rule: ``open_round`` on the
round's frames, then ``decode_sum(layout, parts).div_(n)`` per tensor. *old* is ``open_round``
and ``decode_sum`` as they were at ``OLD_REV`` (default 1ea6eaf; loaded from ``git show`` into
a temporary directory), *new* the tree's. Frames: the default GPT under ``PRESET`` (default
ours_k32), 4 peers with their own random momenta, built by ``build_packet`` as a node does.
Checks first that old and new give the same bytes for every tensor (1 and 4 frames), then times
both alternately: medians over ``REPS`` (default 15); thread CPU time at THREADS=1 (default),
wall clock otherwise.

    THREADS=1 REPS=15 .venv/bin/python docs/scripts/optim_decode_ab.py
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))

from distronet.kernels.coding_fast import warm  # noqa: E402
from distronet.kernels.dct import dct_chunks  # noqa: E402
from distronet.kernels.decode import decode_sum  # noqa: E402
from distronet.node.models.gpt import GPT, GPTConfig  # noqa: E402
from distronet.node.optim.config import preset  # noqa: E402
from distronet.node.optim.packets import build_packet, make_plans, open_round, run_digest  # noqa: E402
from distronet.protocol.identity import Identity  # noqa: E402


def _old(rev: str, path: str, name: str, tmp: Path) -> ModuleType:
    src = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout
    file = tmp / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    rev = os.environ.get("OLD_REV", "1ea6eaf")
    with tempfile.TemporaryDirectory() as d:
        old_packets = _old(rev, "node/optim/packets.py", "old_packets", Path(d))
        old_decode = _old(rev, "kernels/decode.py", "old_decode", Path(d))
    warm()
    name = os.environ.get("PRESET", "ours_k32")
    cfg = preset(name)
    model = GPT(GPTConfig(), seed=0)
    plans = make_plans([(n, tuple(p.shape)) for n, p in model.named_parameters()], cfg)
    digest = run_digest(plans)
    ids = sorted((Identity.from_seed(bytes([i + 1]) * 32) for i in range(4)), key=lambda i: i.peer_id)
    frames = {}
    for j, ident in enumerate(ids):
        g = torch.Generator().manual_seed(j)
        momenta = [dct_chunks(torch.randn(p.layout.shape, generator=g), p.layout) for p in plans]
        frames[ident.peer_id] = build_packet(plans, momenta, cfg, 5, ident, digest)[0]
    one = dict(list(frames.items())[:1])
    cpu = torch.device("cpu")

    def path(opener, dsum):  # type: ignore[no-untyped-def]
        def run(fr: dict[bytes, bytes]) -> list[torch.Tensor]:
            dec = opener(fr, plans, cfg, 5, digest, cpu, None)
            n = len(dec.peers)
            return [
                dsum(p.layout, dec.parts[p.tensor_id], dtype=torch.float32, device=cpu).div_(n) for p in plans
            ]

        return run

    old, new = path(old_packets.open_round, old_decode.decode_sum), path(open_round, decode_sum)
    for fr in (one, frames):
        a, b = old(fr), new(fr)
        assert all(x.numpy().tobytes() == y.numpy().tobytes() for x, y in zip(a, b, strict=True)), (
            "bits differ"
        )
    size = len(next(iter(frames.values())))
    print(
        f"{name}: {len(plans)} tensors, {size:,} B/frame; "
        f"old ({rev}) and new give the same bytes (1 and 4 frames)"
    )
    clk = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    t: dict[str, list[float]] = {}
    for _ in range(int(os.environ.get("REPS", "15"))):
        for label, fn in (("old", old), ("new", new)):
            for n, fr in (("1", one), ("4", frames)):
                t0 = clk()
                fn(fr)
                t.setdefault(label + n, []).append((clk() - t0) * 1e3)
    m = {key: statistics.median(v) for key, v in t.items()}
    print(f"threads {torch.get_num_threads()}, clock {clk.__name__}, medians of {len(t['old1'])}")
    for label in ("old", "new"):
        extra = (m[label + "4"] - m[label + "1"]) / 3
        print(
            f"{label}: 1 frame {m[label + '1']:.2f} ms, 4 frames {m[label + '4']:.2f} ms, "
            f"per extra frame {extra:.2f} ms, 4/1 {m[label + '4'] / m[label + '1']:.2f}"
        )
    print(f"new/old: 1 frame {m['new1'] / m['old1']:.2f}, 4 frames {m['new4'] / m['old4']:.2f}")


if __name__ == "__main__":
    main()
