"""Local checkpoints for restart/resume: ``torch.save`` of tensors and plain values only.

A checkpoint holds the step it was taken *after* (the next step to run), the model's
``state_dict``, the optimizer's ``state_dict``, the guard's replicated history
(``catchup/guard_state.py``'s document: plain lists, strings and numbers) and the run id plus the
parameter digest. It is written to a temporary file and renamed, so a crash mid-write leaves the
previous one intact. Loading uses ``torch.load(weights_only=True)``: a file can hold no code.
A checkpoint written before the guard's history was kept has no ``guard`` (None): it still
loads, with a clean history (``training.build_training`` says so in the log).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch

from distronet.protocol.errors import DistroError

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT = 1


class CheckpointError(DistroError):
    """A checkpoint file is unreadable or belongs to another run or model."""


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
    """Write ``ckpt`` atomically (temp file, fsync, rename). Costs one copy of the state on disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    doc = {"format": FORMAT, **dataclasses.asdict(ckpt)}
    with open(tmp, "wb") as fh:
        torch.save(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, *, run_id: str) -> Checkpoint | None:
    """The checkpoint at ``path``, or None when there is none.

    Raises ``CheckpointError`` when the file is unreadable, of another format or of another run.
    """
    if not path.exists():
        return None
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many kinds for a corrupt file
        raise CheckpointError(f"checkpoint {path} is unreadable ({e}); delete it to start fresh") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has an unknown format; delete it to start fresh")
    if doc.get("run_id") != run_id:
        raise CheckpointError(
            f"checkpoint {path} belongs to run {doc.get('run_id')!r}, not {run_id!r}; use another --data-dir"
        )
    step = doc.get("step")
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint {path}: bad step {step!r}")
    guard = doc.get("guard")
    if guard is not None and not isinstance(guard, dict):
        raise CheckpointError(f"checkpoint {path}: bad guard history; delete it to start fresh")
    return Checkpoint(run_id, step, str(doc.get("digest", "")), doc["model"], doc["optimizer"], guard)
