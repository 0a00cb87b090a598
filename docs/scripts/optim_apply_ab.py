"""The optimizer's round apply, old vs new, side by side in one process (issue 5).

Times ``DistroOptimizer._apply`` — open the round's frames, decode the aggregate, apply the
update rules — with 1 and with 4 accepted packets, for the optimizer at ``OLD_REV`` (default
210180e: a ``decode_sum`` per tensor; ``node/optim/packets.py`` and ``distro.py`` loaded from
``git show`` into a temporary directory) and the tree's (``aggregate.round_sums``: the whole
round in one ``decode_flat``). Frames: the default GPT under ``PRESET`` (default ours_k32,
overlap on as in ``bench network``), 4 peers whose momenta share a common part (as in a run),
built by ``build_packet`` as a node does. Both optimizers start from the same weights and apply
the same rounds; after every apply their parameters must be the same bytes (checked). Timings
alternate old/new, medians over ``REPS`` (default 15) of thread CPU time at ``THREADS`` torch
threads (default 1, as the swarm's nodes run); besides the whole apply, the decode alone (open
the frames + the aggregate of every tensor, without the update rules' ~30 ms) is timed too.

    flock /tmp/bench.lock .venv/bin/python docs/scripts/optim_apply_ab.py
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
from distronet.node.exchange.base import Round  # noqa: E402
from distronet.node.exchange.memory import MemoryExchange, MemoryHub  # noqa: E402
from distronet.node.models.gpt import GPT, GPTConfig  # noqa: E402
from distronet.node.optim.aggregate import round_sums  # noqa: E402
from distronet.node.optim.config import preset  # noqa: E402
from distronet.node.optim.distro import DistroOptimizer  # noqa: E402
from distronet.node.optim.packets import build_packet, open_round  # noqa: E402
from distronet.protocol.identity import Identity  # noqa: E402


def _load(name: str, src: str, tmp: Path) -> ModuleType:
    file = tmp / f"{name}.py"
    file.write_text(src)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _old_optimizer(rev: str, tmp: Path) -> type:
    def show(path: str) -> str:
        cmd = ["git", "show", f"{rev}:{path}"]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    _load("old_packets", show("node/optim/packets.py"), tmp)
    src = show("node/optim/distro.py")
    src = src.replace("from distronet.node.optim.packets import", "from old_packets import")
    cls: type = _load("old_distro", src, tmp).DistroOptimizer
    return cls


def main() -> None:
    rev = os.environ.get("OLD_REV", "210180e")
    with tempfile.TemporaryDirectory() as d:
        old_cls = _old_optimizer(rev, Path(d))
    warm()
    name = os.environ.get("PRESET", "ours_k32")
    cfg = preset(name, overlap=True, run_id="ab")
    ids = sorted((Identity.from_seed(bytes([i + 1]) * 32) for i in range(4)), key=lambda i: i.peer_id)
    opts = {}
    for label, cls in (("old", old_cls), ("new", DistroOptimizer)):
        model = GPT(GPTConfig(), seed=0)
        opts[label] = cls(model.named_parameters(), cfg, MemoryExchange(MemoryHub(), ids[0].peer_id), ids[0])
    plans, digest = opts["new"].plans, opts["new"].digest
    frames: dict[bytes, bytes] = {}
    common = torch.Generator().manual_seed(99)
    shared = [torch.randn(p.layout.shape, generator=common) for p in plans]
    for j, ident in enumerate(ids):
        g = torch.Generator().manual_seed(j)
        momenta = [
            dct_chunks(s * (1 + 0.2 * torch.randn(s.shape, generator=g)), p.layout)
            for s, p in zip(shared, plans, strict=True)
        ]
        frames[ident.peer_id] = build_packet(plans, momenta, cfg, 5, ident, digest)[0]
    rounds = {"1": Round(5, {ids[0].peer_id: frames[ids[0].peer_id]}), "4": Round(5, frames)}
    print(f"{name}: {len(plans)} tensors, {len(frames[ids[0].peer_id]):,} B/frame, old = {rev}")
    cpu = torch.device("cpu")

    def old_decode(rnd: Round) -> list[torch.Tensor]:  # open_round + decode_sum per tensor, as at OLD_REV
        dec = sys.modules["old_packets"].open_round(rnd.frames, plans, cfg, rnd.step, digest, cpu)
        return [decode_sum(p.layout, dec.parts[p.tensor_id], dtype=torch.float32, device=cpu) for p in plans]

    def new_decode(rnd: Round) -> list[torch.Tensor]:  # open_round + round_sums
        return round_sums(open_round(rnd.frames, plans, cfg, rnd.step, digest, cpu), plans, cpu)

    t: dict[str, list[float]] = {}
    reps = int(os.environ.get("REPS", "15"))
    for rep in range(reps + 1):
        for n, rnd in rounds.items():
            for label, opt in opts.items():
                t0 = time.thread_time()
                opt._apply(rnd)
                if rep:  # the first round of each is a warm-up
                    t.setdefault("apply " + label + n, []).append((time.thread_time() - t0) * 1e3)
            a = [p.detach().numpy().tobytes() for p in opts["old"]._params]
            b = [p.detach().numpy().tobytes() for p in opts["new"]._params]
            assert a == b, "old and new parameters differ"
    for rep in range(2 * reps + 2):  # the decode alone, in its own loop, old/new order alternating
        pair = [("old", old_decode), ("new", new_decode)]
        for n, rnd in rounds.items():
            for label, fn in pair if rep % 2 else pair[::-1]:
                t0 = time.thread_time()
                fn(rnd)
                if rep > 1:
                    t.setdefault("decode " + label + n, []).append((time.thread_time() - t0) * 1e3)
    m = {key: statistics.median(v) for key, v in t.items()}
    threads = torch.get_num_threads()
    print(
        f"threads {threads}, thread CPU, medians of {reps} (apply) and {2 * reps} (decode); "
        "parameters bit-identical after every apply"
    )
    for what in ("apply", "decode"):
        for label in ("old", "new"):
            one, four = m[f"{what} {label}1"], m[f"{what} {label}4"]
            print(
                f"{what} (open + aggregate{' + rules' if what == 'apply' else ''}) {label}: 1 packet "
                f"{one:.2f} ms, 4 packets {four:.2f} ms, per extra packet {(four - one) / 3:.2f} ms"
            )
        ratio = [m[f"{what} new{n}"] / m[f"{what} old{n}"] for n in ("1", "4")]
        print(f"{what} new/old: 1 packet {ratio[0]:.3f}, 4 packets {ratio[1]:.3f}")


if __name__ == "__main__":
    main()
