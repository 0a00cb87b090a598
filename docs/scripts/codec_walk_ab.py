"""The compiled payload walk, before vs after, side by side in one process (issue 2).

*before* is a copy of an older ``kernels/`` imported under another package name (``oldk``), so
both versions (and their numba caches) live in one process; every payload is checked to decode
bit-identically (indices and value bits) by both, then each decodes the same payloads in
alternation, timed by thread CPU time (1 torch thread), medians over ``REPS``.

Prepare *before* (here: the tree before the shift-for-division change, 1efe8f9~1):

    rm -rf /tmp/h2old && mkdir -p /tmp/h2old && git archive 1efe8f9~1 kernels | tar -x -C /tmp/h2old
    mv /tmp/h2old/kernels /tmp/h2old/oldk
    grep -rl distronet.kernels /tmp/h2old/oldk | xargs sed -i 's/distronet\\.kernels/oldk/g'
    OLD=/tmp/h2old REPS=200 .venv/bin/python docs/scripts/codec_walk_ab.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.environ.get("OLD", "/tmp/h2old"))
torch.set_num_threads(1)

import oldk.coding_fast as old  # type: ignore[import-not-found]  # noqa: E402

from distronet.kernels import coding_fast as new  # noqa: E402
from distronet.kernels.coding import IndexCoding, ValueCoding  # noqa: E402
from distronet.node.bench.codec_run import RUN_ID, _Ours  # noqa: E402
from distronet.node.bench.codec_tensors import gpt_momentum  # noqa: E402
from distronet.protocol import packet  # noqa: E402
from distronet.protocol.identity import Identity  # noqa: E402

CODINGS = "fp32/entropy,fp16/entropy,bf16/entropy,int8/entropy,sign1/entropy,fp32/fixed"


def main() -> None:
    new.warm()
    old.warm()
    ts = gpt_momentum(30)
    ours = _Ours(ts, 32, Identity.generate())
    peers = ours.peers(4)
    print("payload decode per packet, thread CPU, medians; every payload decoded bit-identically")
    for cod in os.environ.get("CODINGS", CODINGS).split(","):
        vc, ic = cod.split("/")
        c = (ValueCoding[vc.upper()], IndexCoding[ic.upper()])
        frames = [ours.encode(c)] + [ours.encode(c, p, i) for i, p in peers]
        datas = [packet.open_packet(f, run_id=RUN_ID, layout_digest=ours.digest).payload for f in frames]
        for d in datas:
            a, b = new.decode_payload_flat(d, ours.nk), old.decode_payload_flat(d, ours.nk)
            assert np.array_equal(a.idx, b.idx) and np.array_equal(a.val.view(np.int32), b.val.view(np.int32))
        t: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(int(os.environ.get("REPS", "200"))):
            for name, mod in (("old", old), ("new", new)):
                t0 = time.thread_time()
                for d in datas:
                    mod.decode_payload_flat(d, ours.nk)
                t[name].append((time.thread_time() - t0) / len(datas) * 1e6)
        mo, mn = statistics.median(t["old"]), statistics.median(t["new"])
        print(f"k=32 {cod:14s} before {mo:6.1f} us  after {mn:6.1f} us  after/before {mn / mo:.3f}")


if __name__ == "__main__":
    main()
