"""Turn text into token shards plus a manifest (``distro-node data prepare``).

Text is tokenized with the byte-level tokenizer (a token is one byte of the file, so any file,
text or not, round-trips exactly). Input files are read in the order given, one after
another, and their tokens cut into shards of ``shard_tokens`` (the last one shorter). Shards
are written as ``<prefix>-NNNNN.bin`` next to the manifest; ``progress`` is called after each
block with (bytes done, bytes total).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from distronet.node.data.corpus import BuiltinCorpus
from distronet.node.data.errors import DataError
from distronet.node.data.manifest import Manifest, ShardEntry, write_manifest

__all__ = [
    "BUILTIN_TRAIN_MANIFEST",
    "BUILTIN_VAL_MANIFEST",
    "DEFAULT_SHARD_TOKENS",
    "Progress",
    "prepare_builtin",
    "prepare_files",
    "write_shards",
]

DEFAULT_SHARD_TOKENS = 1 << 20
BUILTIN_TRAIN_MANIFEST = "manifest.json"
BUILTIN_VAL_MANIFEST = "validation.json"
_BLOCK = 1 << 20  # bytes read from an input at a time

Progress = Callable[[int, int], None]


class _ShardWriter:
    """Accumulates tokens and writes a shard file each time ``shard_tokens`` are collected."""

    def __init__(self, out: Path, prefix: str, shard_tokens: int) -> None:
        self.out, self.prefix, self.shard_tokens = out, prefix, shard_tokens
        self.buf = bytearray()
        self.entries: list[ShardEntry] = []

    def add(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= self.shard_tokens:
            self._flush(bytes(self.buf[: self.shard_tokens]))
            del self.buf[: self.shard_tokens]

    def close(self) -> list[ShardEntry]:
        if self.buf:
            self._flush(bytes(self.buf))
            self.buf.clear()
        return self.entries

    def _flush(self, data: bytes) -> None:
        sid = f"{self.prefix}-{len(self.entries):05d}"
        name = sid + ".bin"
        tmp = self.out / (name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(self.out / name)
        digest = hashlib.sha256(data).hexdigest()
        self.entries.append(ShardEntry(id=sid, path=name, sha256=digest, tokens=len(data), bytes=len(data)))


def write_shards(
    blocks: Iterable[bytes], out: Path, *, prefix: str, shard_tokens: int, manifest_name: str
) -> Manifest:
    """Write byte-token ``blocks`` as shards under ``out`` and their manifest ``out/manifest_name``."""
    if shard_tokens < 1:
        raise DataError(f"--shard-tokens must be >= 1, got {shard_tokens}")
    out.mkdir(parents=True, exist_ok=True)
    writer = _ShardWriter(out, prefix, shard_tokens)
    for block in blocks:
        writer.add(block)
    manifest = Manifest(tokenizer="byte", dtype="uint8", shards=tuple(writer.close()))
    write_manifest(manifest, out / manifest_name)
    return manifest


def _expand(inputs: Sequence[Path]) -> list[Path]:
    """Files named, and the files under folders named (sorted), in order; errors name the input."""
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"input {p} does not exist or is not a file")
    if not files:
        raise DataError("no input files to prepare")
    return files


def _read_blocks(files: Sequence[Path], progress: Progress | None) -> Iterator[bytes]:
    total = sum(f.stat().st_size for f in files)
    done = 0
    for f in files:
        try:
            with f.open("rb") as fh:
                while block := fh.read(_BLOCK):
                    done += len(block)
                    yield block
                    if progress is not None:
                        progress(done, total)
        except OSError as exc:
            raise DataError(f"cannot read input {f}: {exc.strerror or exc}") from exc


def prepare_files(
    inputs: Sequence[Path],
    out: Path,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    progress: Progress | None = None,
) -> Manifest:
    """Tokenize ``inputs`` (files or folders) into ``out/shard-NNNNN.bin`` + ``out/manifest.json``."""
    files = _expand(inputs)
    return write_shards(
        _read_blocks(files, progress),
        out,
        prefix="shard",
        shard_tokens=shard_tokens,
        manifest_name=BUILTIN_TRAIN_MANIFEST,
    )


def _array_blocks(tokens: np.ndarray, progress: Progress | None, done0: int, total: int) -> Iterator[bytes]:
    for i in range(0, tokens.size, _BLOCK):
        block = tokens[i : i + _BLOCK].tobytes()
        yield block
        if progress is not None:
            progress(done0 + i + len(block), total)


def prepare_builtin(
    corpus: BuiltinCorpus,
    out: Path,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    progress: Progress | None = None,
) -> tuple[Manifest, Manifest]:
    """Write the built-in corpus: ``train-*`` shards listed in ``manifest.json``, ``val-*`` in
    ``validation.json``."""
    total = corpus.train.size + corpus.val.size
    train = write_shards(
        _array_blocks(corpus.train, progress, 0, total),
        out,
        prefix="train",
        shard_tokens=shard_tokens,
        manifest_name=BUILTIN_TRAIN_MANIFEST,
    )
    val = write_shards(
        _array_blocks(corpus.val, progress, corpus.train.size, total),
        out,
        prefix="val",
        shard_tokens=shard_tokens,
        manifest_name=BUILTIN_VAL_MANIFEST,
    )
    return train, val
