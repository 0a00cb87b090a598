"""Measurements behind `bench codec`: ours and the DeMo reference, same tensors, one process.

* ours, encode: tensors -> per-chunk DCT top-k -> value + index coding -> payload -> signed,
  zstd-framed step packet (``seal_packet``); decode: the frames -> ``open_frames`` (the node's
  own per-frame path, ``node/optim/packets.py``: ``open_packet`` with its signature check, then
  ``decode_payload`` with every check of the wire format; frames spread over torch's
  thread count of threads, results in frame order) -> ``decode_flat``: all tensors of all
  packets in one buffer, one scatter per packet in frame order, one inverse per block shape ->
  dense tensors.
* reference, encode: einsum DCT -> top-k -> raw int64 indices + fp32 values as bytes;
  decode: bytes -> scatter (mean) -> einsum inverse DCT -> dense tensors. No signature, no zstd.
* ``decode_16_over_1``: decoding 16 packets over decoding 1 (the first of them), on the full
  path: every frame opened (zstd, msgpack, its own peer's Ed25519 signature), parsed and
  validated by the node's own ``open_frames`` (what ``open_round`` runs on a round's frames),
  then one scatter per packet and ONE inverse (``decode_flat``, as the optimizer does too:
  ``node/optim/aggregate.round_sums``). The 16 packets
  are 16 peers' packets: 16 identities, each sending its own momentum (the set's tensors times
  ``1 + 0.2 * N(0, 1)`` noise per element, seeded per peer), so indices, values, bucket-code
  parameters and sizes differ as between real peers;
  ``kernel_decode_16_over_1`` is the same ratio for coefficients -> dense tensors only
  (``decode_sum_many``: what the aggregation step adds per peer once packets have been checked
  on arrival).

Timings are medians over ``repeats``; each of our timings is taken next to a fresh timing of the
reference (so each row's reference figures are its own), kernel-only timings once per repeat.
Every coding's decode of 1 and of 16 packets runs once untimed first (the payload plan, the 16
peers' walk tables and the frame pool exist before the first timing, as in a running node), and
the two decodes get ``decode_repeats`` samples in all (at least ``repeats``): the in-loop ones
plus back-to-back pairs after it, so ``decode_16_over_1`` is a ratio of medians of several
adjacent samples, not of three.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from distronet.kernels.coding import IndexCoding, ValueCoding, warm
from distronet.kernels.coding_batch import CodingGroup, encode_batch, encode_groups
from distronet.kernels.decode import decode_flat
from distronet.kernels.encode import TopkGroup, dct_topk_groups
from distronet.kernels.topk import dct_topk
from distronet.node.bench.codec_demo import DemoReference
from distronet.node.bench.codec_kernels import decode_sum_many
from distronet.node.bench.codec_tensors import TensorSet
from distronet.node.optim.packets import open_frames
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.packet import seal_packet

__all__ = ["Coding", "Result", "measure"]

RUN_ID = "bench-codec"
Coding = tuple[ValueCoding, IndexCoding]
Part = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Result:
    """One row of the benchmark: a tensor set at one k and one coding (times in ms)."""

    config: str
    tensors: str
    k: int
    value_coding: str
    index_coding: str
    params: int
    coefficients: int
    wire_bytes: int
    bits_per_coefficient: float
    bits_per_param: float
    ref_bits_per_coefficient: float
    encode_ms: float
    decode_ms: float
    ref_encode_ms: float
    ref_decode_ms: float
    speedup: float
    decode_16_over_1: float
    kernel_encode_ms: float
    kernel_decode_ms: float
    ref_kernel_encode_ms: float
    ref_kernel_decode_ms: float
    kernel_decode_16_over_1: float
    rel_err_vs_ref: float


def _timed(fn: Callable[[], object], sink: list[float]) -> None:
    t0 = time.perf_counter()
    fn()
    sink.append((time.perf_counter() - t0) * 1e3)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


class _Ours:
    """Our full path for one tensor set at one k."""

    def __init__(self, ts: TensorSet, k: int, identity: Identity) -> None:
        self.ts, self.identity = ts, identity
        self.ks = [min(k, lay.chunk_numel) for lay in ts.layouts]
        self.digest = layout_digest(
            [(n, lay.shape, lay.chunk) for n, lay in zip(ts.names, ts.layouts, strict=True)]
        )
        self.nk = [(lay.n_chunks, lay.chunk_numel) for lay in ts.layouts]

    def kernel_encode(self) -> list[TopkGroup]:
        """DCT + top-k of every tensor, one transform and one selection per block shape."""
        return dct_topk_groups(self.ts.tensors, self.ts.layouts, self.ks)

    def parts(self) -> list[Part]:
        """This set's own top-k, per tensor (views of :meth:`kernel_encode`'s groups)."""
        out: list[Part | None] = [None] * len(self.ks)
        for g in self.kernel_encode():
            row = 0
            for i, n in zip(g.members, g.rows, strict=True):
                out[i] = (g.idx[row : row + n], g.val[row : row + n])
                row += n
        return [p for p in out if p is not None]

    def encode(
        self, coding: Coding, parts: Sequence[Part] | None = None, identity: Identity | None = None
    ) -> bytes:
        """A sealed frame of ``parts`` (default: this set's own top-k) signed by ``identity``:
        batched (``dct_topk_groups`` then ``encode_groups``, one pass per block shape)."""
        if parts is None:
            payload, _ = encode_groups(
                [
                    CodingGroup(g.members, g.rows, g.idx.numpy(), g.val.numpy(), g.chunk_numel, *coding)
                    for g in self.kernel_encode()
                ]
            )
        else:
            payload, _ = encode_batch(
                [
                    (i, idx.numpy(), val.numpy(), lay.chunk_numel, *coding)
                    for i, ((idx, val), lay) in enumerate(zip(parts, self.ts.layouts, strict=True))
                ]
            )
        return seal_packet(identity or self.identity, RUN_ID, 1, self.digest, payload)

    def peers(self, n: int) -> list[tuple[Identity, list[Part]]]:
        """``n - 1`` other peers: own identity, own momentum (module doc), its top-k."""
        out = []
        for p in range(1, n):
            g = torch.Generator().manual_seed(p)
            mine = [t * (1 + 0.2 * torch.randn(t.shape, generator=g)) for t in self.ts.tensors]
            parts = [dct_topk(t, lay, k) for t, lay, k in zip(mine, self.ts.layouts, self.ks, strict=True)]
            out.append((Identity.generate(), parts))
        return out

    def kernel_decode(self, parts: Sequence[Sequence[Part]]) -> list[torch.Tensor]:
        return decode_sum_many(self.ts.layouts, [[p[i] for p in parts] for i in range(len(self.ts.layouts))])

    def decode(self, frames: Sequence[bytes]) -> list[torch.Tensor]:
        """A round's frames to dense tensors, as a node does (``open_frames``, ``decode_flat``)."""
        flats = open_frames(frames, run_id=RUN_ID, digest=self.digest, shapes=self.nk)
        bad = [f for f in flats if isinstance(f, RejectCode)]
        if bad:
            raise Rejected(bad[0], "a benchmark packet was refused")
        return decode_flat(self.ts.layouts, [f for f in flats if not isinstance(f, RejectCode)])


class _Ref:
    """The DeMo reference for one tensor set at one k."""

    def __init__(self, ts: TensorSet, k: int) -> None:
        self.ts, self.k = ts, k
        self.refs = [DemoReference(tuple(t.shape), ts.layouts[0].chunk) for t in ts.tensors]

    def kernel_encode(self) -> list[Part]:
        return [r.encode(t, self.k) for r, t in zip(self.refs, self.ts.tensors, strict=True)]

    def encode(self) -> bytes:
        return b"".join(DemoReference.to_bytes(i, v) for i, v in self.kernel_encode())

    def kernel_decode(self, packets: Sequence[Part]) -> list[torch.Tensor]:
        return [r.decode([p]) for r, p in zip(self.refs, packets, strict=True)]

    def decode(self, data: bytes) -> list[torch.Tensor]:
        out, pos = [], 0
        for r in self.refs:
            k = min(self.k, r.chunk_numel)
            n = 12 * k * (r.shape[0] * (r.shape[1] if len(r.shape) == 2 else 1) // r.chunk_numel)
            out.append(r.decode([r.from_bytes(data[pos : pos + n], k)]))
            pos += n
        return out


def _rel_err(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    num = sum(float((x - y).square().sum()) for x, y in zip(a, b, strict=True))
    den = sum(float(y.square().sum()) for y in b)
    return (num / den) ** 0.5 if den else 0.0


def measure(
    ts: TensorSet, k: int, codings: Sequence[Coding], repeats: int, decode_repeats: int = 0
) -> list[Result]:
    """Measure every coding of ``ts`` at ``k`` against the reference; one row per coding.

    ``decode_repeats``: samples of our 1- and 16-packet decodes (module doc; at least ``repeats``).
    """
    warm()  # the compiled payload walk, as a node uses it after start-up (kernels.coding)
    ours, ref = _Ours(ts, k, Identity.generate()), _Ref(ts, k)
    coefs = sum(lay.n_chunks * kk for lay, kk in zip(ts.layouts, ours.ks, strict=True))
    frames = {c: ours.encode(c) for c in codings}
    peers = ours.peers(16)
    rounds = {c: [frames[c], *(ours.encode(c, parts, ident) for ident, parts in peers)] for c in codings}
    ref_bytes, ref_parts, our_parts = ref.encode(), ref.kernel_encode(), ours.parts()
    t: dict[str, list[float]] = {}

    def sink(key: str) -> list[float]:
        return t.setdefault(key, [])

    for c in codings:  # untimed first decodes (module doc)
        ours.decode([frames[c]])
        ours.decode(rounds[c])
    for _ in range(repeats):
        # Kernels only (coefficients in, coefficients out), once per repeat.
        _timed(ref.kernel_encode, sink("ref_kenc"))
        _timed(ours.kernel_encode, sink("kenc"))
        _timed(lambda: ref.kernel_decode(ref_parts), sink("ref_kdec"))
        _timed(lambda: ours.kernel_decode([our_parts]), sink("kdec"))
        _timed(lambda: ours.kernel_decode([our_parts] * 16), sink("kdec16"))
        # Full paths: every coding of ours next to a fresh run of the reference.
        for c in codings:
            _timed(ref.encode, sink(f"ref_enc{c}"))
            _timed(lambda c=c: ours.encode(c), sink(f"enc{c}"))  # type: ignore[misc]
            _timed(lambda: ref.decode(ref_bytes), sink(f"ref_dec{c}"))
            _timed(lambda c=c: ours.decode([frames[c]]), sink(f"dec{c}"))  # type: ignore[misc]
            _timed(lambda c=c: ours.decode(rounds[c]), sink(f"dec16{c}"))  # type: ignore[misc]
    for _ in range(max(decode_repeats - repeats, 0)):  # more adjacent pairs of the two decodes
        for c in codings:
            _timed(lambda c=c: ours.decode([frames[c]]), sink(f"dec{c}"))  # type: ignore[misc]
            _timed(lambda c=c: ours.decode(rounds[c]), sink(f"dec16{c}"))  # type: ignore[misc]
    ref_dense = ref.decode(ref_bytes)
    rows = []
    for c in codings:
        vc, ic = c
        enc, dec, ref_enc, ref_dec = (_med(t[x + str(c)]) for x in ("enc", "dec", "ref_enc", "ref_dec"))
        rows.append(
            Result(
                config=f"{ts.name} k={k} {vc.name.lower()}/{ic.name.lower()}",
                tensors=ts.name,
                k=k,
                value_coding=vc.name.lower(),
                index_coding=ic.name.lower(),
                params=ts.numel,
                coefficients=coefs,
                wire_bytes=len(frames[c]),
                bits_per_coefficient=8 * len(frames[c]) / coefs,
                bits_per_param=8 * len(frames[c]) / ts.numel,
                ref_bits_per_coefficient=8 * len(ref_bytes) / coefs,
                encode_ms=enc,
                decode_ms=dec,
                ref_encode_ms=ref_enc,
                ref_decode_ms=ref_dec,
                speedup=(ref_enc + ref_dec) / (enc + dec),
                decode_16_over_1=_med(t[f"dec16{c}"]) / dec,
                kernel_encode_ms=_med(t["kenc"]),
                kernel_decode_ms=_med(t["kdec"]),
                ref_kernel_encode_ms=_med(t["ref_kenc"]),
                ref_kernel_decode_ms=_med(t["ref_kdec"]),
                kernel_decode_16_over_1=_med(t["kdec16"]) / _med(t["kdec"]),
                rel_err_vs_ref=_rel_err(ours.decode([frames[c]]), ref_dense),
            )
        )
    return rows
