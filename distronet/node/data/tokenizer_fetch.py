"""The run's tokenizer on a node: fetched from the coordinator once, verified, cached by sha256.

A run whose manifest names a tokenizer (version 2: ``tokenizer_sha256`` in the run info's
``data``) is served it at ``GET /api/v1/runs/{run}/tokenizer.json``. At join a node keeps it in
its data dir::

    tokenizers/<sha256>.json          the file, only once its sha256 is the run's
    tokenizers/run-<run_id>.sha256    which of them is the run's (`distro-node export` reads it)

A file already cached under the run's sha256 (and still hashing to it) is used as it is: no
download. A download is streamed to a temporary file beside the cache and renamed to the final
name only after its sha256 is checked; a body larger than ``MAX_TOKENIZER_BYTES``
(``protocol/limits.py``), declared or sent, is cut off before it is kept. Nothing is parsed
until it is verified, and then only by ``tokenizers`` (JSON), never executed.

Errors::

    DataError
    └── TokenizerError             the run's tokenizer cannot be had (malformed run info, ...)
        ├── TokenizerNotServed     the coordinator answers 404: it serves no tokenizer for the run
        ├── TokenizerUnavailable   no answer, a timeout, a 5xx or 429: try again later
        └── TokenizerMismatch      the bytes served are not the run's: sha256 differs, or too large
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from distronet.node.data.errors import DataError
from distronet.protocol.coordinator_api import API_PREFIX
from distronet.protocol.limits import MAX_TOKENIZER_BYTES

__all__ = [
    "FETCH_TIMEOUT_S",
    "TOKENIZER_DIR",
    "TokenizerError",
    "TokenizerMismatch",
    "TokenizerNotServed",
    "TokenizerUnavailable",
    "bounded_sha256",
    "cached_tokenizer",
    "ensure_run_tokenizer",
    "fetch_tokenizer",
    "run_tokenizer_sha",
    "tokenizer_url",
]

TOKENIZER_DIR = "tokenizers"
FETCH_TIMEOUT_S = 120.0  # the whole download (64 MiB at ~4 Mbit/s)
MAX_ERROR_BYTES = 4096  # of a refusal's body, read to say why
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_RUN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_BLOCK = 1 << 16


class TokenizerError(DataError):
    """The run's tokenizer cannot be fetched or used."""


class TokenizerNotServed(TokenizerError):
    """The coordinator serves no tokenizer for this run (404)."""


class TokenizerUnavailable(TokenizerError):
    """The coordinator did not answer usefully (unreachable, timeout, 5xx, 429): retry later."""


class TokenizerMismatch(TokenizerError):
    """What the coordinator sent is not the tokenizer its run info names (sha256, size)."""


def _folder(data_dir: Path) -> Path:
    return Path(data_dir) / TOKENIZER_DIR


def _check_sha(sha256: object) -> str:
    if not isinstance(sha256, str) or not _SHA_RE.match(sha256):
        raise TokenizerError(
            f"the run's tokenizer_sha256 {str(sha256)[:80]!r} is not 64 lower-case hex digits"
        )
    return sha256


def bounded_sha256(path: Path, max_bytes: int = MAX_TOKENIZER_BYTES) -> str | None:
    """sha256 of ``path`` when it is a regular file of at most ``max_bytes``; else None."""
    try:
        if not path.is_file() or path.stat().st_size > max_bytes:
            return None
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def cached_tokenizer(data_dir: Path, sha256: str, *, max_bytes: int = MAX_TOKENIZER_BYTES) -> Path | None:
    """The cached tokenizer of ``sha256`` under ``data_dir`` when it is there and still hashes to
    ``sha256`` (at most ``max_bytes``); else None. Costs one read and hash of the file."""
    path = _folder(data_dir) / f"{_check_sha(sha256)}.json"
    return path if bounded_sha256(path, max_bytes) == sha256 else None


def run_tokenizer_sha(data_dir: Path, run_id: str) -> str | None:
    """The sha256 this data dir recorded as run ``run_id``'s tokenizer (at join), or None."""
    if not _RUN_RE.match(run_id):
        return None
    try:
        with (_folder(data_dir) / f"run-{run_id}.sha256").open("rb") as f:
            text = f.read(128).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if _SHA_RE.match(text) else None


def _record_run(data_dir: Path, run_id: str, sha256: str) -> None:
    if not _RUN_RE.match(run_id):
        raise TokenizerError(f"run id {run_id[:80]!r} cannot name a file")
    path = _folder(data_dir) / f"run-{run_id}.sha256"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(sha256 + "\n", encoding="ascii")
    os.replace(tmp, path)


