"""Turn text into token shards plus a manifest (``distro-node data prepare``).

By default text is tokenized with the byte-level tokenizer (a token is one byte of the file, so
any file, text or not, round-trips exactly; a version 1 manifest). With a Hugging Face
``tokenizers`` file (given, or trained first on the inputs: ``tokenizer.py``) the inputs are read
as documents (``documents.py``: text files, JSONL records, Parquet rows), each encoded and
followed by the EOS id, the tokens stored as ``uint16`` or ``uint32`` (by vocabulary size) and
the tokenizer copied beside the shards as ``tokenizer.json`` (a version 2 manifest with its
sha256). Input files are read in the order given, one after another, and their tokens cut into
shards of ``shard_tokens`` (the last one shorter). Shards are written as ``<prefix>-NNNNN.bin``
next to the manifest; ``progress`` is called with (bytes done, bytes total).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distronet.node.data.corpus import BuiltinCorpus
from distronet.node.data.documents import InputFormat, expand_inputs, iter_documents
from distronet.node.data.errors import DataError
from distronet.node.data.manifest import (
    DTYPES,
    MANIFEST_VERSION_TOKENIZER,
    Manifest,
    ShardEntry,
    write_manifest,
)
from distronet.node.data.tokenizer import LoadedTokenizer, load_tokenizer, token_dtype, train_bpe

__all__ = [
    "BUILTIN_TRAIN_MANIFEST",
    "BUILTIN_VAL_MANIFEST",
    "DEFAULT_SHARD_TOKENS",
    "TOKENIZER_FILE",
    "Progress",
    "TokenizerChoice",
    "encode_documents",
    "prepare_builtin",
    "prepare_builtin_tokenized",
    "prepare_files",
    "write_shards",
]

DEFAULT_SHARD_TOKENS = 1 << 20
BUILTIN_TRAIN_MANIFEST = "manifest.json"
BUILTIN_VAL_MANIFEST = "validation.json"
_BLOCK = 1 << 20  # bytes read from an input at a time
TOKENIZER_FILE = "tokenizer.json"  # the tokenizer's copy beside the shards
_BATCH_DOCS, _BATCH_CHARS = 512, 8 << 20  # documents encoded together

Progress = Callable[[int, int], None]


class _ShardWriter:
    """Accumulates encoded tokens (``itemsize`` bytes each) and writes a shard file each time
    ``shard_tokens`` are collected."""

    def __init__(self, out: Path, prefix: str, shard_tokens: int, itemsize: int = 1) -> None:
        self.out, self.prefix, self.shard_tokens, self.itemsize = out, prefix, shard_tokens, itemsize
        self.buf = bytearray()
        self.entries: list[ShardEntry] = []

    def add(self, data: bytes) -> None:
        self.buf += data
        cut = self.shard_tokens * self.itemsize
        while len(self.buf) >= cut:
            self._flush(bytes(self.buf[:cut]))
            del self.buf[:cut]

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
        tokens = len(data) // self.itemsize
        self.entries.append(ShardEntry(id=sid, path=name, sha256=digest, tokens=tokens, bytes=len(data)))


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
    tokenizer: TokenizerChoice | None = None,
    fmt: InputFormat = InputFormat(),
) -> Manifest:
    """Tokenize ``inputs`` (files or folders) into ``out/shard-NNNNN.bin`` + ``out/manifest.json``.

    ``tokenizer`` None: the byte-level tokenizer (JSONL and Parquet inputs are refused: they need
    a real tokenizer to be read as documents); else module docstring.
    """
    files = expand_inputs(inputs)
    if tokenizer is not None:
        return _prepare_documents(files, out, tokenizer, fmt, shard_tokens, progress)
    tables = [f for f in files if f.name.lower().endswith((".jsonl", ".ndjson", ".parquet"))]
    if tables:
        raise DataError(
            f"{tables[0]}: JSONL and Parquet inputs are read as documents with a real tokenizer; "
            "give --tokenizer FILE or --train-tokenizer VOCAB"
        )
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


@dataclass(frozen=True)
class TokenizerChoice:
    """A real tokenizer for prepare: ``path`` (a tokenizers JSON file) or ``train_vocab`` (train a
    byte-level BPE of that many ids on the training inputs first); ``eos_id`` overrides the EOS."""

    path: Path | None = None
    train_vocab: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.train_vocab is None):
            raise DataError("give one of --tokenizer FILE and --train-tokenizer VOCAB")

    def resolve(self, texts: Callable[[], Iterable[str]]) -> LoadedTokenizer:
        """The tokenizer: loaded, or trained on ``texts()`` (called once, only to train)."""
        if self.path is not None:
            return load_tokenizer(self.path, eos_id=self.eos_id)
        assert self.train_vocab is not None
        tok = train_bpe(texts(), self.train_vocab)
        if self.eos_id is not None and self.eos_id != tok.eos_id:
            raise DataError(
                f"--eos-id {self.eos_id}: a trained tokenizer's EOS is {tok.eos_id} (<|endoftext|>)"
            )
        return tok


def _write_tokenizer(tok: LoadedTokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (TOKENIZER_FILE + ".tmp")
    tmp.write_bytes(tok.data)
    tmp.replace(out / TOKENIZER_FILE)


def encode_documents(
    tok: LoadedTokenizer,
    docs: Iterable[str],
    out: Path,
    *,
    prefix: str,
    shard_tokens: int,
    manifest_name: str,
) -> Manifest:
    """Encode ``docs`` with ``tok``, each followed by its EOS id, into shards of the vocabulary's
    dtype (little-endian) and a version 2 manifest ``out/manifest_name`` (the tokenizer file is
    written by the caller as ``out/tokenizer.json``)."""
    if shard_tokens < 1:
        raise DataError(f"--shard-tokens must be >= 1, got {shard_tokens}")
    dtype = token_dtype(tok.vocab_size)
    dt = DTYPES[dtype]
    out.mkdir(parents=True, exist_ok=True)
    writer = _ShardWriter(out, prefix, shard_tokens, dt.itemsize)
    eos = np.array([tok.eos_id], dtype=dt)
    batch: list[str] = []
    chars = 0

    def flush() -> None:
        for enc in tok.tokenizer.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray(enc.ids, dtype=np.int64)
            writer.add(np.concatenate([ids.astype(dt), eos]).tobytes())
        batch.clear()

    for doc in docs:
        batch.append(doc)
        chars += len(doc)
        if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
            flush()
            chars = 0
    if batch:
        flush()
    manifest = Manifest(
        tokenizer="hf",
        dtype=dtype,
        shards=tuple(writer.close()),
        version=MANIFEST_VERSION_TOKENIZER,
        vocab_size=tok.vocab_size,
        eos_id=tok.eos_id,
        tokenizer_file=TOKENIZER_FILE,
        tokenizer_sha256=tok.sha256,
    )
    write_manifest(manifest, out / manifest_name)
    return manifest


def _prepare_documents(
    files: Sequence[Path],
    out: Path,
    choice: TokenizerChoice,
    fmt: InputFormat,
    shard_tokens: int,
    progress: Progress | None,
) -> Manifest:
    total = sum(f.stat().st_size for f in files)

    def texts(report: bool) -> Iterator[str]:
        done, current = 0, None
        for f, text in iter_documents(files, fmt):
            if f != current:
                if current is not None:
                    done += current.stat().st_size
                    if report and progress is not None:
                        progress(done, total)
                current = f
            yield text
        if report and progress is not None:
            progress(total, total)

    tok = choice.resolve(lambda: texts(False))
    manifest = encode_documents(
        tok, texts(True), out, prefix="shard", shard_tokens=shard_tokens, manifest_name=BUILTIN_TRAIN_MANIFEST
    )
    _write_tokenizer(tok, out)
    return manifest


def prepare_builtin_tokenized(
    train_docs: Sequence[str],
    val_docs: Sequence[str],
    out: Path,
    choice: TokenizerChoice,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
) -> tuple[Manifest, Manifest]:
    """A built-in corpus's documents with a real tokenizer (trained on ``train_docs`` only):
    ``train-*`` shards in ``manifest.json``, ``val-*`` in ``validation.json``, ``tokenizer.json``."""
    tok = choice.resolve(lambda: iter(train_docs))
    train = encode_documents(
        tok, train_docs, out, prefix="train", shard_tokens=shard_tokens, manifest_name=BUILTIN_TRAIN_MANIFEST
    )
    val = encode_documents(
        tok, val_docs, out, prefix="val", shard_tokens=shard_tokens, manifest_name=BUILTIN_VAL_MANIFEST
    )
    _write_tokenizer(tok, out)
    return train, val
