"""Files a run names beside itself: ``model.hf = "config.json"`` beside the run file, the
tokenizer beside the data manifest. The one set of path rules that the coordinator (which
inlines the config when it loads the run file, and serves the run's tokenizer) and the node
(``ModelSpec.from_run`` with a run folder) share, so they cannot drift apart."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from distronet.protocol.errors import ConfigError

__all__ = ["MODEL_CONFIG_MAX_BYTES", "file_beside", "read_json_beside"]

MODEL_CONFIG_MAX_BYTES = 256 * 1024  # a model's config.json is a few KB


def file_beside(run_dir: str | Path, rel: str, what: str, max_bytes: int) -> Path:
    """The regular file ``run_dir/rel``, resolved. ``rel`` must be relative, ``/``-separated,
    without ``..``, and resolve (symlinks too) to a file inside ``run_dir`` of at most
    ``max_bytes``. Raises ``ConfigError`` naming ``what`` (the key that named the file)."""
    pure = PurePosixPath(rel)
    if not rel or pure.is_absolute() or ".." in pure.parts or "\\" in rel or ":" in rel:
        raise ConfigError(
            f"{what}: path {rel!r} must be relative to the run file, '/'-separated, without '..'"
        )
    root = Path(run_dir).resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root):
        raise ConfigError(f"{what}: path {rel!r} leads outside the run file's folder")
    try:
        st = path.stat()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {rel!r}: {e}") from e
    if not path.is_file():
        raise ConfigError(f"{what}: {rel!r} is not a regular file")
    if st.st_size > max_bytes:
        raise ConfigError(f"{what}: {rel!r} is larger than {max_bytes} bytes")
    return path


def read_json_beside(
    run_dir: str | Path, rel: str, what: str, max_bytes: int = MODEL_CONFIG_MAX_BYTES
) -> Any:
    """The JSON document in ``run_dir/rel`` (``file_beside``'s rules). Raises ``ConfigError``
    naming ``what`` (the key that named the file)."""
    path = file_beside(run_dir, rel, what, max_bytes)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{what}: cannot read {rel!r}: {e}") from e
