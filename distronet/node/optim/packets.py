"""From momentum to a sealed packet and from a round of packets to its decoded payloads.

``TensorPlan`` fixes, per parameter, its tensor id (position in the run's layout), chunk layout
and whether it travels dense. ``build_packet`` extracts the top-k of each tensor's coefficient-
space momentum, codes it, and returns the sealed frame plus the dequantised values that were sent
(for exact error feedback). ``open_round`` verifies and decodes a round's frames, in ascending
peer-id order, skipping (deterministically: every replica skips the same ones) frames that fail;
it keeps each payload flat (``aggregate.round_sums`` decodes the round from them in one pass)
and builds per-tensor parts only when asked (``DecodedRound.parts``).
``open_frames`` is its per-frame work (open, verify, parse), shared with ``bench codec``: frames
are independent, so it spreads them over a few threads (zstd, SHA-256 and the compiled payload
walk release the GIL; msgpack and cryptography's Ed25519 verify hold it); each result is a pure
function of its frame, returned in input order, so results never depend on the thread count.

Cost per step: one top-k and one value/index coding pass per (chunk size, k) class of tensors
(not per tensor), one zstd + Ed25519 signature;
decoding is linear in the round's bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from distronet.kernels.coding import FlatPayload, IndexCoding, ValueCoding, decode_payload
from distronet.kernels.coding_batch import CodingGroup, encode_groups
from distronet.kernels.coding_table import read_header
from distronet.kernels.fanout import map_in_order
from distronet.kernels.layout import ChunkLayout, plan_layout
from distronet.kernels.topk import topk_chunks
from distronet.node.optim.config import DistroConfig
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.limits import DEFAULT_LIMITS, Limits
from distronet.protocol.packet import open_packet, seal_packet

__all__ = [
    "DecodeCache",
    "DecodedRound",
    "PlanSpec",
    "SentTensor",
    "TensorPlan",
    "build_packet",
    "make_plans",
    "momentum_buffers",
    "open_frames",
    "open_round",
    "plan_spec",
    "run_digest",
]

Part = tuple[torch.Tensor, torch.Tensor]
_CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """How one parameter travels: tensor id, name, layout, dense or top-k."""

    tensor_id: int
    name: str
    layout: ChunkLayout
    dense: bool

    def k(self, k: int) -> int:
        """Coefficients per chunk sent when the run's k is ``k``."""
        return self.layout.chunk_numel if self.dense else min(k, self.layout.chunk_numel)


@dataclasses.dataclass(frozen=True)
class SentTensor:
    """What this peer sent for one tensor: indices and the values a receiver will decode."""

    idx: torch.Tensor  # int64 (n_chunks, k)
    val: torch.Tensor  # float32 (n_chunks, k), dequantised


@dataclasses.dataclass(frozen=True)
class DecodedRound:
    """A verified round: the accepted peers' decoded payloads (``flats``, CPU) in peer-id order.

    ``tensor_ids`` are the plans' tensor ids; ``parts`` (built on first use) gives, per tensor
    id, the accepted peers' ``(idx, val)`` parts in peer-id order on ``device`` (views of
    ``flats`` on the CPU).
    """

    step: int
    peers: tuple[bytes, ...]
    flats: tuple[FlatPayload, ...]
    rejected: dict[bytes, RejectCode]
    key: bytes = b""  # sha256 over (layout digest, step, accepted peer ids and frame hashes)
    tensor_ids: tuple[int, ...] = ()
    device: torch.device = _CPU

    @functools.cached_property
    def parts(self) -> dict[int, list[Part]]:
        """Per tensor id, the accepted peers' parts in peer-id order (cost: two splits per payload)."""
        parts: dict[int, list[Part]] = {tid: [] for tid in self.tensor_ids}
        for flat in self.flats:
            for tid, (idx, val) in _as_parts(flat):
                if self.device.type != "cpu":
                    idx, val = idx.to(self.device), val.to(self.device)
                parts.setdefault(tid, []).append((idx, val))
        return parts

    def total_k(self) -> dict[int, int]:
        """Per tensor id, the coefficients per chunk summed over the accepted payloads."""
        out = dict.fromkeys(self.tensor_ids, 0)
        for flat in self.flats:
            for tid, k in zip(flat.tensor_ids.tolist(), flat.k.tolist(), strict=True):
                out[tid] = out.get(tid, 0) + k
        return out


_Decoded = FlatPayload | RejectCode


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """What a packet of one step must carry (the run's plan): every tensor id in ascending order,
    ``k`` coefficients per chunk each, and only the ``classes`` (value coding, index coding, k; 0
    for a dense tensor) the run's codings give. Checked by ``check_plan``."""

    tensor_ids: tuple[int, ...]
    k: tuple[int, ...]
    classes: frozenset[tuple[ValueCoding, IndexCoding, int]]


