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
from distronet.kernels.dct import chunks_from_spatial, spatial_from_chunks, spatial_index, spatial_shape
from distronet.kernels.fanout import map_in_order
from distronet.kernels.jit_state import use_jit
from distronet.kernels.layout import ChunkLayout, plan_layout
from distronet.kernels.topk import select_compiled, topk_chunks
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
    "feed_back",
    "feed_back_all",
    "make_plans",
    "momentum_buffers",
    "momentum_chunks",
    "open_frames",
    "open_round",
    "plan_spec",
    "run_digest",
    "to_momentum",
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

    @property
    def spatial(self) -> bool:
        """Whether its momentum is kept in spatial coefficient order (2-D blocks, top-k), not in
        chunk order (1-D blocks, or sent dense): :func:`momentum_shape`."""
        return len(self.layout.block) == 2 and not self.dense

    @property
    def momentum_shape(self) -> tuple[int, int]:
        """Its momentum's shape: spatial ``(batch * padded rows, padded cols)`` (``spatial``),
        else ``(n_chunks, chunk_numel)``."""
        if self.spatial:
            return spatial_shape(self.layout)
        return self.layout.n_chunks, self.layout.chunk_numel


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
    """Zeroed float32 momenta, one per plan (``plan.momentum_shape``), in plan order.

    A 2-D tensor sent top-k keeps its momentum in SPATIAL coefficient order (``plan.spatial``):
    the momentum update is then one product that scales and adds in place
    (``dct.dct_accumulate(..., spatial=True)``), and the compiled selection reads a chunk where it
    lies. Others keep chunk order ``(n_chunks, chunk_numel)`` (for 1-D blocks the two coincide).

    The momenta of one class (``_momentum_class``: chunk size, dense, device, and for spatial
    ones the padded column count) are consecutive views of one buffer, in plan order, so
    :func:`build_packet` selects a class's top-k straight from that buffer instead of stacking a
    copy of it every step (the Llama set: one 21 MB copy a step)."""
    by: dict[tuple[int, bool, torch.device, int], list[int]] = {}
    for i, (plan, p) in enumerate(zip(plans, params, strict=True)):
        by.setdefault(_momentum_class(plan, p.device), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(plans)
    for (_cn, _dense, dev, _cols), members in by.items():
        size = sum(plans[i].layout.n_coefficients for i in members)
        flat = torch.zeros(size, dtype=torch.float32, device=dev)
        at = 0
        for i in members:
            n = plans[i].layout.n_coefficients
            out[i] = flat[at : at + n].view(plans[i].momentum_shape)
            at += n
    return [m for m in out if m is not None]


def _momentum_class(plan: TensorPlan, device: torch.device) -> tuple[int, bool, torch.device, int]:
    return plan.layout.chunk_numel, plan.dense, device, plan.layout.padded[1] if plan.spatial else 0


def to_momentum(plan: TensorPlan, c: torch.Tensor) -> torch.Tensor:
    """Chunk-order coefficients ``(n_chunks, chunk_numel)`` in ``plan``'s momentum layout (a copy
    for a spatial one, else ``c`` itself)."""
    if not plan.spatial:
        return c
    return spatial_from_chunks(c, plan.layout).reshape(plan.momentum_shape)


def momentum_chunks(plan: TensorPlan, m: torch.Tensor) -> torch.Tensor:
    """``plan``'s momentum ``m`` in chunk order ``(n_chunks, chunk_numel)`` (a copy for a spatial
    one, else ``m`` itself): the inverse of :func:`to_momentum`."""
    if not plan.spatial:
        return m
    lay = plan.layout
    return chunks_from_spatial(m.view(lay.batch, *lay.padded), lay)


def feed_back(plan: TensorPlan, m: torch.Tensor, sent: SentTensor, sign: float) -> None:
    """``m[sent.idx] += sign * sent.val`` in place (``sign`` -1: what was sent leaves the momentum,
    exact error feedback; +1: it comes back when the packet did not count), chunk-order indices
    placed in ``plan``'s momentum layout."""
    if not plan.spatial:
        if sign < 0:
            m.scatter_(1, sent.idx, m.gather(1, sent.idx) - sent.val)
        else:
            m.scatter_add_(1, sent.idx, sent.val)
        return
    pos = spatial_index(sent.idx, plan.layout).reshape(-1)
    flat, val = m.view(-1), sent.val.reshape(-1)
    if sign < 0:
        flat.scatter_(0, pos, flat.gather(0, pos) - val)
    else:
        flat.scatter_add_(0, pos, val)


def feed_back_all(
    plans: Sequence[TensorPlan], momenta: Sequence[torch.Tensor], sent: Sequence[SentTensor], sign: float
) -> None:
    """:func:`feed_back` of every plan: the spatial momenta of one class (one buffer,
    :func:`momentum_buffers`) in one gather and one scatter over the whole buffer, the others
    (and momenta not in one buffer) tensor by tensor. The same values: every position is written
    once, ``m - val`` or ``m + val`` as :func:`feed_back` writes it; on the CPU once warm, one
    compiled pass a class (``coding_jit_sum.feed_back``). Tensor by tensor the spatial positions
    cost ~6 small tensor operations each (Llama set: 0.72-0.89 ms, against 0.32-0.39 for the
    chunk-order momenta before)."""
    by: dict[tuple[int, int, int], list[int]] = {}
    for i, plan in enumerate(plans):
        if plan.spatial:
            by.setdefault(
                (plan.layout.chunk_numel, int(sent[i].idx.shape[1]), plan.momentum_shape[1]), []
            ).append(i)
        else:
            feed_back(plan, momenta[i], sent[i], sign)
    for (_cn, _k, cols), members in by.items():
        view = _stacked([momenta[i] for i in members], cols)
        if (
            len(members) > 1
            and view.untyped_storage().data_ptr() != momenta[members[0]].untyped_storage().data_ptr()
        ):
            for i in members:  # not one buffer: a stacked copy would not reach the momenta
                feed_back(plans[i], momenta[i], sent[i], sign)
            continue
        (br, bc) = plans[members[0]].layout.block
        k = int(sent[members[0]].idx.shape[1])  # build_packet's are views of one class tensor
        idx, val = _stacked([sent[i].idx for i in members], k), _stacked([sent[i].val for i in members], k)
        if use_jit() and view.device.type == "cpu" and view.dtype == val.dtype == torch.float32:
            from distronet.kernels.coding_jit_sum import feed_back as compiled_feed_back

            compiled_feed_back(
                view.reshape(-1).numpy(),
                np.ascontiguousarray(idx.numpy(), dtype=np.int64),
                np.ascontiguousarray(val.numpy()),
                cols,
                br,
                bc,
                sign,
            )
            continue
        base, local = _class_tables(view.shape[0], cols, br, bc, view.device)
        pos = (base + local[idx]).reshape(-1)
        flat, v = view.reshape(-1), val.reshape(-1)
        if sign < 0:
            flat.scatter_(0, pos, flat.gather(0, pos) - v)
        else:
            flat.scatter_add_(0, pos, v)


@functools.lru_cache(maxsize=64)
def _class_tables(
    rows: int, cols: int, br: int, bc: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Spatial positions in a ``(rows, cols)`` buffer of ``br x bc`` blocks: (each chunk's first,
    ``(n, 1)``, chunk order = block row after block row; each coefficient's offset, ``(br * bc,)``)."""
    gc = cols // bc
    n = torch.arange(rows // br * gc, device=device)
    i = torch.arange(br * bc, device=device)
    return ((n // gc) * (br * cols) + (n % gc) * bc).unsqueeze(1), (i // bc) * cols + i % bc


def _stacked(ms: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """``torch.cat`` of the ``(n_i, width)`` tensors ``ms`` along rows, or a view of them where they
    already lie one after another in one storage (:func:`momentum_buffers`)."""
    if len(ms) == 1:
        return ms[0].reshape(-1, width)
    first = ms[0]
    at = first.storage_offset()
    for m in ms:
        if (
            not m.is_contiguous()
            or m.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or m.storage_offset() != at
        ):
            return torch.cat([m.reshape(-1, width) for m in ms])
        at += m.numel()
    return first.as_strided((sum(m.numel() for m in ms) // width, width), (width, 1))


def _select_class(
    c: torch.Tensor, block: tuple[int, ...], spatial: bool, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of every chunk of a class's stacked momenta ``c``: chunk order ``(N, cn)``, or
    spatial ``(rows, cols)`` (blocks ``block``, tensors stacked along rows, so its chunks in
    order are the members' chunks, member after member)."""
    if not spatial:
        return topk_chunks(c, k)
    (br, bc), (rows, cols) = block, c.shape
    y5 = c.view(1, rows // br, br, cols // bc, bc)
    fast = select_compiled(y5, k)
    if fast is not None:
        return fast
    n = rows // br * (cols // bc)
    return topk_chunks(y5.permute(0, 1, 3, 2, 4).reshape(n, br * bc), k)


def build_packet(
    plans: Sequence[TensorPlan],
    momenta: Sequence[torch.Tensor],
    cfg: DistroConfig,
    step: int,
    identity: Identity,
    digest: bytes,
) -> tuple[bytes, list[SentTensor]]:
    """Extract, code and seal this peer's packet for ``step``.

    ``momenta[i]`` is plan i's coefficient-space momentum in its layout (``plan.momentum_shape``:
    spatial for 2-D tensors sent top-k, chunk order else; :func:`to_momentum` converts chunk-order
    coefficients); it is not modified. Returns the sealed frame and, per tensor, what was sent
    (dequantised).

    Batched across tensors: the momenta of every tensor of one ``(chunk_numel, k, dense, padded
    cols)`` class are stacked (a view where they share a buffer, else one copy), so one top-k and
    one coding pass (``coding_batch.encode_groups``) serve them all; the bytes are those of coding
    tensor by tensor (``encode_tensor`` +
    ``encode_payload``), and ``test_optim_packets`` holds the two equal.
    """
    ex, k_now = cfg.extraction, cfg.extraction.k_at(step)
    by_class: dict[tuple[int, int, bool, int], list[int]] = {}
    for i, plan in enumerate(plans):
        if tuple(momenta[i].shape) != plan.momentum_shape:
            got = tuple(momenta[i].shape)
            raise ValueError(f"momentum {i} has shape {got}, its plan {plan.momentum_shape}")
        cols = plan.momentum_shape[1] if plan.spatial else 0
        by_class.setdefault((plan.layout.chunk_numel, plan.k(k_now), plan.dense, cols), []).append(i)
    groups: list[CodingGroup] = []
    picked: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []
    for (cn, k, dense, cols), members in by_class.items():
        ms = [momenta[i] for i in members]
        c = _stacked(ms, cols or cn)
        if dense:
            idx = torch.arange(k, dtype=torch.int64, device=c.device).expand(c.shape[0], k)
            val = c
        else:
            idx, val = _select_class(c, plans[members[0]].layout.block, cols > 0, k)
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
