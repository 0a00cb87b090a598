"""The built-in English corpus: the fortune cookies of Debian's ``fortunes`` packages.

``apt-get install fortunes`` (with ``fortunes-min``, which it depends on) puts about 2.5 MB of
plain English text — some 15,000 quotations, jokes, definitions and passages of literature,
each one a document — in ``/usr/share/games/fortunes``, so the corpus works offline once the
package is installed. It is general prose rather than code, which is what the English runs and
benchmarks need; the standard library's source (``corpus.py``) stays the code corpus.

The category files are a fixed list (``ENGLISH_FILES``; ``ascii-art`` and the multilingual
``translate-me`` are left out); a missing one is a ``CorpusError`` saying what to install. A
file holds fortunes separated by lines of ``%``; the last tenth of each file's fortunes (at
least one) is validation text, the rest training text, so no fortune is in both splits.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from distronet.node.data.corpus import BuiltinCorpus
from distronet.node.data.errors import CorpusError

__all__ = ["ENGLISH_DIR", "ENGLISH_FILES", "english_documents", "load_english_corpus"]

ENGLISH_DIR = Path("/usr/share/games/fortunes")
ENGLISH_FILES: tuple[str, ...] = (
    "art", "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education",
    "ethnic", "food", "fortunes", "goedel", "humorists", "kids", "knghtbrd", "law", "linux",
    "linuxcookie", "literature", "love", "magic", "medicine", "men-women", "miscellaneous",
    "news", "paradoxum", "people", "perl", "pets", "platitudes", "politics", "pratchett",
    "riddles", "science", "songs-poems", "sports", "startrek", "tao", "wisdom", "work", "zippy",
)  # fmt: skip
_MAX_FILE_BYTES = 16 * 1024 * 1024
_SEPARATOR = "\n\n"


def _fortunes(path: Path) -> list[str]:
    try:
        size = path.stat().st_size
        if size > _MAX_FILE_BYTES:
            raise CorpusError(f"built-in English corpus: {path} is {size} bytes, over {_MAX_FILE_BYTES}")
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise CorpusError(
            f"built-in English corpus: {path} is missing; install Debian's fortunes package "
            "(apt-get install fortunes)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CorpusError(f"built-in English corpus: cannot read {path}: {exc}") from exc
    docs: list[str] = []
    cur: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if line == "%":
            docs.append("\n".join(cur).strip("\n"))
            cur = []
        else:
            cur.append(line)
    docs.append("\n".join(cur).strip("\n"))
    return [d for d in docs if d.strip()]


def english_documents(
    folder: Path = ENGLISH_DIR, files: tuple[str, ...] = ENGLISH_FILES
) -> tuple[list[str], list[str]]:
    """(training fortunes, validation fortunes), in file order (module docstring)."""
    train: list[str] = []
    val: list[str] = []
    for name in files:
        docs = _fortunes(folder / name)
        n_val = max(1, len(docs) // 10) if len(docs) > 1 else 0
        train += docs[: len(docs) - n_val]
        val += docs[len(docs) - n_val :]
    if not train or not val:
        raise CorpusError(f"built-in English corpus: no fortunes found under {folder}")
    return train, val


def load_english_corpus(folder: Path = ENGLISH_DIR, files: tuple[str, ...] = ENGLISH_FILES) -> BuiltinCorpus:
    """The English corpus as byte tokens (each fortune followed by a blank line), like the code
    corpus; ``modules`` names the category files."""
    train_docs, val_docs = english_documents(folder, files)
    train_bytes = "".join(d + _SEPARATOR for d in train_docs).encode("utf-8")
    val_bytes = "".join(d + _SEPARATOR for d in val_docs).encode("utf-8")
    digest = hashlib.sha256(train_bytes + val_bytes).hexdigest()
    return BuiltinCorpus(
        train=np.frombuffer(train_bytes, dtype=np.uint8),
        val=np.frombuffer(val_bytes, dtype=np.uint8),
        modules=files,
        digest=digest,
    )
