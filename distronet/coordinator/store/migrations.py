"""Versioned schema migrations, shared by every backend (portable SQL: SQLite >= 3.24, PostgreSQL).

Append a new ``(version, statements)`` entry to change the schema; never edit one that shipped.
A store applies, in one transaction each, every migration above the version it finds recorded.
"""

from __future__ import annotations

__all__ = ["LATEST", "MIGRATIONS", "VERSION_TABLE"]

VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)"
)

MIGRATIONS: list[tuple[int, list[str]]] = [
    (
        1,
        [
            """CREATE TABLE runs (
                id TEXT PRIMARY KEY,
                config TEXT NOT NULL,
                state TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL)""",
            """CREATE TABLE units (
                run_id TEXT NOT NULL,
                unit BIGINT NOT NULL,
                state SMALLINT NOT NULL,
                lease_token TEXT,
                holder TEXT,
                leased_at DOUBLE PRECISION,
                expires_at DOUBLE PRECISION,
                completed_by TEXT,
                completed_at DOUBLE PRECISION,
                issues INTEGER NOT NULL,
                PRIMARY KEY (run_id, unit))""",
            """CREATE TABLE nodes (
                run_id TEXT NOT NULL,
                peer_id TEXT NOT NULL,
                state SMALLINT NOT NULL,
                multiaddrs TEXT NOT NULL,
                agent TEXT NOT NULL,
                joined_at DOUBLE PRECISION NOT NULL,
                last_seen DOUBLE PRECISION NOT NULL,
                uptime_s DOUBLE PRECISION NOT NULL,
                tokens BIGINT NOT NULL,
                shards BIGINT NOT NULL,
                steps BIGINT NOT NULL,
                speed DOUBLE PRECISION NOT NULL,
                last_step BIGINT NOT NULL,
                PRIMARY KEY (run_id, peer_id))""",
            """CREATE TABLE receipts (
                run_id TEXT NOT NULL,
                producer TEXT NOT NULL,
                step BIGINT NOT NULL,
                acceptor TEXT NOT NULL,
                payload_sha256 TEXT NOT NULL,
                received_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (run_id, producer, step))""",
            """CREATE TABLE join_tokens (
                run_id TEXT NOT NULL,
                token_hash TEXT NOT NULL,
                uses_left BIGINT NOT NULL,
                expires_at DOUBLE PRECISION NOT NULL,
                PRIMARY KEY (run_id, token_hash))""",
        ],
    ),
    (
        2,
        [
            "CREATE INDEX units_by_state ON units (run_id, state)",
            "CREATE INDEX nodes_by_tokens ON nodes (run_id, tokens)",
        ],
    ),
]

LATEST = MIGRATIONS[-1][0]
