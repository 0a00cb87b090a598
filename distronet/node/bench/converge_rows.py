"""The rows of ``distro-node bench converge``: which optimizers run, their lr grids and defaults.

A row is a named optimizer configuration. ``adamw`` is the baseline (AdamW with a dense,
exact all-reduce of the gradients); the others are ``DistroOptimizer`` presets (owned by
``distronet.node.optim.config``) run over the in-memory exchange. Adding a row is one entry
in ``ROWS``. Every row gets the same sweep budget (``len(lr_grid)`` runs, equal for all rows).

The learning rate of a row defaults to the winner recorded by the last ``--sweep`` in
``converge_defaults.json`` beside this module (committed), else to ``fallback_lr``. Those
defaults are chosen on the built-in GPT and used unchanged for ``--model llama``: a ``--sweep``
there tries ``LLAMA_GRID_FACTORS`` times each row's default and records the grid under the
document's ``"llama"`` key (its own setting, grid and winners), never as a default, so the
table of ``--model llama`` is what the GPT's settings give on another model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distronet.protocol.errors import ConfigError

__all__ = [
    "DEFAULTS_PATH",
    "DEFAULT_ROWS",
    "LLAMA_GRID_FACTORS",
    "ROWS",
    "RowSpec",
    "default_lrs",
    "read_defaults",
    "resolve_rows",
    "sweep_grid",
    "write_defaults",
]

DEFAULTS_PATH = Path(__file__).with_name("converge_defaults.json")


@dataclass(frozen=True)
class RowSpec:
    """One optimizer configuration of the benchmark.

    ``kind`` is ``"adamw"`` or ``"distro"``; ``preset`` names the ``DistroConfig`` preset of a
    distro row. ``lr_grid`` is what ``--sweep`` tries (same length for every row).
    """

    name: str
    kind: str
    summary: str
    lr_grid: tuple[float, ...]
    fallback_lr: float
    preset: str | None = None


_SIGN_GRID = (5e-4, 1e-3, 2e-3, 4e-3)
_OURS_GRID = (1e-3, 2e-3, 4e-3, 8e-3)  # 600-step study: ours improved up to the old grid's edge

ROWS: dict[str, RowSpec] = {
    spec.name: spec
    for spec in (
        RowSpec("adamw", "adamw", "AdamW, dense fp32 all-reduce (baseline)", (1e-3, 2e-3, 4e-3, 8e-3), 4e-3),
        RowSpec(
            "demo-ref",
            "distro",
            "DeMo reference: b=0.999 k=32 fp32, sign",
            _SIGN_GRID,
            1e-3,
            "demo_reference",
        ),
        RowSpec("psyche", "distro", "Psyche: b=0.995 k=4 1-bit, sign", _SIGN_GRID, 1e-3, "psyche"),
        RowSpec("ours-k32", "distro", "ours, k=32", _OURS_GRID, 2e-3, "ours_k32"),
        RowSpec("ours-k4-1bit", "distro", "ours, k=4, 1-bit values", _OURS_GRID, 4e-3, "ours_k4_1bit"),
    )
}
DEFAULT_ROWS: tuple[str, ...] = ("adamw", "demo-ref", "ours-k32", "ours-k4-1bit")
LLAMA_GRID_FACTORS: tuple[float, ...] = (0.5, 1.0, 2.0)
"""``--model llama --sweep``: each row's default lr times these (the same budget for every row)."""


def sweep_grid(spec: RowSpec, model: str, default_lr: float) -> tuple[float, ...]:
    """The lrs ``--sweep`` tries for ``spec``: its ``lr_grid`` on the GPT, ``LLAMA_GRID_FACTORS``
    times ``default_lr`` (the GPT's winner) on the Llama."""
    if model == "gpt":
        return spec.lr_grid
    return tuple(float(f"{default_lr * f:.6g}") for f in LLAMA_GRID_FACTORS)


def resolve_rows(names: list[str] | None) -> list[RowSpec]:
    """The rows named (default ``DEFAULT_ROWS``), in the order given; ``ConfigError`` on an unknown one."""
    chosen = list(names) if names else list(DEFAULT_ROWS)
    unknown = [n for n in chosen if n not in ROWS]
    if unknown:
        raise ConfigError(f"unknown benchmark config(s) {', '.join(unknown)}; known: {', '.join(ROWS)}")
    return [ROWS[n] for n in chosen]


def read_defaults(path: Path = DEFAULTS_PATH) -> dict[str, Any]:
    """The recorded sweep document, or ``{}`` when none was recorded (or it is unreadable)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def default_lrs(path: Path = DEFAULTS_PATH) -> dict[str, float]:
    """Learning rate per row: the recorded sweep winner where there is one, else the fallback."""
    lrs = {name: spec.fallback_lr for name, spec in ROWS.items()}
    recorded = read_defaults(path).get("lr", {})
    if isinstance(recorded, dict):
        for name, lr in recorded.items():
            if name in lrs and isinstance(lr, (int, float)) and lr > 0:
                lrs[name] = float(lr)
    return lrs


def write_defaults(
    winners: dict[str, float],
    table: dict[str, dict[str, float]],
    setting: dict[str, Any],
    path: Path = DEFAULTS_PATH,
    model: str = "gpt",
) -> None:
    """Record sweep winners (merged over earlier ones) with the full grid results and the setting.

    ``model`` "gpt": the winners become the rows' defaults; else the sweep goes under
    ``doc[model]`` (``setting``, ``winner``, ``sweep``) and the defaults stay."""
    doc = read_defaults(path)
    if model != "gpt":
        found = doc.get(model)
        sub: dict[str, Any] = found if isinstance(found, dict) else {}
        won = {**(sub.get("winner") or {}), **winners}
        grid = {**(sub.get("sweep") or {}), **table}
        doc[model] = {"setting": setting, "winner": won, "sweep": grid}
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return
    lr = dict(doc.get("lr", {})) if isinstance(doc.get("lr"), dict) else {}
    lr.update(winners)
    sweeps = dict(doc.get("sweep", {})) if isinstance(doc.get("sweep"), dict) else {}
    sweeps.update(table)
    out = {**doc, "setting": setting, "lr": lr, "sweep": sweeps}
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
