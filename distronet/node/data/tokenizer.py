"""Hugging Face ``tokenizers`` files for `distro-node data prepare`: load, train, find the EOS.

- :func:`load_tokenizer` reads a ``tokenizer.json`` (bounded, checked to be a tokenizers JSON
  document) and finds its EOS token;
- :func:`train_bpe` trains a byte-level BPE on documents (deterministic: the same documents and
  vocabulary size give the same file, byte for byte) with ``<|endoftext|>`` as its EOS;
- :func:`token_dtype` is ``uint16`` below 65,536 ids, else ``uint32``.

The EOS of a given file is, in order: ``--eos-id``; the ``eos_token`` of a
``tokenizer_config.json`` beside it; a special added token named like an EOS
(``EOS_NAMES``). A tokenizer with none of them is refused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distronet.node.data.errors import DataError
from distronet.node.data.manifest import MAX_VOCAB
from distronet.protocol.limits import MAX_TOKENIZER_BYTES

__all__ = [
    "EOS_NAMES",
    "EOS_TOKEN",
    "MAX_TOKENIZER_BYTES",
    "LoadedTokenizer",
    "load_tokenizer",
    "token_dtype",
    "train_bpe",
]

EOS_TOKEN = "<|endoftext|>"  # the special token a trained tokenizer gets (id 0)
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[EOS]")
MIN_TRAIN_VOCAB = 257  # 256 byte symbols and the EOS


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer ready to encode: the ``tokenizers.Tokenizer``, its file's bytes and sha256,
    the vocabulary size (largest id + 1) and the EOS id."""

    tokenizer: Any  # tokenizers.Tokenizer (the package has no type stubs)
    data: bytes
    sha256: str
    vocab_size: int
    eos_id: int


def token_dtype(vocab_size: int) -> str:
    """``uint16`` when every id fits 16 bits, else ``uint32``."""
    if not 1 <= vocab_size <= MAX_VOCAB:
        raise DataError(f"vocabulary size {vocab_size} is outside [1, {MAX_VOCAB}]")
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def _vocab_size(tok: Any) -> int:
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(vocab.values()) + 1 if vocab else 0


def _config_eos(path: Path, tok: Any) -> int | None:
    """The id of ``eos_token`` in a ``tokenizer_config.json`` beside ``path``, if there is one."""
    cfg = path.with_name("tokenizer_config.json")
    if not cfg.is_file() or cfg.stat().st_size > 16 * 1024 * 1024:
        return None
    try:
        doc = json.loads(cfg.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{cfg}: not valid JSON ({exc})") from None
    eos = doc.get("eos_token") if isinstance(doc, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return None
    tid = tok.token_to_id(eos)
    if tid is None:
        raise DataError(f"{cfg}: eos_token {eos!r} is not in the tokenizer's vocabulary")
    return int(tid)


def _added_eos(tok: Any) -> int | None:
    for tid, added in sorted(tok.get_added_tokens_decoder().items()):
        if added.special and added.content in EOS_NAMES:
            return int(tid)
    return None


def _finish(tok: Any, data: bytes, where: str, eos_id: int | None, path: Path | None) -> LoadedTokenizer:
    vocab = _vocab_size(tok)
    if not 1 <= vocab <= MAX_VOCAB:
        raise DataError(f"{where}: vocabulary of {vocab} ids is outside [1, {MAX_VOCAB}]")
    if eos_id is not None:
        if not 0 <= eos_id < vocab:
            raise DataError(f"--eos-id {eos_id} is not a token id of {where} (vocabulary {vocab})")
        eos = eos_id
    else:
        found = (_config_eos(path, tok) if path is not None else None) or _added_eos(tok)
        if found is None:
            raise DataError(
                f"{where}: no EOS token (no eos_token in a tokenizer_config.json beside it, no special "
                f"token among {', '.join(EOS_NAMES)}); give the id to put between documents with --eos-id"
            )
        eos = found
    return LoadedTokenizer(tok, data, hashlib.sha256(data).hexdigest(), vocab, eos)


def _tokenizers() -> Any:
    """The ``tokenizers`` package (the ``data`` extra), or a DataError saying how to get it."""
    try:
        import tokenizers
    except ImportError as exc:
        raise DataError("a tokenizer needs the tokenizers package: pip install 'distro-node[data]'") from exc
    return tokenizers


def _parse(data: bytes, where: str) -> Any:
    Tokenizer = _tokenizers().Tokenizer

    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{where}: not a tokenizer file (not valid JSON: {exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise DataError(
            f"{where}: not a tokenizers JSON file (no 'model' object); save one with Tokenizer.save"
        )
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise DataError(f"{where}: not a usable tokenizers file ({str(exc)[:300]})") from None


def load_tokenizer(path: Path, *, eos_id: int | None = None) -> LoadedTokenizer:
    """Read the ``tokenizers`` JSON file at ``path`` (at most ``MAX_TOKENIZER_BYTES``).

    Raises ``DataError`` when it cannot be read, is not JSON, is not a tokenizers file, or has
    no usable EOS (module docstring) and ``eos_id`` is None.
    """
    try:
        size = path.stat().st_size
        if size > MAX_TOKENIZER_BYTES:
            raise DataError(f"tokenizer {path} is {size} bytes, over the {MAX_TOKENIZER_BYTES} byte limit")
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read tokenizer {path}: {exc.strerror or exc}") from exc
    return _finish(_parse(data, f"tokenizer {path}"), data, f"tokenizer {path}", eos_id, path)


def train_bpe(texts: Iterable[str], vocab_size: int) -> LoadedTokenizer:
    """A byte-level BPE of ``vocab_size`` ids (fewer when the text has fewer merges) trained on
    ``texts``, ``<|endoftext|>`` its id 0 and EOS. The same texts in the same order and the same
    ``vocab_size`` give the same JSON bytes."""
    tk = _tokenizers()
    Tokenizer, decoders, models, pre_tokenizers, trainers = (
        tk.Tokenizer,
        tk.decoders,
        tk.models,
        tk.pre_tokenizers,
        tk.trainers,
    )

    if not MIN_TRAIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise DataError(
            f"--train-tokenizer {vocab_size}: the vocabulary must be in [{MIN_TRAIN_VOCAB}, {MAX_VOCAB}]"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    data = tok.to_str(pretty=True).encode("utf-8")
    return _finish(Tokenizer.from_str(data.decode("utf-8")), data, "trained tokenizer", None, None)
