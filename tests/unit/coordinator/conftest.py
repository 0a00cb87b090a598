"""Fixtures of the coordinator's unit tests: a run definition and store backends."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from distronet.coordinator.store import Store, open_store

PG_URL = os.environ.get("DISTRO_TEST_POSTGRES", "postgresql://distro:distro@127.0.0.1:5432/distro_test")
# pytest-xdist's worker id (gw0, gw1, ...); unset in a serial run
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


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


def worker_pg_url(url: str, worker: str) -> str:
    """The database of one xdist worker: ``<database>_<worker>`` on the same server (each worker
    drops and recreates the store's tables, so two workers must not share one); ``url`` itself
    in a serial run."""
    if not worker:
        return url
    if not re.fullmatch(r"gw[0-9]+", worker):
        raise ValueError(f"unexpected PYTEST_XDIST_WORKER {worker!r}")
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/') or '/distro_test'}_{worker}"))


async def _pg_reachable(url: str) -> bool:
    """Whether ``url``'s server answers; its database is created (from ``PG_URL``'s) when missing,
    and emptied of the store's tables."""
    try:
        import asyncpg
    except ImportError:
        return False
    try:
        conn = await asyncpg.connect(url, timeout=3)
    except asyncpg.InvalidCatalogNameError:  # a worker's database, not made yet
        try:
            admin = await asyncpg.connect(PG_URL, timeout=3)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        try:
            await admin.execute(f'CREATE DATABASE "{urlsplit(url).path.lstrip("/")}"')
        except asyncpg.DuplicateDatabaseError:
            pass
        finally:
            await admin.close()
        conn = await asyncpg.connect(url, timeout=3)
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
        url = worker_pg_url(PG_URL, XDIST_WORKER)
        if not await _pg_reachable(url):
            pytest.skip(f"no PostgreSQL server at {PG_URL.split('@')[-1]} (set DISTRO_TEST_POSTGRES)")
        yield url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    await s.open()
    yield s
    await s.close()
