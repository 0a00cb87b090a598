"""Catching up with the swarm: the node's parameters as a state blob, offered to and fetched from peers.

Every node offers its state through ``statesync.StateDonor.serve_from`` (the step in the blob is
the next step to run): only when a peer asks for it is the state copied into a blob at the next
step boundary, hashed and signed (once per step, however many peers ask). A newcomer —
or a replica whose round failed and that can no longer be sure it is bit-identical — fetches the
newest state that several donors agree on (``statesync.fetch_state``: verified chunks, spread over
donors), loads it, and continues from that step with zero momentum (ARCHITECTURE.md §5). Its next
packets are for rounds the others may already have decided; the exchange hands it those decided
rounds, so it applies exactly the updates the others applied and catches up while the rounds are
retained.

Blob format (deterministic, so equal states give equal root hashes on every donor)::

    b"DNB1" | u32 header length | header JSON {"step", "tensors": [[name, shape, nbytes], ...],
    "ints": {"<param>#<key>": int}, "guard": {...}} | the float32 bytes of each tensor, in order

``tensors`` lists every parameter first (model order), then replicated optimizer state as
``"<param>#<key>"`` (same shape as the parameter). ``guard`` (present when the optimizer keeps a
``verify.Guard``) is the guard's replicated history, ``guard_state.guard_state``'s document: the
flags, cosines, neutralised peers, copy window and held credit that decide the next rounds.

Everything read is checked against the model and the optimizer before anything is copied
(:func:`load_state_blob`): every parameter present once, in model order, and nothing else; each
optimizer entry a known key of the right kind (``TENSOR_STATE`` a tensor of the parameter's
shape, ``INT_STATE`` a bounded integer), each one the fresh optimizer already holds present;
every value finite; the guard's history present when the optimizer keeps a guard, and within its
bounds (``guard_state.load_guard_state``; ignored when the optimizer keeps none). A blob that
breaks a rule is refused whole (``StateRefused``).

Versions: the magic names the format. ``DNS0`` (until the guard's history travelled) had no
``guard``; this node refuses such a blob with a ``StateRefused`` that names it (a guard started
clean would sum peers the swarm has neutralised), and a ``DNS0`` node refuses a ``DNB1`` blob as
of a bad magic. Either way nothing is loaded and the fetcher retries later: a swarm adopts state
only among nodes of one format, so upgrade its nodes together. (Not ``DNS1``/``DNS2``: those are the
state-manifest asks, ``protocol/state.py``.)
"""

from __future__ import annotations

import json
import struct
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from distronet.node.catchup.errors import StateRefused
from distronet.node.catchup.guard_state import guard_state, load_guard_state
from distronet.node.optim.verify import Guard

__all__ = [
    "INT_STATE",
    "LOCAL_STATE",
    "MAGIC",
    "TENSOR_STATE",
    "StateRefused",
    "load_state_blob",
    "state_blob",
]

MAGIC = b"DNB1"
OLD_MAGIC = b"DNS0"
MAX_HEADER = 1 << 25
"""The header's byte limit (32 MiB): the tensor list is small, the guard's history grows with
the peers a run has seen (~300 bytes each) and the rounds held (~80 bytes per peer each)."""
HEADER_KEYS = frozenset({"step", "tensors", "ints", "guard"})
LOCAL_STATE = frozenset({"momentum"})
"""Optimizer state keys that are this replica's own (error-feedback momentum): never shared.
Every other per-parameter state (the Adam rule's ``v`` and ``n``, the overlap ``consensus``) is
derived from aggregated updates only, identical on every replica, and travels in the blob."""
TENSOR_STATE = frozenset({"consensus", "outer", "u_ema", "v"})
"""The replicated per-parameter tensors ``DistroOptimizer`` keeps (``node/optim/distro.py``)."""
INT_STATE = frozenset({"n"})
"""Its replicated per-parameter integers (the Adam rule's update count)."""
MAX_INT_STATE = 2**53


