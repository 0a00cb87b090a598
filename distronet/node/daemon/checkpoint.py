"""Local checkpoints for restart/resume: one safetensors file, tensors plus a JSON document.

A checkpoint holds the step it was taken *after* (the next step to run), the model's
``state_dict``, the optimizer's ``state_dict``, the guard's replicated history
(``catchup/guard_state.py``'s document: plain lists, strings and numbers) and the run id plus the
parameter digest. Format 2 (``FORMAT``)::

    checkpoint.safetensors
      tensors   "model/<parameter or buffer name>"   each model tensor, stored once (a tied
                                                      weight is one tensor and an alias)
                "optim/<path>"                         each tensor of the optimizer's state_dict
      metadata  "distro.checkpoint": JSON {"format": 2, "run_id", "step", "digest",
                "model": [names in state_dict order], "aliases": {name: stored name},
                "optimizer": the state_dict as a JSON tree, "guard": {...} or null}

The optimizer tree keeps what JSON cannot say on its own: a tensor is ``{"$t": "optim/<path>"}``,
a dict ``{"$dict": [[key, value], ...]}`` (keys int or str, in order), a tuple ``{"$tuple": [...]}``
and a float that is not finite ``{"$f": "inf" | "-inf" | "nan"}``; anything else (an object, bytes)
cannot be checkpointed (``CheckpointError`` at save). Nothing in the file is executed: reading it
is the safetensors parser (a bounded JSON header, then raw little-endian bytes) and ``json``.

Reading checks what it reads: the format, the run, a non-negative step; every tensor the
document names present, every stored tensor named, aliases to stored model tensors, the tree
at most ``MAX_DEPTH`` deep with only the shapes above. A file that breaks a rule, or one written
by an older node in torch's pickle-based format (format 1: ``torch.save``, a zip), is refused with
a ``CheckpointError`` that says to delete it: the node then starts from the run's seeded weights
and catches up with the swarm. A checkpoint is written to a temporary file, fsynced and renamed,
so a crash mid-write leaves the previous one intact. A checkpoint written before the guard's
history was kept has no ``guard`` (None): it still loads, with a clean history
(``training.build_training`` says so in the log).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from distronet.protocol.errors import DistroError

__all__ = ["FORMAT", "MAX_DEPTH", "Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT = 2
META_KEY = "distro.checkpoint"
MAX_DEPTH = 32  # nesting of the optimizer's state_dict (torch's is 4 deep)
_ZIP = b"PK\x03\x04"  # how a torch.save file (format 1) begins
_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class CheckpointError(DistroError):
    """A checkpoint file is unreadable, of another format, or belongs to another run or model."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """``step`` is the next step to run; ``digest`` the parameter hash at that point; ``guard``
    the guard's history (``guard_state.guard_state``), None in an older checkpoint."""

    run_id: str
    step: int
    digest: str
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    guard: dict[str, Any] | None = None


