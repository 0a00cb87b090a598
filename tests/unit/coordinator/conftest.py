"""Fixtures of the coordinator's unit tests: a run definition and store backends."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from distronet.coordinator.store import Store, open_store

PG_URL = os.environ.get("DISTRO_TEST_POSTGRES", "postgresql://distro:distro@127.0.0.1:5432/distro_test")


def make_spec(run_id: str = "r1", shards: int = 10, **data: Any) -> dict[str, Any]:
    """A CreateRun body with ``shards`` URL shards of 100 tokens each."""
    manifest = {
        "version": 1,
        "tokenizer": "byte",
        "dtype": "uint8",
        "shards": [
            {
                "id": f"s{i}",
                "url": f"https://data.example/{i}",
                "sha256": "ab" * 32,
                "tokens": 100,
                "bytes": 100,
            }
            for i in range(shards)
        ],
    }
    # min_steps 0: these tests are about leases, not credit (test_coordinator_credit.py is)
    return {"id": run_id, "data": {"manifest": manifest, **data}, "credit": {"min_steps": 0}}


@pytest.fixture
def spec_factory() -> Callable[..., dict[str, Any]]:
    return make_spec


async def _pg_reachable() -> bool:
    try:
        import asyncpg
    except ImportError:
        return False
    try:
        conn = await asyncpg.connect(PG_URL, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    await conn.execute(
        "DROP TABLE IF EXISTS runs, units, nodes, receipts, join_tokens, schema_migrations CASCADE"
    )
    await conn.close()
    return True


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A fresh, empty database URL of each backend (PostgreSQL only when a server is reachable)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'c.db'}"
    else:
        if not await _pg_reachable():
            pytest.skip(f"no PostgreSQL server at {PG_URL.split('@')[-1]} (set DISTRO_TEST_POSTGRES)")
        yield PG_URL


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    await s.open()
    yield s
    await s.close()