def plan_spec(plans: Sequence[TensorPlan], cfg: DistroConfig, step: int) -> PlanSpec:
    """The ``PlanSpec`` of ``step`` (the k schedule's k at that step)."""
    ex, k_now = cfg.extraction, cfg.extraction.k_at(step)
    ks = tuple(p.k(k_now) for p in plans)
    classes = frozenset(
        (
            ex.dense_value_coding if p.dense else ex.value_coding,
            ex.index_coding,
            0 if k == p.layout.chunk_numel else k,
        )
        for p, k in zip(plans, ks, strict=True)
    )
    return PlanSpec(tuple(p.tensor_id for p in plans), ks, classes)


def check_plan(
    flat: FlatPayload, payload: bytes, spec: PlanSpec, shapes: Sequence[tuple[int, int]], limits: Limits
) -> None:
    """Raise ``Rejected(OFF_PLAN)`` unless the decoded payload follows ``spec``: the same tensor
    set, the same k per tensor, and only the plan's coding classes in its class table. Catches a
    packet with extra k (more influence), another value coding (fp32 where the run codes int8) or
    a missing tensor. Does not catch a packet that swaps the codings of two planned classes
    between tensors of the same k (both classes are the run's). Cost: one header read."""
    if tuple(flat.tensor_ids.tolist()) != spec.tensor_ids:
        raise Rejected(RejectCode.OFF_PLAN, f"tensors {flat.tensor_ids.tolist()[:8]}... not the plan's")
    if tuple(flat.k.tolist()) != spec.k:
        raise Rejected(RejectCode.OFF_PLAN, "a tensor's k differs from the plan's")
    _, classes, _ = read_header(payload, shapes, limits)
    bad = [c for c in classes if c not in spec.classes]
    if bad:
        raise Rejected(RejectCode.OFF_PLAN, f"coding class {bad[0]} not in the run's plan")


class DecodeCache:
    """Decoded frames (flat payloads) by (layout digest, step, sha256(frame)), shared by replicas
    in one process.

    Decoding is a pure function of the frame's bytes, so an in-process swarm may decode each
    frame once for all its replicas. Holds at most ``max_entries`` frames (oldest evicted).
    It also holds per-round results that are pure functions of a round's accepted frames
    (``DecodedRound.key``): the decoded aggregate of a tensor and its stateless update
    direction, at most ``max_rounds`` rounds. Cached tensors are shared: callers must not
    modify them.
    """

    def __init__(self, max_entries: int = 256, max_rounds: int = 2) -> None:
        self.max_entries = max_entries
        self.max_rounds = max_rounds
        self._data: dict[bytes, _Decoded] = {}
        self._rounds: dict[bytes, dict[tuple[int, str], torch.Tensor]] = {}

    def get(self, key: bytes) -> _Decoded | None:
        return self._data.get(key)

    def put(self, key: bytes, value: _Decoded) -> None:
        self._data[key] = value
        while len(self._data) > self.max_entries:
            del self._data[next(iter(self._data))]

    def round_tensors(self, round_key: bytes) -> dict[tuple[int, str], torch.Tensor]:
        """The mutable per-round store for ``round_key`` ((tensor id, what) -> tensor); a fresh,
        unshared one when ``max_rounds`` is 0."""
        if self.max_rounds <= 0:
            return {}
        store = self._rounds.get(round_key)
        if store is None:
            store = self._rounds[round_key] = {}
            while len(self._rounds) > self.max_rounds:
                del self._rounds[next(iter(self._rounds))]
        return store


def make_plans(named_shapes: Sequence[tuple[str, tuple[int, ...]]], cfg: DistroConfig) -> list[TensorPlan]:
    """One plan per parameter, in the given order (the order is the tensor id)."""
    plans = []
    for tid, (name, shape) in enumerate(named_shapes):
        layout = plan_layout(tuple(shape), cfg.extraction.chunk)
        dense = cfg.extraction.dense_1d and len(shape) <= 1
        plans.append(TensorPlan(tid, name, layout, dense))
    return plans


def run_digest(plans: Sequence[TensorPlan]) -> bytes:
    """The run's layout digest (names, shapes, chunk sizes) that every packet carries."""
    return layout_digest([(p.name, p.layout.shape, p.layout.chunk) for p in plans])