def save_checkpoint(path: Path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` atomically (temp file, fsync, rename). Costs one copy of the state on disk
    (plus a copy in memory of any tensor that is not contiguous or is a view of another).

    Raises ``CheckpointError`` for optimizer state that is not tensors, numbers, strings, None,
    lists, tuples and dicts with int or str keys."""
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple[Any, ...], str] = {}
    aliases: dict[str, str] = {}
    storages: set[int] = set()
    for name, t in ckpt.model.items():
        key = _view_key(t)
        if key in seen:  # a tied weight: stored once
            aliases[name] = seen[key][len("model/") :]
            continue
        seen[key] = f"model/{name}"
        tensors[f"model/{name}"] = _own(t, storages)
    doc = {
        "format": FORMAT,
        "run_id": ckpt.run_id,
        "step": ckpt.step,
        "digest": ckpt.digest,
        "model": list(ckpt.model),
        "aliases": aliases,
        "optimizer": _encode(ckpt.optimizer, "optim", tensors, storages, 0),
        "guard": ckpt.guard,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(doc, allow_nan=False)})
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_checkpoint(path: Path, *, run_id: str) -> Checkpoint | None:
    """The checkpoint at ``path``, or None when there is none.

    Raises ``CheckpointError`` when the file is unreadable, of another format (an older node's
    torch file included) or of another run, or breaks a rule of the module doc.
    """
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_ZIP))
        if head == _ZIP:
            raise CheckpointError(
                f"checkpoint {path} is in an older node's torch format (format 1), which this node "
                "does not read (no torch.load); delete it: the node then catches up with the swarm"
            )
        with safe_open(str(path), framework="pt", device="cpu") as f:  # type: ignore[no-untyped-call]
            meta = f.metadata() or {}
            stored = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118  (safe_open has no __iter__)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} is unreadable ({e}); delete it to start fresh") from e
    try:
        doc = json.loads(meta[META_KEY])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} has no readable document; delete it to start fresh") from e
    return _checkpoint(path, doc, stored, run_id)


def _checkpoint(path: Path, doc: object, stored: dict[str, torch.Tensor], run_id: str) -> Checkpoint:
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: {what}; delete it to start fresh")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise bad(f"unknown format {got!r} (this node reads {FORMAT})")
    if doc.get("run_id") != run_id:
        raise CheckpointError(
            f"checkpoint {path} belongs to run {doc.get('run_id')!r}, not {run_id!r}; use another --data-dir"
        )
    step, digest, guard = doc.get("step"), doc.get("digest"), doc.get("guard")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise bad(f"bad step {step!r}")
    if not isinstance(digest, str):
        raise bad("bad digest")
    if guard is not None and not isinstance(guard, dict):
        raise bad("bad guard history")
    names, aliases = doc.get("model"), doc.get("aliases")
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise bad("bad list of model tensors")
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise bad("bad aliases")
    used: set[str] = set()
    model: dict[str, torch.Tensor] = {}
    for name in names:
        key = f"model/{aliases.get(name, name)}"
        if key not in stored or (name in aliases and aliases[name] in aliases):
            raise bad(f"model tensor {name!r} is missing")
        model[name] = stored[key]
        used.add(key)
    if set(aliases) - set(names):
        raise bad("an alias names no model tensor")
    optimizer = _decode(doc.get("optimizer"), stored, used, 0, bad)
    if not isinstance(optimizer, dict):
        raise bad("the optimizer state is not a dict")
    if set(stored) - used:
        raise bad(f"{len(set(stored) - used)} stored tensor(s) that the document does not name")
    return Checkpoint(run_id, step, digest, model, optimizer, guard)


def _view_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What makes two state_dict entries the same tensor (a tied weight)."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _own(t: torch.Tensor, storages: set[int]) -> torch.Tensor:
    """``t`` on the CPU, contiguous and sharing no storage with a tensor already kept (safetensors
    stores each tensor's bytes once and refuses shared ones): a copy only where needed."""
    t = t.detach().cpu()
    ptr = t.untyped_storage().data_ptr()
    if (
        not t.is_contiguous()
        or ptr in storages
        or t.numel() != t.untyped_storage().nbytes() // t.element_size()
    ):
        t = t.contiguous().clone()
        ptr = t.untyped_storage().data_ptr()
    storages.add(ptr)
    return t


def _encode(x: object, path: str, tensors: dict[str, torch.Tensor], storages: set[int], depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise CheckpointError(f"optimizer state nested deeper than {MAX_DEPTH} at {path}")
    if isinstance(x, torch.Tensor):
        tensors[path] = _own(x, storages)
        return {"$t": path}
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"$f": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
    if isinstance(x, (list, tuple)):
        items = [_encode(v, f"{path}/{i}", tensors, storages, depth + 1) for i, v in enumerate(x)]
        return {"$tuple": items} if isinstance(x, tuple) else items
    if isinstance(x, dict):
        pairs = []
        for k, v in x.items():
            if isinstance(k, bool) or not isinstance(k, (int, str)):
                raise CheckpointError(f"optimizer state has a key {k!r} at {path} (int or str only)")
            pairs.append([k, _encode(v, f"{path}/{k}", tensors, storages, depth + 1)])
        return {"$dict": pairs}
    raise CheckpointError(
        f"optimizer state holds a {type(x).__name__} at {path}, which a checkpoint cannot keep"
    )


def _decode(x: object, stored: dict[str, torch.Tensor], used: set[str], depth: int, bad: Any) -> Any:
    if depth > MAX_DEPTH:
        raise bad(f"optimizer state nested deeper than {MAX_DEPTH}")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [_decode(v, stored, used, depth + 1, bad) for v in x]
    if not isinstance(x, dict) or len(x) != 1:
        raise bad("malformed optimizer state")
    ((tag, value),) = x.items()
    if tag == "$t":
        if (
            not isinstance(value, str)
            or not value.startswith("optim/")
            or value not in stored
            or value in used
        ):
            raise bad(f"optimizer tensor {value!r} is missing")
        used.add(value)
        return stored[value]
    if tag == "$f" and value in _FLOATS:
        return _FLOATS[value]
    if tag == "$tuple" and isinstance(value, list):
        return tuple(_decode(v, stored, used, depth + 1, bad) for v in value)
    if tag == "$dict" and isinstance(value, list):
        out: dict[Any, Any] = {}
        for pair in value:
            if not isinstance(pair, list) or len(pair) != 2 or isinstance(pair[0], bool):
                raise bad("malformed optimizer state")
            if not isinstance(pair[0], (int, str)) or pair[0] in out:
                raise bad("malformed optimizer state")
            out[pair[0]] = _decode(pair[1], stored, used, depth + 1, bad)
        return out
    raise bad("malformed optimizer state")
