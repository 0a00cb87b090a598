"""Token shards and the manifest that lists them — the format the coordinator leases.

A shard is a file of raw tokens with no header: ``uint8`` (one byte per token, the byte-level
tokenizer), ``uint16`` little-endian (two bytes per token, vocabularies of up to 65,536 ids) or
``uint32`` little-endian (larger vocabularies). Its size is exactly ``tokens * itemsize`` bytes.
The manifest is JSON. Version 1 is the byte-level tokenizer (vocabulary 256, no EOS)::

    {"version": 1, "tokenizer": "byte", "dtype": "uint8",
     "shards": [{"id": "shard-00000", "path": "shard-00000.bin",
                 "sha256": "<64 hex>", "tokens": 1048576, "bytes": 1048576}, ...]}

Version 2 is a Hugging Face ``tokenizers`` JSON file kept beside the manifest (``"tokenizer":
"hf"``); it adds the vocabulary size (every token id is below it), the EOS id written between
documents, and the tokenizer file's name and sha256 (what a node checks the run's tokenizer
against)::

    {"version": 2, "tokenizer": "hf", "dtype": "uint16", "vocab_size": 8192, "eos_id": 0,
     "tokenizer_file": "tokenizer.json", "tokenizer_sha256": "<64 hex>", "shards": [...]}

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
    "MANIFEST_VERSION_TOKENIZER",
    "MAX_VOCAB",
    "Manifest",
    "ManifestLimits",
    "ShardEntry",
    "check_tokens",
    "load_shard",
    "read_manifest",
    "sha256_file",
    "write_manifest",
]

MANIFEST_VERSION = 1  # the byte-level tokenizer (written unchanged for byte runs)
MANIFEST_VERSION_TOKENIZER = 2  # a tokenizers JSON file: vocab_size, eos_id, its sha256
DTYPES: dict[str, np.dtype] = {"uint8": np.dtype("<u1"), "uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
TOKENIZERS = ("byte", "hf")
MAX_VOCAB = 1 << 31  # token ids must fit int32 (the model's embedding index)
BYTE_VOCAB = 256
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
    """A run's data: tokenizer, token dtype and the list of shards.

    ``vocab_size`` bounds every token id (None: the dtype's range, version 1 manifests);
    ``eos_id``, ``tokenizer_file`` and ``tokenizer_sha256`` are set for ``tokenizer == "hf"``
    (version 2) and None for the byte tokenizer.
    """

    tokenizer: str
    dtype: str
    shards: tuple[ShardEntry, ...]
    version: int = MANIFEST_VERSION
    vocab_size: int | None = None
    eos_id: int | None = None
    tokenizer_file: str | None = None
    tokenizer_sha256: str | None = None

    @property
    def itemsize(self) -> int:
        """Bytes per token in the shards."""
        return DTYPES[self.dtype].itemsize

    @property
    def vocab_bound(self) -> int:
        """Every token id is below this: ``vocab_size``, or 256 for the byte tokenizer, or the
        dtype's range."""
        if self.vocab_size is not None:
            return self.vocab_size
        return BYTE_VOCAB if self.tokenizer == "byte" and self.dtype == "uint8" else 1 << (8 * self.itemsize)

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
        doc: dict[str, Any] = {"version": self.version, "tokenizer": self.tokenizer, "dtype": self.dtype}
        if self.version >= MANIFEST_VERSION_TOKENIZER:
            doc |= {
                "vocab_size": self.vocab_size,
                "eos_id": self.eos_id,
                "tokenizer_file": self.tokenizer_file,
                "tokenizer_sha256": self.tokenizer_sha256,
            }
        doc["shards"] = [s.to_json() for s in self.shards]
        return doc

    @classmethod
    def from_json(cls, doc: Any, limits: ManifestLimits = MANIFEST_LIMITS) -> Manifest:
        """Validate a parsed JSON document; raises ``ManifestError`` saying which field is wrong."""
        if not isinstance(doc, dict):
            raise ManifestError("manifest must be a JSON object")
        version = doc.get("version")
        if version not in (MANIFEST_VERSION, MANIFEST_VERSION_TOKENIZER) or type(version) is not int:
            raise ManifestError(f"unsupported manifest version {version!r} (expected 1 or 2)")
        tokenizer, dtype, shards = doc.get("tokenizer"), doc.get("dtype"), doc.get("shards")
        if tokenizer not in TOKENIZERS:
            raise ManifestError(f"unknown tokenizer {tokenizer!r} (known: {', '.join(TOKENIZERS)})")
        if dtype not in DTYPES:
            raise ManifestError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        extra = _tokenizer_fields(doc, version, tokenizer, dtype)
        if not isinstance(shards, list) or len(shards) > limits.max_shards:
            raise ManifestError(f"'shards' must be a list of at most {limits.max_shards} entries")
        entries = tuple(_entry(raw, DTYPES[dtype].itemsize, limits) for raw in shards)
        ids = [e.id for e in entries]
        if len(set(ids)) != len(ids):
            raise ManifestError("shard ids must be unique")
        return cls(tokenizer=tokenizer, dtype=dtype, shards=entries, version=version, **extra)


def _tokenizer_fields(doc: dict[str, Any], version: int, tokenizer: str, dtype: str) -> dict[str, Any]:
    """The version-2 fields, checked: a vocabulary the dtype can hold, an EOS id inside it, a
    tokenizer file name (no folders) and its sha256. Version 1 is the byte tokenizer only."""
    if version == MANIFEST_VERSION:
        if tokenizer != "byte":
            raise ManifestError(f"a version 1 manifest has the byte tokenizer, not {tokenizer!r}")
        return {}
    if tokenizer != "hf":
        raise ManifestError(f"a version 2 manifest has tokenizer 'hf', not {tokenizer!r}")
    vocab, eos = doc.get("vocab_size"), doc.get("eos_id")
    fname, sha = doc.get("tokenizer_file"), doc.get("tokenizer_sha256")
    cap = min(MAX_VOCAB, 1 << (8 * DTYPES[dtype].itemsize))
    if type(vocab) is not int or not 1 <= vocab <= cap:
        raise ManifestError(f"vocab_size must be an integer in [1, {cap}] for dtype {dtype}, got {vocab!r}")
    if type(eos) is not int or not 0 <= eos < vocab:
        raise ManifestError(f"eos_id must be an integer in [0, vocab_size={vocab}), got {eos!r}")
    if not isinstance(fname, str) or not _ID_RE.match(fname):
        raise ManifestError(f"tokenizer_file must be a plain file name beside the manifest, got {fname!r}")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise ManifestError("tokenizer_sha256 must be 64 lower-case hex digits")
    return {"vocab_size": vocab, "eos_id": eos, "tokenizer_file": fname, "tokenizer_sha256": sha}


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
    sha256 differs, or when a token id is not below the manifest's vocabulary
    (``vocab_bound``); ``ManifestError`` for a url-only entry (fetch it first). Costs one read and
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
    check_tokens(tokens, manifest.vocab_bound, entry.id)
    return tokens.astype(tokens.dtype.newbyteorder("="), copy=False)


def check_tokens(tokens: np.ndarray, vocab: int, shard_id: str) -> None:
    """Raise ``ShardIntegrityError`` naming the shard when a token id is ``>= vocab``."""
    if tokens.size and int(tokens.max()) >= vocab:
        bad = int(np.argmax(tokens >= vocab))
        raise ShardIntegrityError(
            shard_id, f"token {int(tokens[bad])} at position {bad} is not below the vocabulary size {vocab}"
        )
