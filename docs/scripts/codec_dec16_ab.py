"""Decode 16 packets vs 1 on the bench's full path, side by side in one process (issue 2).

Variants, alternated within every repeat on the same frames (16 peers' GPT packets, as
``bench codec`` builds them): ``nacl`` = the tree as it is (``protocol.packet._verify`` by
libsodium, PyNaCl ``crypto_sign_open``, which releases the GIL; since 691d26c); ``crypto`` = the
same with ``_verify`` swapped for pyca/cryptography's Ed25519 verify (which holds the GIL), the
tree's verify before 691d26c, to measure what the swap bought.
Prints, per coding, each variant's median dec1 / dec16 (ms) and dec16/dec1.

    THREADS=2 KS=32 REPS=15 CODINGS=fp32/entropy,sign1/entropy .venv/bin/python docs/scripts/codec_dec16_ab.py

Times are wall clock (``time.perf_counter``) at THREADS > 1, thread CPU time at THREADS=1.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "2")))

import distronet.protocol.packet as packet  # noqa: E402
from distronet.kernels.coding import IndexCoding, ValueCoding  # noqa: E402
from distronet.kernels.coding_fast import warm  # noqa: E402
from distronet.node.bench.codec_run import _Ours  # noqa: E402
from distronet.node.bench.codec_tensors import gpt_momentum  # noqa: E402
from distronet.protocol.identity import Identity, public_key_from_peer_id  # noqa: E402
from distronet.protocol.packet import is_ed25519_peer_id  # noqa: E402

NACL = packet._verify


def crypto_verify(peer_id: bytes, data: bytes, signature: bytes) -> bool:
    """``packet._verify`` by pyca/cryptography: same inputs, False on any failure."""
    from cryptography.exceptions import InvalidSignature

    if len(signature) != 64 or not is_ed25519_peer_id(peer_id):
        return False
    try:
        public_key_from_peer_id(peer_id).verify(signature, data)
    except (InvalidSignature, ValueError):
        return False
    return True


def main() -> None:
    warm()
    ts = gpt_momentum(30)
    reps = int(os.environ.get("REPS", "15"))
    codings = [c.split("/") for c in os.environ.get("CODINGS", "fp32/entropy,sign1/entropy").split(",")]
    variants = os.environ.get("VARIANTS", "crypto,nacl").split(",")
    clk = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    print(f"threads {torch.get_num_threads()}, {reps} repeats, clock {clk.__name__}")
    for k in [int(x) for x in os.environ.get("KS", "32").split(",")]:
        ours = _Ours(ts, k, Identity.generate())
        peers = ours.peers(16)
        for vc, ic in codings:
            c = (ValueCoding[vc.upper()], IndexCoding[ic.upper()])
            frames = [ours.encode(c)] + [ours.encode(c, p, ident) for ident, p in peers]
            t: dict[str, list[float]] = {}
            for v in variants:  # warm each variant once
                packet._verify = NACL if v == "nacl" else crypto_verify
                ours.decode(frames)
                ours.decode(frames[:1])
            for _ in range(reps):
                for v in variants:
                    packet._verify = NACL if v == "nacl" else crypto_verify
                    for n, fr in (("1", frames[:1]), ("16", frames)):
                        t0 = clk()
                        ours.decode(fr)
                        t.setdefault(v + n, []).append((clk() - t0) * 1e3)
            packet._verify = NACL
            row = []
            for v in variants:
                m1, m16 = statistics.median(t[v + "1"]), statistics.median(t[v + "16"])
                row.append(f"{v}: dec1 {m1:6.2f} dec16 {m16:6.2f} 16/1 {m16 / m1:4.2f}")
            print(f"k={k:2d} {vc}/{ic:8s} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
