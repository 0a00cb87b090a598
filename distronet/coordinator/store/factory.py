""":func:`open_store`: a database URL picks the backend (SQLite or PostgreSQL)."""

from __future__ import annotations

from distronet.coordinator.store.base import Store, StoreError
from distronet.coordinator.store.postgres import PostgresStore
from distronet.coordinator.store.sqlite import SqliteStore

__all__ = ["open_store"]


def open_store(url: str, *, synchronous: str = "FULL") -> Store:
    """A store for ``url``: ``sqlite:///abs/path.db`` (or ``sqlite:relative.db``) or ``postgresql://…``.

    ``synchronous`` (SQLite only): ``FULL`` or ``NORMAL``. The store is not opened yet:
    ``await store.open()``. Raises StoreError on an unknown scheme or a bad option.
    """
    if url.startswith("sqlite:"):
        path = url[len("sqlite:") :]
        if path.startswith("///"):
            path = path[2:]
        elif path.startswith("//"):
            raise StoreError(f"{url!r}: write sqlite:///absolute/path.db or sqlite:relative.db")
        if not path:
            raise StoreError(f"{url!r} names no file")
        return SqliteStore(path, synchronous=synchronous)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    raise StoreError(f"unknown database URL {url.split(':', 1)[0]!r}: use sqlite:///path or postgresql://...")
