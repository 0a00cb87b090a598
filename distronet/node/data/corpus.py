"""The built-in corpus: the running interpreter's own standard-library source text.

Every CPython ships these modules as Python source, so every volunteer has the corpus without
a download. The list is fixed (``CORPUS_MODULES``); a module that cannot be found or has no
source is an error naming it, never skipped, so two machines that build the corpus without an
error hold the same modules (the text itself follows the interpreter's version).

Tokens are bytes of the UTF-8 source (the byte-level tokenizer, vocabulary 256). The split
into train and validation is by position within each module: the first 90 % of a module's
lines are training text, the rest validation, so both splits see every module's style and no
byte is in both. Modules are joined in list order, each followed by one blank line.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass

import numpy as np

from distronet.node.data.errors import CorpusError

__all__ = [
    "CORPUS_MODULES",
    "VAL_FRACTION",
    "BuiltinCorpus",
    "code_documents",
    "load_builtin_corpus",
    "module_source",
]

# Pure-Python, top-level standard-library modules present in CPython 3.10 to 3.13 on every
# platform, none of them frozen into the interpreter (frozen modules have no source to read).
CORPUS_MODULES: tuple[str, ...] = (
    "argparse", "ast", "base64", "bdb", "calendar", "cmd", "code", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "doctest",
    "enum", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gettext",
    "glob", "gzip", "hashlib", "heapq", "hmac", "imaplib", "inspect", "ipaddress",
    "locale", "mailbox", "mimetypes", "netrc", "numbers", "operator", "optparse", "pathlib",
    "pdb", "pickle", "pickletools", "pkgutil", "platform", "plistlib", "poplib", "pprint",
    "profile", "pstats", "queue", "quopri", "random", "selectors", "shlex", "shutil",
    "smtplib", "socket", "socketserver", "statistics", "string", "stringprep", "subprocess", "tabnanny",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback",
    "types", "typing", "uuid", "warnings", "wave", "weakref", "zipapp", "zipfile",
)  # fmt: skip

VAL_FRACTION = 0.1  # the last tenth of each module's lines is validation text
_SEPARATOR = b"\n\n"


def module_source(name: str) -> str:
    """The source text of the top-level module ``name`` as this interpreter would compile it.

    Raises ``CorpusError`` naming the module when it is not installed or has no source (a
    frozen or compiled-only build); newlines are normalised to ``\\n`` by the loader.
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise CorpusError(f"built-in corpus: module {name!r} cannot be located: {exc}") from exc
    if spec is None or spec.loader is None:
        raise CorpusError(f"built-in corpus: module {name!r} is not installed in this interpreter")
    get_source = getattr(spec.loader, "get_source", None)
    source = get_source(name) if get_source is not None else None
    if not isinstance(source, str) or not source:
        raise CorpusError(
            f"built-in corpus: module {name!r} has no Python source here (origin {spec.origin!r}); "
            "install the interpreter's standard-library sources"
        )
    return source


def _split_lines(text: bytes, fraction: float) -> tuple[bytes, bytes]:
    """Cut ``text`` at the first line start at or after ``(1 - fraction)`` of its length."""
    cut = int(len(text) * (1.0 - fraction))
    nl = text.find(b"\n", cut)
    cut = len(text) if nl < 0 else nl + 1
    return text[:cut], text[cut:]


@dataclass(frozen=True)
class BuiltinCorpus:
    """The built-in corpus as byte tokens.

    ``train`` and ``val`` are 1-D uint8 arrays (read-only); ``modules`` is the list they were
    built from and ``digest`` the sha256 of ``train`` then ``val`` (hex), which tells whether
    two machines hold the same text.
    """

    train: np.ndarray
    val: np.ndarray
    modules: tuple[str, ...]
    digest: str


def load_builtin_corpus(modules: tuple[str, ...] = CORPUS_MODULES) -> BuiltinCorpus:
    """Read ``modules``' sources and split them into train and validation byte tokens.

    Raises ``CorpusError`` naming the first module that cannot be read. Costs one read of
    about 3 MB of source.
    """
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    for name in modules:
        head, tail = _split_lines(module_source(name).encode("utf-8"), VAL_FRACTION)
        train_parts += [head, _SEPARATOR]
        val_parts += [tail, _SEPARATOR]
    train_bytes = b"".join(train_parts)
    val_bytes = b"".join(val_parts)
    digest = hashlib.sha256(train_bytes + val_bytes).hexdigest()
    train = np.frombuffer(train_bytes, dtype=np.uint8)
    val = np.frombuffer(val_bytes, dtype=np.uint8)
    return BuiltinCorpus(train=train, val=val, modules=tuple(modules), digest=digest)


def code_documents(modules: tuple[str, ...] = CORPUS_MODULES) -> tuple[list[str], list[str]]:
    """The code corpus as documents for a real tokenizer: each module's training part and its
    validation part (the same line split as ``load_builtin_corpus``)."""
    train: list[str] = []
    val: list[str] = []
    for name in modules:
        head, tail = _split_lines(module_source(name).encode("utf-8"), VAL_FRACTION)
        train.append(head.decode("utf-8"))
        val.append(tail.decode("utf-8"))
    return train, val
