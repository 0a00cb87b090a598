"""The ``--model llama`` side of ``bench converge``: a Llama-architecture model, its BPE and its tokens.

The model is a Hugging Face Llama (``[model] arch = "hf"``: ``models.hf.build_hf_model``, the
same build a node of an ``hf`` run uses) described by :class:`LlamaShape`. Its data is the built-in
English corpus (Debian's ``fortunes``: ``data.english``), tokenized by the project's own data code:
a byte-level BPE of ``vocab`` ids trained on the training fortunes only (``data.tokenizer.train_bpe``
through ``data.prepare.prepare_builtin_tokenized``), ``uint16`` shards, each fortune followed by the
EOS. The tokenizer and shards are cached under the work dir in a folder named by the vocabulary
and the sha256 of the fortunes, so a rerun reads them back (every shard checked against its
manifest's sha256) instead of training and encoding again; other fortunes give another folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distronet.node.data.english import ENGLISH_DIR, english_documents
from distronet.node.data.errors import CorpusError, DataError
from distronet.node.data.manifest import Manifest, load_shard, read_manifest
from distronet.node.data.prepare import (
    BUILTIN_TRAIN_MANIFEST,
    BUILTIN_VAL_MANIFEST,
    TOKENIZER_FILE,
    TokenizerChoice,
    prepare_builtin_tokenized,
)

__all__ = ["EnglishTokens", "LlamaShape", "default_work_dir", "english_tokens"]


@dataclass(frozen=True)
class LlamaShape:
    """A Llama's shape (untied head, SwiGLU MLP of ``ffn``, RMSNorm, rotary positions).

    The default is the benchmark's model: 4 layers of width 256, 4 heads (no grouping), MLP 688,
    a 4,096-token BPE, context 128: 5,261,568 parameters (``parameters()``), 6.0x the built-in GPT."""

    depth: int = 4
    width: int = 256
    heads: int = 4
    kv_heads: int = 4
    ffn: int = 688
    vocab: int = 4096
    context: int = 128

    def hf_config(self) -> dict[str, Any]:
        """The ``[model.hf]`` table of this shape (checked by ``models.spec.check_hf_config``)."""
        return {
            "model_type": "llama",
            "vocab_size": self.vocab,
            "hidden_size": self.width,
            "intermediate_size": self.ffn,
            "num_hidden_layers": self.depth,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.context,
            "tie_word_embeddings": False,
            "rms_norm_eps": 1e-5,
            "initializer_range": 0.02,
        }

    def parameters(self) -> int:
        """Parameter count: embedding and head ``2·V·W``; per layer attention ``2·W² + 2·W·Wkv``,
        MLP ``3·W·F``, two norms; a final norm."""
        w, kv = self.width, self.width // self.heads * self.kv_heads
        layer = 2 * w * w + 2 * w * kv + 3 * w * self.ffn + 2 * w
        return 2 * self.vocab * w + self.depth * layer + w


@dataclass(frozen=True)
class EnglishTokens:
    """The English corpus as BPE tokens: training and validation ``uint16`` arrays, the
    tokenizer's sha256 and vocabulary size, and the folder they are cached in."""

    train: np.ndarray
    val: np.ndarray
    tokenizer_sha256: str
    vocab_size: int
    folder: Path
    digest: str  # sha256 over the tokenizer's and both splits' shard digests


def default_work_dir() -> Path:
    """``$XDG_CACHE_HOME/distro-node/bench-converge`` (``~/.cache/...`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "distro-node" / "bench-converge"


def _docs_digest(train: list[str], val: list[str]) -> str:
    h = hashlib.sha256()
    for split in (train, val):
        h.update(len(split).to_bytes(8, "little"))
        for d in split:
            b = d.encode("utf-8")
            h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _read_split(folder: Path, name: str) -> tuple[Manifest, np.ndarray]:
    manifest = read_manifest(folder / name)
    parts = [load_shard(manifest, entry, folder) for entry in manifest.shards]
    return manifest, (np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16))


def _load(folder: Path, vocab: int) -> EnglishTokens:
    train_m, train = _read_split(folder, BUILTIN_TRAIN_MANIFEST)
    val_m, val = _read_split(folder, BUILTIN_VAL_MANIFEST)
    if train_m.dtype != "uint16" or train_m.vocab_size is None or train_m.vocab_size > vocab:
        raise DataError(f"{folder}: not a cached English BPE of at most {vocab} ids; delete it")
    sha = train_m.tokenizer_sha256 or ""
    h = hashlib.sha256(sha.encode())
    for m in (train_m, val_m):
        for e in m.shards:
            h.update(e.sha256.encode())
    return EnglishTokens(train, val, sha, train_m.vocab_size, folder, h.hexdigest())


def english_tokens(vocab: int, work_dir: Path, folder: Path = ENGLISH_DIR) -> EnglishTokens:
    """The English corpus under ``folder`` tokenized with a BPE of ``vocab`` ids trained on its
    training fortunes, cached in ``work_dir`` (module docstring).

    Raises ``CorpusError`` naming ``apt-get install fortunes`` when the fortunes are missing,
    ``DataError`` when the cache cannot be written or read."""
    if not folder.is_dir():
        raise CorpusError(
            f"bench converge --model llama trains on the built-in English corpus, Debian's fortunes, "
            f"and {folder} does not exist: install it with `apt-get install fortunes`"
        )
    train_docs, val_docs = english_documents(folder)
    cache = work_dir / f"english-bpe{vocab}-{_docs_digest(train_docs, val_docs)[:16]}"
    if (cache / BUILTIN_VAL_MANIFEST).is_file() and (cache / TOKENIZER_FILE).is_file():
        return _load(cache, vocab)
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=work_dir))
    except OSError as exc:
        raise DataError(f"cannot create the benchmark's work dir {work_dir}: {exc}") from exc
    try:
        prepare_builtin_tokenized(train_docs, val_docs, tmp, TokenizerChoice(train_vocab=vocab))
        try:
            tmp.replace(cache)
        except OSError:  # another process cached it first: use theirs
            if not (cache / BUILTIN_VAL_MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _load(cache, vocab)
