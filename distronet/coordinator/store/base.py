"""The store interface and the rows it keeps (:func:`.factory.open_store` picks a backend by URL).

Rows are plain tuples in the column order of :data:`TABLES`. A :class:`Batch` holds the latest
row per primary key (a later put of the same key replaces the earlier one) and is committed in
one transaction: either every row of it is durable or none is.

Errors::

    DistroError
    └── CoordinatorError          (distronet.coordinator.errors)
        └── StoreError            the database could not be opened, migrated or written
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from distronet.coordinator.errors import CoordinatorError

__all__ = ["TABLES", "Batch", "Row", "Snapshot", "Store", "StoreError", "upsert_sql"]

Row = tuple[Any, ...]


class StoreError(CoordinatorError):
    """The database could not be opened, migrated or written."""


# table -> (columns, primary-key column count). Receipts are insert-once (never updated).
TABLES: dict[str, tuple[tuple[str, ...], int]] = {
    "runs": (("id", "config", "state", "created_at"), 1),
    "units": (
        (
            "run_id", "unit", "state", "lease_token", "holder", "leased_at", "expires_at",
            "completed_by", "completed_at", "issues",
        ),
        2,
    ),
    "nodes": (
        (
            "run_id", "peer_id", "state", "multiaddrs", "agent", "joined_at", "last_seen",
            "uptime_s", "tokens", "shards", "steps", "speed", "last_step",
        ),
        2,
    ),
    "join_tokens": (("run_id", "token_hash", "uses_left", "expires_at"), 2),
    "receipts": (("run_id", "producer", "step", "acceptor", "payload_sha256", "received_at"), 3),
}  # fmt: skip
COMMIT_ORDER = ("runs", "units", "nodes", "join_tokens", "receipts")


def upsert_sql(table: str, placeholder: str = "?") -> str:
    """``INSERT ... ON CONFLICT (pk) DO UPDATE`` for ``table`` (receipts: ``DO NOTHING``).

    ``placeholder`` is ``?`` (SQLite) or ``$`` (PostgreSQL, numbered ``$1..$n``).
    """
    cols, npk = TABLES[table]
    marks = ", ".join("?" if placeholder == "?" else f"${i + 1}" for i in range(len(cols)))
    pk = ", ".join(cols[:npk])
    if table == "receipts":
        action = "DO NOTHING"
    else:
        action = "DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in cols[npk:])
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks}) ON CONFLICT ({pk}) {action}"


class Batch:
    """Rows waiting for one transaction; the latest row per primary key wins."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: dict[str, dict[Row, Row]] = {t: {} for t in COMMIT_ORDER}

    def put(self, table: str, row: Row) -> None:
        """Stage ``row`` (a full row of ``table``); replaces a staged row with the same key."""
        npk = TABLES[table][1]
        self.rows[table][row[:npk]] = row

    def __len__(self) -> int:
        return sum(len(r) for r in self.rows.values())

    def ordered(self) -> list[tuple[str, list[Row]]]:
        """(table, rows) in commit order, empty tables left out."""
        return [(t, list(self.rows[t].values())) for t in COMMIT_ORDER if self.rows[t]]


@dataclass
class Snapshot:
    """Everything a store holds, table by table (row tuples in :data:`TABLES` column order)."""

    tables: dict[str, list[Row]] = field(default_factory=lambda: {t: [] for t in COMMIT_ORDER})


class Store(abc.ABC):
    """A durable mirror of the coordinator's state. One writer (the coordinator) at a time."""

    url_scheme: str = ""

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect, create the schema if absent and apply pending migrations. Raises StoreError."""

    @abc.abstractmethod
    async def commit(self, batch: Batch) -> None:
        """Write every row of ``batch`` in one transaction; durable when this returns."""

    @abc.abstractmethod
    async def load(self) -> Snapshot:
        """Every row of every table."""

    @abc.abstractmethod
    async def schema_version(self) -> int:
        """The highest migration applied."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connection(s). Idempotent."""
