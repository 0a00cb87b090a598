"""Durable storage of the coordinator's state behind one interface: SQLite (default) or PostgreSQL.

The coordinator keeps its working state in memory and mirrors every change into a store as
whole-row upserts, committed in groups (:mod:`distronet.coordinator.groupcommit`); on start it
rebuilds the memory state from :meth:`Store.load`. Both backends run the same versioned
migrations (:mod:`.migrations`) and pass the same test-suite.

Modules: ``base`` (the interface, the rows), ``factory`` (:func:`open_store`), ``sqlite``
(the parent side of SQLite: open, migrate, load), ``sqlite_writer`` (the one writer: a child
process), ``sqlite_db`` (pragmas, upserts, transactions; shared by both sides), ``postgres``,
``migrations``.
"""

from __future__ import annotations

from distronet.coordinator.store.base import Batch, Snapshot, Store, StoreError
from distronet.coordinator.store.factory import open_store

__all__ = ["Batch", "Snapshot", "Store", "StoreError", "open_store"]
