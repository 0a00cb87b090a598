"""The layout digest: 32 bytes that pin which tensors a run exchanges, their shapes and chunking.

Every step packet carries the digest of its sender's layout; a receiver rejects a packet whose
digest differs from its own (``LAYOUT_MISMATCH``), so tensor ids in a payload always mean the
same tensors on both sides.

Canonical encoding (all integers big-endian, unsigned)::

    "distronet/layout/v1" 0x00          domain tag, 20 bytes
    u32   number of entries
    per entry, in the order given (the position is the tensor id):
      u16   length of the name in UTF-8 bytes, then the name's UTF-8 bytes
      u8    rank r (0 for a scalar)
      u64   each of the r dimensions
      u32   chunk size s
    digest = SHA-256(encoding)
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence

from distronet.protocol.errors import ConfigError
from distronet.protocol.limits import DEFAULT_LIMITS, Limits

__all__ = ["LAYOUT_DIGEST_BYTES", "LayoutEntry", "layout_canonical_bytes", "layout_digest"]

LAYOUT_DOMAIN = b"distronet/layout/v1\x00"
LAYOUT_DIGEST_BYTES = 32

LayoutEntry = tuple[str, tuple[int, ...], int]
"""(parameter name, shape, chunk size)."""


def _int(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"layout: {what} must be an int in [{lo}, {hi}], got {value!r}")
    return value


def layout_canonical_bytes(entries: Sequence[LayoutEntry], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The canonical byte string of a layout (see the module docstring).

    Raises ConfigError on a name that is empty, repeated, not a str or longer than
    ``limits.max_tensor_name_len`` bytes; a rank over ``limits.max_dims``; a dimension outside
    ``[1, limits.max_dim_size]``; more than ``limits.max_tensor_numel`` elements; a chunk
    outside ``[1, 2**32 - 1]``; more than ``limits.max_tensors`` entries. Cost: linear in the
    number of entries.
    """
    _int(len(entries), "number of tensors", 0, limits.max_tensors)
    out = [LAYOUT_DOMAIN, struct.pack(">I", len(entries))]
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise ConfigError(f"layout entry {i} must be (name, shape, chunk), got {entry!r}")
        name, shape, chunk = entry
        if not isinstance(name, str) or not name:
            raise ConfigError(f"layout entry {i}: name must be a non-empty str, got {name!r}")
        if name in seen:
            raise ConfigError(f"layout entry {i}: name {name!r} appears twice")
        seen.add(name)
        raw = name.encode("utf-8", errors="strict")
        _int(len(raw), f"entry {i} name length in bytes", 1, min(limits.max_tensor_name_len, 0xFFFF))
        if not isinstance(shape, tuple | list):
            raise ConfigError(f"layout entry {i}: shape must be a tuple of ints, got {shape!r}")
        _int(len(shape), f"entry {i} rank", 0, min(limits.max_dims, 0xFF))
        dims = [_int(d, f"entry {i} dimension", 1, limits.max_dim_size) for d in shape]
        _int(math.prod(dims), f"entry {i} element count", 1, limits.max_tensor_numel)
        _int(chunk, f"entry {i} chunk", 1, 0xFFFFFFFF)
        out.append(struct.pack(">H", len(raw)))
        out.append(raw)
        out.append(struct.pack(f">B{len(dims)}QI", len(dims), *dims, chunk))
    return b"".join(out)


def layout_digest(entries: Sequence[LayoutEntry], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """SHA-256 of :func:`layout_canonical_bytes` (32 bytes). Raises ConfigError like it."""
    return hashlib.sha256(layout_canonical_bytes(entries, limits)).digest()
