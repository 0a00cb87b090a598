"""The transfer probe (``GET``/``POST /api/v1/runs/{run_id}/probe``) on a real aiohttp server:
sizes bounded before use, unknown runs refused, the OpenAPI entry present."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import LocalCoordinator, local_coordinator
from distronet.protocol.limits import MAX_PROBE_BYTES

TOKEN = "operator-secret-token"


@pytest.fixture
async def lc(tmp_path: Path) -> AsyncIterator[LocalCoordinator]:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    async with local_coordinator(cfg) as lc:
        shard = {"id": "s0", "url": "https://data.example/0", "sha256": "ab" * 32, "tokens": 10, "bytes": 10}
        manifest = {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": [shard]}
        body = {"id": "r1", "data": {"manifest": manifest}}
        async with (
            aiohttp.ClientSession() as http,
            http.post(lc.url + "/api/v1/runs", json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as r,
        ):
            assert r.status == 201
        yield lc


async def test_download_probe_sends_exactly_the_bytes_asked_within_the_limit(lc: LocalCoordinator) -> None:
    url = lc.url + "/api/v1/runs/r1/probe"
    async with aiohttp.ClientSession(auto_decompress=False) as http:
        async with http.get(url, params={"bytes": "100000"}) as r:
            data = await r.read()
            assert r.status == 200 and r.headers["Content-Type"] == "application/octet-stream"
        assert len(data) == 100_000 and len(set(data)) > 200  # noise, not a run of one byte
        async with http.get(url, params={"bytes": str(MAX_PROBE_BYTES)}) as r:
            assert r.status == 200 and len(await r.read()) == MAX_PROBE_BYTES
        for bad in (str(MAX_PROBE_BYTES + 1), "0", "-5", "1e3", "", "9" * 40):
            async with http.get(url, params={"bytes": bad}) as r:
                err = (await r.json())["error"]
                assert r.status == 400 and err["code"] == "invalid_field" and err["field"] == "query.bytes"
        async with http.get(lc.url + "/api/v1/runs/nope/probe", params={"bytes": "10"}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"


async def test_upload_probe_counts_the_body_and_refuses_one_over_the_limit(lc: LocalCoordinator) -> None:
    url = lc.url + "/api/v1/runs/r1/probe"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=io.BytesIO(b"\x07" * 123_456)) as r:
            assert r.status == 200 and await r.json() == {"bytes": 123_456}
        async with http.post(url, data=io.BytesIO(b"x" * (MAX_PROBE_BYTES + 1))) as r:
            assert r.status == 413 and (await r.json())["error"]["code"] == "too_large"

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: refused while it is read
            for _ in range(5):
                yield b"y" * (MAX_PROBE_BYTES // 4)

        async with http.post(url, data=chunks()) as r:
            assert r.status == 413
        async with http.post(lc.url + "/api/v1/runs/nope/probe", data=b"z") as r:
            assert r.status == 404
        async with http.get(lc.url + "/api/v1/openapi.json") as r:
            doc = await r.json()
    ops = doc["paths"]["/api/v1/runs/{run_id}/probe"]
    assert ops["get"]["operationId"] == "probe_down" and ops["post"]["operationId"] == "probe_up"
    query = [p for p in ops["get"]["parameters"] if p["in"] == "query"]
    assert query[0]["name"] == "bytes" and query[0]["schema"]["maximum"] == MAX_PROBE_BYTES
