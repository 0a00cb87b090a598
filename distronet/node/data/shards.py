"""Fetch a leased shard from the coordinator (or its URL) into the data dir, verified by sha256.

A shard already on disk with the right size and hash is reused. Downloads go to a ``.part``
file and are renamed once verified; the whole fetch has a deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import aiohttp
import numpy as np

from distronet.node.daemon.coordinator_client import Lease
from distronet.node.data.errors import ShardIntegrityError
from distronet.node.data.manifest import DTYPES, check_tokens

__all__ = ["fetch_shard", "shard_tokens"]

MAX_SHARD_BYTES = 4 * 2**30


def _ok(path: Path, lease: Lease) -> bool:
    if not path.exists() or path.stat().st_size != lease.bytes:
        return False
    return hashlib.sha256(path.read_bytes()).hexdigest() == lease.sha256


async def fetch_shard(base_url: str, lease: Lease, folder: Path, *, timeout_s: float = 300.0) -> Path:
    """The shard of ``lease`` as a verified local file under ``folder``.

    Raises ``ShardIntegrityError`` (size or hash wrong, too large) or ``aiohttp.ClientError`` /
    ``asyncio.TimeoutError`` when the download fails or runs past ``timeout_s``.
    """
    if not 0 <= lease.bytes <= MAX_SHARD_BYTES:
        raise ShardIntegrityError(lease.shard_id, f"declared size {lease.bytes} is out of range")
    folder.mkdir(parents=True, exist_ok=True)
    safe = hashlib.sha256(lease.shard_id.encode()).hexdigest()[:16]
    path = folder / f"{safe}.bin"
    if _ok(path, lease):
        return path
    url = lease.url if lease.url.startswith(("http://", "https://")) else base_url.rstrip("/") + lease.url
    part = path.with_name(path.name + ".part")
    h, got = hashlib.sha256(), 0
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
        r.raise_for_status()
        with open(part, "wb") as fh:
            async for block in r.content.iter_chunked(1 << 20):
                got += len(block)
                if got > lease.bytes:
                    raise ShardIntegrityError(lease.shard_id, f"more than the declared {lease.bytes} bytes")
                h.update(block)
                fh.write(block)
    if got != lease.bytes or h.hexdigest() != lease.sha256:
        part.unlink(missing_ok=True)
        raise ShardIntegrityError(lease.shard_id, f"downloaded {got} bytes, sha256 {h.hexdigest()} mismatch")
    await asyncio.to_thread(part.replace, path)
    return path


def shard_tokens(path: Path, dtype: str, vocab_size: int | None = None) -> np.ndarray:
    """The shard's tokens (1-D, native byte order) read as the manifest's little-endian ``dtype``.

    Checked before use: the file is at most ``MAX_SHARD_BYTES`` and a whole number of tokens,
    and (when ``vocab_size`` is given, or 256 for ``uint8``) every id is below the vocabulary.
    Raises ``ShardIntegrityError`` naming the file for an unknown dtype and each of these.
    """
    if dtype not in DTYPES:
        raise ShardIntegrityError(path.name, f"unknown token dtype {dtype!r}")
    dt = DTYPES[dtype]
    size = path.stat().st_size
    if size > MAX_SHARD_BYTES:
        raise ShardIntegrityError(path.name, f"{size} bytes is over the {MAX_SHARD_BYTES} byte limit")
    if size % dt.itemsize:
        raise ShardIntegrityError(path.name, f"{size} bytes is not a whole number of {dtype} tokens")
    tokens = np.fromfile(path, dtype=dt)
    if vocab_size is not None:
        check_tokens(tokens, vocab_size, path.name)
    return tokens.astype(dt.newbyteorder("="), copy=False)
