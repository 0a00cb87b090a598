"""Catching up with the swarm: the node's parameters as a state blob, offered to and fetched from peers.

Every node offers its parameters after each step through ``statesync.StateDonor`` (the step in
the blob is the next step to run). A newcomer — or a replica whose round failed and that can no
longer be sure it is bit-identical — fetches the newest state that several donors agree on
(``statesync.fetch_state``: verified chunks, spread over donors), loads it, and continues from
that step with zero momentum (ARCHITECTURE.md §5). Its next packets are for rounds the others
may already have decided; the exchange hands it those decided rounds, so it applies exactly the
updates the others applied and catches up while the rounds are retained.

Blob format (deterministic, so equal parameters give equal root hashes on every donor)::

    b"DNS0" | u32 header length | header JSON {"step", "tensors": [[name, shape, nbytes], ...]}
    | the float32 bytes of each tensor, in order

Everything read is checked against the model before use: names, shapes and sizes must match.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import torch
from torch import nn

from distronet.protocol.errors import ConfigError

__all__ = ["MAGIC", "load_state_blob", "state_blob"]

MAGIC = b"DNS0"
MAX_HEADER = 1 << 20


def state_blob(step: int, model: nn.Module) -> bytes:
    """The parameters of ``model`` at ``step`` (float32, little-endian). Costs one copy of them."""
    names, parts = [], []
    for name, p in model.named_parameters():
        raw = p.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()
        names.append([name, list(p.shape), len(raw)])
        parts.append(raw)
    header = json.dumps({"step": step, "tensors": names}, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", len(header)) + header + b"".join(parts)


def load_state_blob(blob: bytes, model: nn.Module) -> int:
    """Copy the blob's parameters into ``model``; return the blob's step.

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
        step, entries = int(head["step"]), list(head["tensors"])
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"state blob: bad header ({e})") from e
    params = list(model.named_parameters())
    if len(entries) != len(params) or step < 0:
        raise ConfigError(f"state blob: {len(entries)} tensors at step {step}, the model has {len(params)}")
    off, arrays = 8 + n, []
    for (name, p), entry in zip(params, entries, strict=True):
        if entry != [name, list(p.shape), p.numel() * 4]:
            raise ConfigError(f"state blob: {entry!r} does not match parameter {name} {tuple(p.shape)}")
        size = p.numel() * 4
        if off + size > len(blob):
            raise ConfigError("state blob: truncated")
        arrays.append(np.frombuffer(blob, dtype="<f4", count=p.numel(), offset=off).reshape(p.shape))
        off += size
    if off != len(blob):
        raise ConfigError(f"state blob: {len(blob) - off} trailing bytes")
    with torch.no_grad():
        for (_, p), a in zip(params, arrays, strict=True):
            p.copy_(torch.from_numpy(a.astype(np.float32)).to(p.device, p.dtype))
    return step
