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

Blob format (deterministic, so equal parameters give equal root hashes on every donor)::

    b"DNS0" | u32 header length | header JSON {"step", "tensors": [[name, shape, nbytes], ...],
    "ints": {"<param>#<key>": int}} | the float32 bytes of each tensor, in order

``tensors`` lists every parameter first (model order), then replicated optimizer state as
``"<param>#<key>"`` (same shape as the parameter).

Everything read is checked against the model before use: names, shapes and sizes must match.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch
from torch import nn

from distronet.protocol.errors import ConfigError

__all__ = ["LOCAL_STATE", "MAGIC", "load_state_blob", "state_blob"]

MAGIC = b"DNS0"
MAX_HEADER = 1 << 20
LOCAL_STATE = frozenset({"momentum"})
"""Optimizer state keys that are this replica's own (error-feedback momentum): never shared.
Every other per-parameter state (the Adam rule's ``v`` and ``n``, the overlap ``consensus``) is
derived from aggregated updates only, identical on every replica, and travels in the blob."""


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
                if isinstance(value, torch.Tensor) and value.shape == p.shape:
                    names.append([f"{name}#{key}", list(p.shape), p.numel() * 4])
                    tensors.append(value)
                elif isinstance(value, int):
                    ints[f"{name}#{key}"] = value
    return names, tensors, ints


def _head(step: int, names: list[list[object]], ints: dict[str, int]) -> bytes:
    header = json.dumps({"step": step, "tensors": names, "ints": ints}, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", len(header)) + header


def state_blob(step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> bytes:
    """The parameters of ``model`` (and the replicated optimizer state) at ``step``, float32
    little-endian. Costs one copy of them."""
    names, tensors, ints = _layout(model, optimizer)
    return _head(step, names, ints) + b"".join(_f32(t) for t in tensors)


def load_state_blob(blob: bytes, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Copy the blob's parameters into ``model`` (and its replicated optimizer state into
    ``optimizer.state``); return the blob's step.

    Raises ``ConfigError`` when the blob is malformed or does not fit ``model`` exactly (nothing
    is copied then).
    """
    if len(blob) < 8 or blob[:4] != MAGIC:
        raise ConfigError("state blob: bad magic")
    (n,) = struct.unpack(">I", blob[4:8])
    if n > MAX_HEADER or 8 + n > len(blob):
        raise ConfigError(f"state blob: header of {n} bytes does not fit")
    try:
        head = json.loads(blob[8 : 8 + n])
        step, entries, ints = int(head["step"]), list(head["tensors"]), dict(head.get("ints", {}))
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"state blob: bad header ({e})") from e
    params = dict(model.named_parameters())
    if step < 0 or len(entries) < len(params) or len(entries) > 8 * len(params):
        raise ConfigError(f"state blob: {len(entries)} tensors at step {step}, the model has {len(params)}")
    off, arrays = 8 + n, []
    for i, entry in enumerate(entries):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
            raise ConfigError(f"state blob: bad entry {entry!r}")
        name, _, key = entry[0].partition("#")
        p = params.get(name)
        if p is None or (i < len(params)) != (key == "") or key in LOCAL_STATE:
            raise ConfigError(f"state blob: unexpected tensor {entry[0]!r}")
        if entry[1:] != [list(p.shape), p.numel() * 4] or off + p.numel() * 4 > len(blob):
            raise ConfigError(f"state blob: {entry!r} does not match parameter {name} {tuple(p.shape)}")
        arrays.append(
            (p, key, np.frombuffer(blob, dtype="<f4", count=p.numel(), offset=off).reshape(p.shape))
        )
        off += p.numel() * 4
    if off != len(blob):
        raise ConfigError(f"state blob: {len(blob) - off} trailing bytes")
    if [e[0] for e in entries[: len(params)]] != list(params):
        raise ConfigError("state blob: parameters out of order")
    for k, v in ints.items():
        if k.partition("#")[0] not in params or not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"state blob: bad integer state {k!r}")
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