def tokenizer_url(base_url: str, run_id: str) -> str:
    """Where the coordinator at ``base_url`` serves run ``run_id``'s tokenizer."""
    return f"{base_url.rstrip('/')}{API_PREFIX}/runs/{quote(run_id, safe='')}/tokenizer.json"


async def _refusal(r: aiohttp.ClientResponse) -> str:
    """The error message of a refusal's JSON body (bounded), else its status."""
    raw = await r.content.read(MAX_ERROR_BYTES)
    with contextlib.suppress(ValueError, AttributeError):
        return str(json.loads(raw)["error"]["message"])[:300]
    return f"HTTP {r.status}"


async def _download(url: str, out: Any, h: Any, max_bytes: int, timeout_s: float) -> int:
    """Stream ``url``'s body into ``out`` and ``h`` (a hash), at most ``max_bytes``; its length.
    Raises the errors ``fetch_tokenizer`` names."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    got = 0
    try:
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
            if r.status == 404:
                raise TokenizerNotServed(
                    f"the coordinator serves no tokenizer for the run: {await _refusal(r)}"
                )
            if r.status >= 500 or r.status == 429:
                raise TokenizerUnavailable(f"the coordinator answered {r.status} for the run's tokenizer")
            if r.status != 200:
                raise TokenizerError(f"the coordinator refused the run's tokenizer: {await _refusal(r)}")
            if r.content_length is not None and r.content_length > max_bytes:
                raise TokenizerMismatch(
                    f"the coordinator declares a tokenizer of {r.content_length} bytes, "
                    f"over the {max_bytes} byte limit"
                )
            async for block in r.content.iter_chunked(_BLOCK):
                got += len(block)
                if got > max_bytes:
                    raise TokenizerMismatch(
                        f"the coordinator sent more than the {max_bytes} byte tokenizer limit"
                    )
                h.update(block)
                out.write(block)
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise TokenizerUnavailable(f"the run's tokenizer could not be downloaded: {e!r}") from e
    return got


async def fetch_tokenizer(
    base_url: str,
    run_id: str,
    sha256: str,
    data_dir: Path,
    *,
    max_bytes: int = MAX_TOKENIZER_BYTES,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Path:
    """Download run ``run_id``'s tokenizer from the coordinator at ``base_url`` and keep it as
    ``tokenizers/<sha256>.json`` once its sha256 is ``sha256`` (module doc). Returns the path.

    Raises ``TokenizerNotServed`` (404), ``TokenizerUnavailable`` (no answer, timeout, 5xx,
    429), ``TokenizerMismatch`` (over ``max_bytes`` declared or sent, or another sha256: nothing
    is left under the final name) and ``TokenizerError`` for any other refusal.
    """
    sha256 = _check_sha(sha256)
    folder = _folder(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{sha256[:16]}.", suffix=".part")
    part, h = Path(tmp_name), hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            got = await _download(tokenizer_url(base_url, run_id), out, h, max_bytes, timeout_s)
        if h.hexdigest() != sha256:
            raise TokenizerMismatch(
                f"the coordinator sent a tokenizer ({got} bytes) with sha256 {h.hexdigest()}, but the "
                f"run names {sha256}: refused (a coordinator or proxy that changes files?)"
            )
        final = folder / f"{sha256}.json"
        os.replace(part, final)
    finally:
        part.unlink(missing_ok=True)
    return final


async def ensure_run_tokenizer(
    base_url: str,
    run_id: str,
    data: dict[str, Any],
    data_dir: Path,
    *,
    max_bytes: int = MAX_TOKENIZER_BYTES,
    timeout_s: float = FETCH_TIMEOUT_S,
) -> Path | None:
    """The run's verified tokenizer under ``data_dir``: the cached file when it is there (no
    download), else fetched (``fetch_tokenizer``); recorded as the run's. None when the run
    info's ``data`` names no tokenizer (byte-level data). Raises what ``fetch_tokenizer``
    raises, and ``TokenizerError`` for a malformed ``tokenizer_sha256``."""
    raw = data.get("tokenizer_sha256") if isinstance(data, dict) else None
    if raw is None:
        return None
    sha256 = _check_sha(raw)
    path = await asyncio.to_thread(cached_tokenizer, data_dir, sha256, max_bytes=max_bytes)
    if path is None:
        path = await fetch_tokenizer(
            base_url, run_id, sha256, data_dir, max_bytes=max_bytes, timeout_s=timeout_s
        )
    _record_run(data_dir, run_id, sha256)
    return path
