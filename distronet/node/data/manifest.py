"""Token shards and the manifest that lists them — the format the coordinator leases.

A shard is a file of raw tokens with no header: ``uint8`` (one byte per token, the byte-level
tokenizer) or ``uint16`` little-endian (two bytes per token, tokenizers with up to 65,536
ids). Its size is exactly ``tokens * itemsize`` bytes. The manifest is JSON::

    {"version": 1, "tokenizer": "byte", "dtype": "uint8",
     "shards": [{"id": "shard-00000", "path": "shard-00000.bin",
                 "sha256": "<64 hex>", "tokens": 1048576, "bytes": 1048576}, ...]}

A shard has either ``path`` (relative to the manifest's folder, no ``..``) or ``url`` (fetched
by the node before use). Reading a manifest checks every field against ``MANIFEST_LIMITS``;
loading a shard checks its size and sha256 against its entry and raises
``ShardIntegrityError`` naming the shard on any difference.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from distronet.node.data.errors import ManifestError, ShardIntegrityError

__all__ = [
    "DTYPES",
    "MANIFEST_LIMITS",
    "MANIFEST_VERSION",
    "Manifest",
    "ManifestLimits",
    "ShardEntry",
    "load_shard",
    "read_manifest",
    "sha256_file",
    "write_manifest",
]

MANIFEST_VERSION = 1
DTYPES: dict[str, np.dtype] = {"uint8": np.dtype("<u1"), "uint16": np.dtype("<u2")}
TOKENIZERS = ("byte",)
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ManifestLimits:
    """Bounds a manifest is checked against before anything in it is used."""

    max_manifest_bytes: int = 64 * 1024 * 1024
    max_shards: int = 1_000_000
    max_shard_bytes: int = 4 * 1024**3
    max_path_chars: int = 1024


MANIFEST_LIMITS = ManifestLimits()


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a manifest: ``path`` or ``url`` (exactly one is set)."""

    id: str
    sha256: str
    tokens: int
    bytes: int
    path: str | None = None
    url: str | None = None

    def to_json(self) -> dict[str, Any]:
        where = {"path": self.path} if self.path is not None else {"url": self.url}
        return {"id": self.id, **where, "sha256": self.sha256, "tokens": self.tokens, "bytes": self.bytes}


@dataclass(frozen=True)
class Manifest:
    """A run's data: tokenizer, token dtype and the list of shards."""

    tokenizer: str
    dtype: str
    shards: tuple[ShardEntry, ...]
    version: int = MANIFEST_VERSION

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def shard(self, shard_id: str) -> ShardEntry:
        """The entry named ``shard_id``; raises ``ManifestError`` if there is none."""
        for s in self.shards:
            if s.id == shard_id:
                return s
        raise ManifestError(f"manifest has no shard {shard_id!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "tokenizer": self.tokenizer,
            "dtype": self.dtype,
            "shards": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, doc: Any, limits: ManifestLimits = MANIFEST_LIMITS) -> Manifest:
        """Validate a parsed JSON document; raises ``ManifestError`` saying which field is wrong."""
        if not isinstance(doc, dict):
            raise ManifestError("manifest must be a JSON object")
        if doc.get("version") != MANIFEST_VERSION:
            raise ManifestError(f"unsupported manifest version {doc.get('version')!r} (expected 1)")
        tokenizer, dtype, shards = doc.get("tokenizer"), doc.get("dtype"), doc.get("shards")
        if tokenizer not in TOKENIZERS:
            raise ManifestError(f"unknown tokenizer {tokenizer!r} (known: {', '.join(TOKENIZERS)})")
        if dtype not in DTYPES:
            raise ManifestError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        if not isinstance(shards, list) or len(shards) > limits.max_shards:
            raise ManifestError(f"'shards' must be a list of at most {limits.max_shards} entries")
        entries = tuple(_entry(raw, DTYPES[dtype].itemsize, limits) for raw in shards)
        ids = [e.id for e in entries]
        if len(set(ids)) != len(ids):
            raise ManifestError("shard ids must be unique")
        return cls(tokenizer=tokenizer, dtype=dtype, shards=entries)