def momentum_buffers(plans: Sequence[TensorPlan], params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Zeroed float32 momenta ``(n_chunks, chunk_numel)``, one per plan, in plan order: the
    momenta of one ``(chunk_numel, dense, device)`` class are consecutive views of one buffer, in
    plan order, so :func:`build_packet` selects a class's top-k straight from that buffer instead
    of stacking a copy of it every step (the Llama set: one 21 MB copy a step)."""
    by: dict[tuple[int, bool, torch.device], list[int]] = {}
    for i, (plan, p) in enumerate(zip(plans, params, strict=True)):
        by.setdefault((plan.layout.chunk_numel, plan.dense, p.device), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(plans)
    for (cn, _dense, dev), members in by.items():
        flat = torch.zeros(
            sum(plans[i].layout.n_chunks for i in members) * cn, dtype=torch.float32, device=dev
        )
        at = 0
        for i in members:
            n = plans[i].layout.n_chunks * cn
            out[i] = flat[at : at + n].view(-1, cn)
            at += n
    return [m for m in out if m is not None]


def _stacked(ms: Sequence[torch.Tensor], cn: int) -> torch.Tensor:
    """``torch.cat`` of the ``(n_i, cn)`` tensors ``ms``, or a view of them where they already lie
    one after another in one storage (:func:`momentum_buffers`)."""
    if len(ms) == 1:
        return ms[0]
    first = ms[0]
    at = first.storage_offset()
    for m in ms:
        if (
            not m.is_contiguous()
            or m.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or m.storage_offset() != at
        ):
            return torch.cat([m.reshape(-1, cn) for m in ms])
        at += m.numel()
    return first.as_strided((sum(int(m.shape[0]) for m in ms), cn), (cn, 1))


def build_packet(
    plans: Sequence[TensorPlan],
    momenta: Sequence[torch.Tensor],
    cfg: DistroConfig,
    step: int,
    identity: Identity,
    digest: bytes,
) -> tuple[bytes, list[SentTensor]]:
    """Extract, code and seal this peer's packet for ``step``.

    ``momenta[i]`` is plan i's coefficient-space momentum ``(n_chunks, chunk_numel)``; it is not
    modified. Returns the sealed frame and, per tensor, what was sent (dequantised).

    Batched across tensors: the momenta of every tensor of one ``(chunk_numel, k, dense)`` class
    are stacked (one copy), so one top-k and one coding pass (``coding_batch.encode_groups``)
    serve them all; the bytes are those of coding tensor by tensor (``encode_tensor`` +
    ``encode_payload``), and ``test_optim_packets`` holds the two equal.
    """
    ex, k_now = cfg.extraction, cfg.extraction.k_at(step)
    by_class: dict[tuple[int, int, bool], list[int]] = {}
    for i, plan in enumerate(plans):
        by_class.setdefault((plan.layout.chunk_numel, plan.k(k_now), plan.dense), []).append(i)
    groups: list[CodingGroup] = []
    picked: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
    for (cn, k, dense), members in by_class.items():
        ms = [momenta[i] for i in members]
        c = _stacked(ms, cn)
        if dense:
            idx = torch.arange(k, dtype=torch.int64, device=c.device).expand(c.shape[0], k)
            val = c
        else:
            idx, val = topk_chunks(c, k)
        groups.append(
            CodingGroup(
                tuple(plans[i].tensor_id for i in members),
                tuple(plans[i].layout.n_chunks for i in members),
                np.ascontiguousarray(idx.cpu().numpy(), dtype=np.int64),
                np.ascontiguousarray(val.detach().cpu().numpy(), dtype=np.float32),
                cn,
                ex.dense_value_coding if dense else ex.value_coding,
                ex.index_coding,
            )
        )
        picked.append((members, idx, val))
    payload, deqs = encode_groups(groups)
    sent: list[SentTensor | None] = [None] * len(plans)
    for (members, idx, val), deq in zip(picked, deqs, strict=True):
        dq = torch.from_numpy(deq).to(val.device)
        row = 0
        for i in members:
            n = plans[i].layout.n_chunks
            sent[i] = SentTensor(idx[row : row + n], dq[row : row + n])
            row += n
    frame = seal_packet(identity, cfg.run_id, step, digest, payload)
    return frame, [s for s in sent if s is not None]


def open_frames(
    frames: Sequence[bytes],
    *,
    run_id: str,
    digest: bytes,
    shapes: Sequence[tuple[int, int]],
    step: int | None = None,
    peers: Sequence[bytes] | None = None,
    limits: Limits = DEFAULT_LIMITS,
    workers: int | None = None,
    spec: PlanSpec | None = None,
) -> list[FlatPayload | RejectCode]:
    """Open, verify and parse each frame: its payload decoded flat, or why it was refused.

    A frame counts when ``open_packet`` accepts it (signature, run, layout), its signer is
    ``peers[i]`` (when given; else WRONG_PEER), its step is ``step`` (when given; else
    STALE_STEP), its payload decodes against ``shapes`` ((n_chunks, chunk_numel) per tensor
    id) and, when ``spec`` is given, follows the run's plan (else OFF_PLAN, ``check_plan``);
    every check of the wire format runs. Results are in input order and each depends on its
    frame alone, so they are the same for any ``workers`` (default: torch's intra-op thread
    count, at most the CPU count; 1 runs inline). Cost per frame: zstd, msgpack, SHA-256 of the
    payload, one Ed25519 verification, one compiled payload walk.
    """
    if peers is not None and len(peers) != len(frames):
        raise ValueError(f"{len(peers)} peers for {len(frames)} frames")
    n = len(frames)

    def one(i: int) -> FlatPayload | RejectCode:
        peer = None if peers is None else peers[i]
        return _open_one(frames[i], run_id, digest, shapes, step, peer, limits, spec)

    return map_in_order(one, n, _workers() if workers is None else workers)


def _open_one(
    frame: bytes,
    run_id: str,
    digest: bytes,
    shapes: Sequence[tuple[int, int]],
    step: int | None,
    peer: bytes | None,
    limits: Limits,
    spec: PlanSpec | None = None,
) -> FlatPayload | RejectCode:
    try:
        pkt = open_packet(frame, run_id=run_id, layout_digest=digest, limits=limits)
        if peer is not None and pkt.peer_id != peer:
            raise Rejected(RejectCode.WRONG_PEER, "packet signed by another peer")
        if step is not None and pkt.step != step:
            raise Rejected(RejectCode.STALE_STEP, f"packet for step {pkt.step}, round {step}")
        flat = decode_payload(pkt.payload, shapes, limits)
        if spec is not None:
            check_plan(flat, pkt.payload, spec, shapes, limits)
        return flat
    except Rejected as e:
        return e.code


def _workers() -> int:
    return max(1, min(torch.get_num_threads(), os.cpu_count() or 1))


def open_round(
    frames: Mapping[bytes, bytes],
    plans: Sequence[TensorPlan],
    cfg: DistroConfig,
    step: int,
    digest: bytes,
    device: torch.device,
    cache: DecodeCache | None = None,
    admitted: frozenset[bytes] | None = None,
) -> DecodedRound:
    """Verify and decode a round's frames (ascending peer id); bad frames are skipped and reported.

    A frame counts only when its signer is ``admitted`` (when given; else UNKNOWN_PEER, before any
    decoding), it opens (signature, run, layout), names the same peer and step, its payload
    decodes against the plans' layouts and follows the run's plan for ``step`` (OFF_PLAN).
    Deterministic: same frames, same result.
    """
    shapes = [(p.layout.n_chunks, p.layout.chunk_numel) for p in plans]
    flats: list[FlatPayload] = []
    peers: list[bytes] = []
    rejected: dict[bytes, RejectCode] = {}
    round_hash = hashlib.sha256(digest + step.to_bytes(8, "big"))
    order = sorted(frames)
    if admitted is not None:
        rejected.update((pid, RejectCode.UNKNOWN_PEER) for pid in order if pid not in admitted)
        order = [pid for pid in order if pid in admitted]
    hashes = [hashlib.sha256(frames[pid]).digest() for pid in order]
    keys = [digest + step.to_bytes(8, "big") + pid + h for pid, h in zip(order, hashes, strict=True)]
    got: list[_Decoded | None] = [cache.get(key) if cache is not None else None for key in keys]
    todo = [i for i, g in enumerate(got) if g is None]
    opened = open_frames(
        [frames[order[i]] for i in todo],
        run_id=cfg.run_id,
        digest=digest,
        shapes=shapes,
        step=step,
        peers=[order[i] for i in todo],
        spec=plan_spec(plans, cfg, step),
    )
    for i, res in zip(todo, opened, strict=True):
        got[i] = res
        if cache is not None:
            cache.put(keys[i], res)
    for pid, frame_hash, one in zip(order, hashes, got, strict=True):
        assert one is not None
        if isinstance(one, RejectCode):
            rejected[pid] = one
            continue
        peers.append(pid)
        flats.append(one)
        round_hash.update(pid + frame_hash)
    tids = tuple(p.tensor_id for p in plans)
    return DecodedRound(step, tuple(peers), tuple(flats), rejected, round_hash.digest(), tids, device)


def _as_parts(flat: FlatPayload) -> list[tuple[int, Part]]:
    """A decoded payload's tensors as ``(tensor id, (idx (n, k), val (n, k)))`` torch views of its
    flat arrays (no copies; one split per array, not a conversion per tensor)."""
    sizes = np.diff(flat.offsets).tolist()
    idx = torch.from_numpy(np.asarray(flat.idx, dtype=np.int64)).split(sizes)
    val = torch.from_numpy(np.asarray(flat.val, dtype=np.float32)).split(sizes)
    return [
        (t, (i.view(n, k), v.view(n, k)))
        for t, n, k, i, v in zip(
            flat.tensor_ids.tolist(), flat.n.tolist(), flat.k.tolist(), idx, val, strict=True
        )
    ]
