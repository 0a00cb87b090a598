"""Where a 16-packet decode goes: ``open_frames`` vs ``decode_flat`` (lead, session 5).

GPT momentum (30 steps), k=32, fp32 values, gap-coded indices; medians of 30 timings.
Run: ``.venv/bin/python docs/scripts/codec_open_vs_decode.py THREADS``
"""

import statistics
import sys
import time
from collections.abc import Callable

import torch

from distronet.kernels.coding import IndexCoding, ValueCoding
from distronet.kernels.coding_fast import warm
from distronet.kernels.decode_batch import decode_flat
from distronet.node.bench.codec_run import RUN_ID, _Ours
from distronet.node.bench.codec_tensors import gpt_momentum
from distronet.node.optim.packets import open_frames
from distronet.protocol.identity import Identity


def median_ms(fn: Callable[[], object], n: int = 30) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs) * 1e3


def main(threads: int) -> None:
    torch.set_num_threads(threads)
    warm()
    ts = gpt_momentum(30)
    ours = _Ours(ts, 32, Identity.generate())
    coding = (ValueCoding.FP32, IndexCoding.ENTROPY)
    frames = [ours.encode(coding)] + [ours.encode(coding, p, i) for i, p in ours.peers(16)]
    for n in (1, 16):
        fs = frames[:n]
        flats = open_frames(fs, run_id=RUN_ID, digest=ours.digest, shapes=ours.nk)
        pool = median_ms(lambda fs=fs: open_frames(fs, run_id=RUN_ID, digest=ours.digest, shapes=ours.nk))
        one = median_ms(
            lambda fs=fs: open_frames(fs, run_id=RUN_ID, digest=ours.digest, shapes=ours.nk, workers=1)
        )
        dec = median_ms(lambda flats=flats: decode_flat(ts.layouts, flats))
        total = median_ms(lambda fs=fs: ours.decode(fs))
        print(f"{n:2d} frames: open {pool:.2f} ms (1 worker {one:.2f}), decode {dec:.2f}, all {total:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