def _entry(raw: Any, itemsize: int, limits: ManifestLimits) -> ShardEntry:
    """Check one shard entry field by field."""
    if not isinstance(raw, dict):
        raise ManifestError("each shard entry must be a JSON object")
    sid = raw.get("id")
    if not isinstance(sid, str) or not _ID_RE.match(sid):
        raise ManifestError(f"bad shard id {sid!r}: 1-128 of A-Z a-z 0-9 . _ -, not starting with . _ -")
    sha, tokens, size = raw.get("sha256"), raw.get("tokens"), raw.get("bytes")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise ManifestError(f"shard {sid!r}: sha256 must be 64 lower-case hex digits")
    for name, value in (("tokens", tokens), ("bytes", size)):
        if type(value) is not int or not 0 <= value <= limits.max_shard_bytes:
            raise ManifestError(f"shard {sid!r}: {name} must be an integer in [0, {limits.max_shard_bytes}]")
    assert isinstance(tokens, int) and isinstance(size, int)
    if size != tokens * itemsize:
        raise ManifestError(f"shard {sid!r}: bytes ({size}) != tokens ({tokens}) x {itemsize}")
    path, url = raw.get("path"), raw.get("url")
    if (path is None) == (url is None):
        raise ManifestError(f"shard {sid!r}: exactly one of 'path' and 'url' must be given")
    for name, value in (("path", path), ("url", url)):
        if value is not None and (not isinstance(value, str) or not 0 < len(value) <= limits.max_path_chars):
            raise ManifestError(f"shard {sid!r}: {name} must be a string of 1-{limits.max_path_chars} chars")
    if isinstance(path, str):
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or "\\" in path:
            raise ManifestError(f"shard {sid!r}: path {path!r} must be relative, '/'-separated, without '..'")
    return ShardEntry(id=sid, sha256=sha, tokens=tokens, bytes=size, path=path, url=url)


def read_manifest(path: str | Path, limits: ManifestLimits = MANIFEST_LIMITS) -> Manifest:
    """Read and validate the manifest file at ``path``; raises ``ManifestError``."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > limits.max_manifest_bytes:
            raise ManifestError(f"manifest {p} is {size} bytes, over the {limits.max_manifest_bytes} limit")
        doc = json.loads(p.read_bytes())
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p}: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest {p} is not valid JSON: {exc}") from exc
    return Manifest.from_json(doc, limits)


def write_manifest(manifest: Manifest, path: str | Path) -> None:
    """Write ``manifest`` as indented JSON (written to a temporary name, then renamed)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=1) + "\n", encoding="utf-8")
    tmp.replace(p)


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    """Hex sha256 of a file, read ``block`` bytes at a time."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def load_shard(manifest: Manifest, entry: ShardEntry, root: str | Path) -> np.ndarray:
    """The tokens of ``entry`` (1-D, the manifest's dtype, native byte order), verified.

    ``root`` is the manifest's folder. Raises ``ShardIntegrityError`` naming the shard when the
    file is missing, its size differs from ``entry.bytes`` (checked before reading) or its
    sha256 differs; ``ManifestError`` for a url-only entry (fetch it first). Costs one read and
    one hash of the file.
    """
    if entry.path is None:
        raise ManifestError(f"shard {entry.id!r} has only a url; fetch it to a file first")
    file = Path(root) / entry.path
    try:
        size = file.stat().st_size
    except OSError as exc:
        raise ShardIntegrityError(entry.id, f"cannot read {file}: {exc.strerror or exc}") from exc
    if size != entry.bytes:
        raise ShardIntegrityError(entry.id, f"{file} is {size} bytes, the manifest says {entry.bytes}")
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ShardIntegrityError(entry.id, f"sha256 of {file} is {digest}, the manifest says {entry.sha256}")
    tokens = np.frombuffer(data, dtype=DTYPES[manifest.dtype])
    return tokens.astype(tokens.dtype.newbyteorder("="), copy=False)
