"""The per-step parameter digest, SHA-256 (before 508e22d) vs BLAKE3 (``trainer.tensors_digest``).

The daemon digests the replicated parameters after every step, in the training thread
(``node_loop._step_and_digest``). Both hash the default GPT's parameters in place, in order;
alternating, thread CPU medians over ``REPS`` (default 50), one torch thread.

    flock /tmp/bench.lock .venv/bin/python docs/scripts/digest_ab.py
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from collections.abc import Iterable

import torch

torch.set_num_threads(1)

from distronet.node.models.gpt import GPT, GPTConfig  # noqa: E402
from distronet.node.daemon.trainer import tensors_digest  # noqa: E402


def sha256_digest(tensors: Iterable[torch.Tensor]) -> str:
    """``tensors_digest`` as it was: SHA-256 over the tensors' bytes, in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().data)
    return h.hexdigest()


def main() -> None:
    params = [p for _, p in GPT(GPTConfig(), seed=0).named_parameters()]
    size = sum(p.numel() * p.element_size() for p in params)
    t: dict[str, list[float]] = {"sha256": [], "blake3": []}
    for _ in range(int(os.environ.get("REPS", "50"))):
        for name, fn in (("sha256", sha256_digest), ("blake3", tensors_digest)):
            t0 = time.thread_time()
            fn(params)
            t[name].append((time.thread_time() - t0) * 1e3)
    m = {k: statistics.median(v) for k, v in t.items()}
    print(f"default GPT, {len(params)} tensors, {size:,} bytes; thread CPU medians of {len(t['sha256'])}")
    ratio = m["blake3"] / m["sha256"]
    print(f"sha256 {m['sha256']:.3f} ms, blake3 {m['blake3']:.3f} ms, blake3/sha256 {ratio:.2f}")


if __name__ == "__main__":
    main()
