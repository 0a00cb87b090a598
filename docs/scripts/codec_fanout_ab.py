"""How a round's frames are spread over threads: the 16-packet decode, side by side (issue 2).

Variants, alternated within every repeat on the same frames (16 peers' GPT packets at k=32, as
``bench codec`` builds them), each decoding 1 and 16 packets on the bench's full path
(``_Ours.decode``: ``open_frames`` then ``decode_flat``):

* ``steal``  — the tree: ``kernels.fanout.map_in_order`` (items claimed one by one; the caller
  never waits for a helper, it recomputes what a helper still holds);
* ``stride`` — the scheduling before it (kept here): frames striped over the caller and the
  helpers in advance (caller i = 0, w, 2w, ...; helper j = j, j + w, ...), the caller waits for
  every helper's stripe;
* ``serial`` — ``workers=1``: every frame on the caller's thread.

Prints per coding each variant's median dec1 / dec16 (ms) and dec16/dec1.

    THREADS=2 REPS=30 .venv/bin/python docs/scripts/codec_fanout_ab.py

``WORKERS=n`` sets the frame threads apart from torch's (``THREADS=1 WORKERS=2``: two frame
threads, no OpenMP worker).

Times are wall clock (``time.perf_counter``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "2")))

import distronet.node.bench.codec_run as codec_run  # noqa: E402
from distronet.kernels.coding import IndexCoding, ValueCoding  # noqa: E402
from distronet.kernels.coding_fast import warm  # noqa: E402
from distronet.node.bench.codec_tensors import gpt_momentum  # noqa: E402
from distronet.node.optim import packets  # noqa: E402
from distronet.protocol.identity import Identity  # noqa: E402

if os.environ.get("WORKERS"):  # frame threads apart from torch's (e.g. THREADS=1 WORKERS=2)
    packets._workers = lambda: int(os.environ["WORKERS"])  # type: ignore[assignment]
STEAL = packets.open_frames
_STRIDE_POOL = ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1))


def stride(frames: Sequence[bytes], **kw: object) -> list[object]:
    """``open_frames`` as it scheduled frames before ``kernels.fanout`` (striped in advance)."""
    n = len(frames)

    def one(i: int) -> object:
        return STEAL([frames[i]], **{**kw, "workers": 1})[0]  # type: ignore[arg-type]

    w = max(1, min(n, packets._workers()))
    if w == 1:
        return [one(i) for i in range(n)]

    def stripe(start: int) -> list[tuple[int, object]]:
        return [(i, one(i)) for i in range(start, n, w)]

    futures = [_STRIDE_POOL.submit(stripe, s) for s in range(1, w)]
    out: list[object] = [None] * n
    for i, got in [*stripe(0), *(x for f in futures for x in f.result())]:
        out[i] = got
    return out


def serial(frames: Sequence[bytes], **kw: object) -> list[object]:
    return STEAL(frames, **{**kw, "workers": 1})  # type: ignore[arg-type]


VARIANTS: dict[str, Callable[..., list[object]]] = {"steal": STEAL, "stride": stride, "serial": serial}


def main() -> None:
    warm()
    ts = gpt_momentum(30)
    ours = codec_run._Ours(ts, 32, Identity.generate())
    peers = ours.peers(16)
    reps = int(os.environ.get("REPS", "30"))
    names = os.environ.get("VARIANTS", "steal,stride,serial").split(",")
    codings = os.environ.get("CODINGS", "fp32/entropy,fp16/entropy,int8/entropy,sign1/entropy").split(",")
    print(f"torch threads {torch.get_num_threads()}, frame threads {packets._workers()}, {reps} repeats")
    for cod in codings:
        vc, ic = cod.split("/")
        c = (ValueCoding[vc.upper()], IndexCoding[ic.upper()])
        frames = [ours.encode(c)] + [ours.encode(c, p, ident) for ident, p in peers]
        t: dict[str, list[float]] = {}
        for v in names:  # untimed first decodes
            codec_run.open_frames = VARIANTS[v]  # type: ignore[assignment]
            ours.decode(frames)
            ours.decode(frames[:1])
        for _ in range(reps):
            for v in names:
                codec_run.open_frames = VARIANTS[v]  # type: ignore[assignment]
                for n, fr in (("1", frames[:1]), ("16", frames)):
                    t0 = time.perf_counter()
                    ours.decode(fr)
                    t.setdefault(v + n, []).append((time.perf_counter() - t0) * 1e3)
        codec_run.open_frames = STEAL
        row = []
        for v in names:
            m1, m16 = statistics.median(t[v + "1"]), statistics.median(t[v + "16"])
            row.append(f"{v}: {m1:5.2f} {m16:6.2f} {m16 / m1:4.2f}")
        print(f"k=32 {cod:14s} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
