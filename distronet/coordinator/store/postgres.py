"""The PostgreSQL store (asyncpg), for operators who outgrow one SQLite file.

Same tables, same migrations, same upserts as SQLite. ``asyncpg`` is the ``postgres`` extra:
``pip install 'distro-node[postgres]'``. Migrations take an advisory lock so two coordinators
starting at once do not both migrate.
"""

from __future__ import annotations

import time
from typing import Any

from distronet.coordinator.store.base import TABLES, Batch, Snapshot, Store, StoreError, upsert_sql
from distronet.coordinator.store.migrations import MIGRATIONS, VERSION_TABLE

__all__ = ["PostgresStore"]

_SQL = {t: upsert_sql(t, "$") for t in TABLES}
_LOCK_KEY = 0x44495354  # "DIST"


class PostgresStore(Store):
    """PostgreSQL through one asyncpg connection (the coordinator is the only writer)."""

    url_scheme = "postgresql"

    def __init__(self, url: str, *, connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self.connect_timeout_s = connect_timeout_s
        self._conn: Any = None

    async def open(self) -> None:
        try:
            import asyncpg
        except ImportError as e:
            raise StoreError("PostgreSQL needs asyncpg: pip install 'distro-node[postgres]'") from e
        try:
            self._conn = await asyncpg.connect(self.url, timeout=self.connect_timeout_s)
            conn = self._conn
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
                await conn.execute(VERSION_TABLE)
                current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
                for version, statements in MIGRATIONS:
                    if version <= current:
                        continue
                    for stmt in statements:
                        await conn.execute(stmt)
                    await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2)", version, time.time())
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            await self.close()
            host = self.url.split("@")[-1]
            raise StoreError(f"cannot open PostgreSQL database at {host!r}: {e}") from e

    def _c(self) -> Any:
        if self._conn is None:
            raise StoreError("store is not open")
        return self._conn

    async def commit(self, batch: Batch) -> None:
        work = batch.ordered()
        if not work:
            return
        import asyncpg

        conn = self._c()
        try:
            async with conn.transaction():
                for table, rows in work:
                    await conn.executemany(_SQL[table], rows)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise StoreError(f"PostgreSQL commit failed: {e}") from e

    async def load(self) -> Snapshot:
        conn = self._c()
        snap = Snapshot()
        for table, (cols, npk) in TABLES.items():
            order = ", ".join(cols[:npk])
            rows = await conn.fetch(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {order}")
            snap.tables[table] = [tuple(r) for r in rows]
        return snap

    async def schema_version(self) -> int:
        return int(await self._c().fetchval("SELECT MAX(version) FROM schema_migrations"))

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()
