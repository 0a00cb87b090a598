"""Documents read from `distro-node data prepare` inputs, every read bounded.

An input is a file or a folder (every file under it, recursively, in sorted order). A file is
read by its name's ending:

- ``.jsonl`` / ``.ndjson``: one JSON object per line, the document in its ``jsonl_field``
  (a string); blank lines are skipped;
- ``.parquet``: one document per row, from the string column ``parquet_column`` (pyarrow);
- anything else: the whole file is one document of UTF-8 text.

Each document (a text file, a JSONL line, a Parquet value) is at most ``max_record_bytes``;
text must be UTF-8 without NUL bytes (binary files are refused, not tokenized as junk). Every
problem is a ``DataError`` naming the file and the line or row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from distronet.node.data.errors import DataError

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "InputFormat", "expand_inputs", "iter_documents", "total_bytes"]

DEFAULT_MAX_RECORD_BYTES = 32 * 1024 * 1024
_JSONL = (".jsonl", ".ndjson")
_PARQUET = (".parquet",)
_PARQUET_BATCH = 1024  # rows read at a time


@dataclass(frozen=True)
class InputFormat:
    """How inputs are read: the JSONL field, the Parquet column, the largest document."""

    jsonl_field: str = "text"
    parquet_column: str = "text"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES


def expand_inputs(inputs: Sequence[Path]) -> list[Path]:
    """Files named, and the files under folders named (recursive, sorted), in order."""
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


def total_bytes(files: Sequence[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def _text(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text; binary (NUL bytes, invalid UTF-8) is a ``DataError``."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raise DataError(
            f"{where}: binary data (a NUL byte at offset {nul}), not text; remove it from the inputs"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: not UTF-8 text (invalid byte at offset {exc.start}); remove it or convert it"
        ) from exc


def _read_text_file(path: Path, fmt: InputFormat) -> str:
    size = path.stat().st_size
    if size > fmt.max_record_bytes:
        raise DataError(
            f"{path}: {size} bytes is over the {fmt.max_record_bytes} byte document limit "
            "(split it, or raise --max-record-bytes)"
        )
    with path.open("rb") as fh:
        raw = fh.read(fmt.max_record_bytes + 1)
    if len(raw) > fmt.max_record_bytes:  # grew while being read
        raise DataError(f"{path}: over the {fmt.max_record_bytes} byte document limit")
    return _text(raw, str(path))


def _jsonl(path: Path, fmt: InputFormat) -> Iterator[str]:
    field = fmt.jsonl_field
    with path.open("rb") as fh:
        for lineno, raw in enumerate(iter(lambda: fh.readline(fmt.max_record_bytes + 1), b""), start=1):
            where = f"{path} line {lineno}"
            if len(raw) > fmt.max_record_bytes:
                raise DataError(
                    f"{where}: over the {fmt.max_record_bytes} byte record limit (raise --max-record-bytes)"
                )
            if not raw.strip():
                continue
            try:
                doc = json.loads(_text(raw, where))
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(doc, dict):
                raise DataError(
                    f"{where}: a JSON {type(doc).__name__}, expected an object with a {field!r} field"
                )
            if field not in doc:
                keys = ", ".join(repr(k) for k in list(doc)[:8]) or "none"
                raise DataError(
                    f"{where}: no {field!r} field (fields: {keys}); choose one with --jsonl-field"
                )
            text = doc[field]
            if not isinstance(text, str):
                raise DataError(f"{where}: field {field!r} is a {type(text).__name__}, not a string")
            yield text


def _parquet(path: Path, fmt: InputFormat) -> Iterator[str]:
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - pyarrow comes with the data extra
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'distro-node[data]'") from exc
    col = fmt.parquet_column
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    schema = pf.schema_arrow
    if col not in schema.names:
        names = ", ".join(repr(n) for n in schema.names[:8])
        raise DataError(f"{path}: no column {col!r} (columns: {names}); choose one with --parquet-column")
    kind = schema.field(col).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{path}: column {col!r} is {kind}, not a string column")
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, columns=[col]):
            for value in batch.column(0).to_pylist():
                where = f"{path} row {row}"
                if value is None:
                    raise DataError(f"{where}: column {col!r} is null")
                if len(value) > fmt.max_record_bytes or len(value.encode("utf-8")) > fmt.max_record_bytes:
                    raise DataError(f"{where}: over the {fmt.max_record_bytes} byte record limit")
                if "\0" in value:
                    raise DataError(f"{where}: binary data (a NUL character), not text")
                row += 1
                yield value
    except pa.ArrowException as exc:
        raise DataError(f"{path} row {row}: cannot read Parquet data ({exc})") from None


def iter_documents(files: Sequence[Path], fmt: InputFormat) -> Iterator[tuple[Path, str]]:
    """(file, document text) for every document of ``files``, in order (module docstring)."""
    for f in files:
        name = f.name.lower()
        try:
            if name.endswith(_JSONL):
                for text in _jsonl(f, fmt):
                    yield f, text
            elif name.endswith(_PARQUET):
                for text in _parquet(f, fmt):
                    yield f, text
            else:
                yield f, _read_text_file(f, fmt)
        except OSError as exc:
            raise DataError(f"cannot read input {f}: {exc.strerror or exc}") from exc