def _f32(t: torch.Tensor) -> bytes:
    return t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()


def _layout(
    model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[list[list[object]], list[torch.Tensor], dict[str, int]]:
    """The blob's tensor entries ``[name, shape, nbytes]``, the tensors in that order, the ints."""
    names: list[list[object]] = []
    tensors: list[torch.Tensor] = []
    ints: dict[str, int] = {}
    for name, p in model.named_parameters():
        names.append([name, list(p.shape), p.numel() * 4])
        tensors.append(p)
    if optimizer is not None:
        for name, p in model.named_parameters():
            for key, value in sorted(optimizer.state.get(p, {}).items()):
                if key in LOCAL_STATE:
                    continue
                if isinstance(value, torch.Tensor) and value.shape == p.shape and key in TENSOR_STATE:
                    names.append([f"{name}#{key}", list(p.shape), p.numel() * 4])
                    tensors.append(value)
                elif isinstance(value, int) and key in INT_STATE:
                    ints[f"{name}#{key}"] = value
    return names, tensors, ints


def _guard(optimizer: torch.optim.Optimizer | None) -> Guard | None:
    guard = getattr(optimizer, "guard", None)
    return guard if isinstance(guard, Guard) else None


def _head(step: int, names: list[list[object]], ints: dict[str, int], guard: Guard | None) -> bytes:
    head: dict[str, object] = {"step": step, "tensors": names, "ints": ints}
    if guard is not None:
        head["guard"] = guard_state(guard)
    header = json.dumps(head, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", len(header)) + header


def state_blob(step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> bytes:
    """The parameters of ``model`` (and the replicated optimizer state, the guard's history
    included) at ``step``, float32 little-endian. Costs one copy of them."""
    names, tensors, ints = _layout(model, optimizer)
    return _head(step, names, ints, _guard(optimizer)) + b"".join(_f32(t) for t in tensors)


class _Header(NamedTuple):
    end: int  # where the tensor bytes start
    step: int
    entries: list[object]
    ints: dict[str, object]
    guard: object  # the guard's history, unchecked (None when absent)


def _header(blob: bytes) -> _Header:
    """The header, its fields' types checked (not the guard's history). Raises StateRefused."""
    if blob[:4] == OLD_MAGIC:
        raise StateRefused(
            "state blob: format DNS0, of an older node (no guard history); this node reads DNB1 only"
        )
    if len(blob) < 8 or blob[:4] != MAGIC:
        raise StateRefused("state blob: bad magic")
    (n,) = struct.unpack(">I", blob[4:8])
    if n > MAX_HEADER or 8 + n > len(blob):
        raise StateRefused(f"state blob: header of {n} bytes does not fit")
    try:
        head = json.loads(blob[8 : 8 + n])
        step, entries, ints = head["step"], list(head["tensors"]), dict(head.get("ints", {}))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StateRefused(f"state blob: bad header ({e})") from e
    if not isinstance(head, dict) or head.keys() - HEADER_KEYS:
        raise StateRefused("state blob: unknown header fields")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_INT_STATE:
        raise StateRefused(f"state blob: bad step {step!r}")
    return _Header(8 + n, step, entries, ints, head.get("guard"))


def _arrays(
    blob: bytes, off: int, entries: list[object], params: dict[str, nn.Parameter]
) -> list[tuple[nn.Parameter, str, np.ndarray]]:
    """Each entry's parameter, key and float32 view, checked; raises StateRefused."""
    arrays, seen = [], set()
    for i, entry in enumerate(entries):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
            raise StateRefused(f"state blob: bad entry {str(entry)[:80]}")
        name, _, key = entry[0].partition("#")
        p = params.get(name)
        ok_key = key == "" if i < len(params) else key in TENSOR_STATE
        if p is None or not ok_key or entry[0] in seen:
            raise StateRefused(f"state blob: unexpected tensor {entry[0][:80]!r}")
        seen.add(entry[0])
        if entry[1:] != [list(p.shape), p.numel() * 4] or off + p.numel() * 4 > len(blob):
            raise StateRefused(f"state blob: {entry[0]!r} does not match parameter {name} {tuple(p.shape)}")
        a = np.frombuffer(blob, dtype="<f4", count=p.numel(), offset=off).reshape(p.shape)
        if not np.isfinite(a).all():
            raise StateRefused(f"state blob: {entry[0]!r} holds NaN or infinite values")
        arrays.append((p, key, a))
        off += p.numel() * 4
    if off != len(blob):
        raise StateRefused(f"state blob: {len(blob) - off} trailing bytes")
    return arrays


def _check_ints(ints: dict[str, object], params: dict[str, nn.Parameter], tensors: set[str]) -> None:
    for k, v in ints.items():
        name, _, key = k.partition("#")
        bad_value = not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_INT_STATE
        if name not in params or key not in INT_STATE or k in tensors or bad_value:
            raise StateRefused(f"state blob: bad integer state {k[:80]!r}")


def _check_expected(
    optimizer: torch.optim.Optimizer | None, params: dict[str, nn.Parameter], present: set[str]
) -> None:
    """Every replicated entry the (fresh) optimizer already holds must come with the blob."""
    if optimizer is None:
        return
    for name, p in params.items():
        for key in optimizer.state.get(p, {}):
            if key not in LOCAL_STATE and f"{name}#{key}" not in present:
                raise StateRefused(f"state blob: optimizer state {name}#{key} missing")


def _load_guard(optimizer: torch.optim.Optimizer | None, doc: object, step: int) -> None:
    """The blob's guard history into the optimizer's guard, if it keeps one; checked whole before
    it replaces anything. Raises StateRefused."""
    guard = _guard(optimizer)
    if guard is None:
        return
    if doc is None:
        raise StateRefused(f"state blob at step {step}: no guard history, and this optimizer keeps one")
    try:
        load_guard_state(guard, doc, max_step=step)
    except StateRefused as e:
        raise StateRefused(f"state blob at step {step}: {e}") from e


def load_state_blob(blob: bytes, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Copy the blob's parameters into ``model`` (its replicated optimizer state into
    ``optimizer.state``, its guard history into ``optimizer.guard``); return the blob's step.

    Raises ``StateRefused`` (a ``ConfigError``) when the blob is malformed, holds a value that is
    not finite, or does not fit ``model`` and ``optimizer`` exactly (module doc); nothing is
    copied then. Cost: one pass over the blob (the finiteness check) before the copy.
    """
    off, step, entries, ints, guard_doc = _header(blob)
    params = dict(model.named_parameters())
    if len(entries) < len(params) or len(entries) > (1 + len(TENSOR_STATE)) * len(params):
        raise StateRefused(f"state blob: {len(entries)} tensors at step {step}, the model has {len(params)}")
    arrays = _arrays(blob, off, entries, params)
    if [e[0] for e in entries[: len(params)]] != list(params):  # type: ignore[index]
        raise StateRefused("state blob: parameters out of order")
    tensors = {str(e[0]) for e in entries[len(params) :]}  # type: ignore[index]
    _check_ints(ints, params, tensors)
    _check_expected(optimizer, params, tensors | set(ints))
    _load_guard(optimizer, guard_doc, step)  # the last check: it replaces the guard's history
    with torch.no_grad():
        for p, key, a in arrays:
            t = torch.from_numpy(a.astype(np.float32)).to(p.device)
            if key:
                if optimizer is not None:
                    optimizer.state[p][key] = t.to(torch.float32)
            else:
                p.copy_(t.to(p.dtype))
        if optimizer is not None:
            for k, v in ints.items():
                name, _, key = k.partition("#")
                optimizer.state[params[name]][key] = v
    return step
