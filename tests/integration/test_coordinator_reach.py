"""A heartbeat's ``reach`` lands on the node's record (``/nodes``); a bad one is refused whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import LocalCoordinator, local_coordinator
from distronet.node.daemon.coordinator_client import CoordinatorClient, CoordinatorRefused
from distronet.protocol.coordinator_api import REACH_MAX_LINKS
from distronet.protocol.identity import Identity

TOKEN = "operator-secret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHARD = {"id": "s0", "url": "https://data.example/0", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
RUN = {
    "id": "r1",
    "data": {"manifest": {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": [SHARD]}},
}


@pytest.fixture
async def lc(tmp_path: Path) -> AsyncIterator[LocalCoordinator]:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    async with local_coordinator(cfg) as lc, aiohttp.ClientSession() as http:
        async with http.post(lc.url + "/api/v1/runs", json=RUN, headers=AUTH) as r:
            assert r.status == 201, await r.text()
        yield lc


async def _record(lc: LocalCoordinator, peer: str) -> dict[str, object]:
    async with aiohttp.ClientSession() as http, http.get(lc.url + "/api/v1/runs/r1/nodes") as r:
        nodes = (await r.json())["nodes"]
    (mine,) = [n for n in nodes if n["peer_id"] == peer]
    return dict(mine)


async def test_reach_is_recorded_kept_when_absent_and_refused_when_bad(lc: LocalCoordinator) -> None:
    me = Identity.generate()
    async with CoordinatorClient(lc.url, "r1", me) as c:
        await c.join()
        assert (await _record(lc, me.peer_id_b58))["reach"] is None  # nothing reported yet
        good = {"direct": 1, "hole_punched": 0, "relayed": 2, "diagnosis": ""}
        assert await c.heartbeat(3, reach=good) is not None
        assert (await _record(lc, me.peer_id_b58))["reach"] == good
        await c.heartbeat(4)  # a heartbeat without reach keeps the last one
        assert (await _record(lc, me.peer_id_b58))["reach"] == good
        for bad in (
            {"direct": REACH_MAX_LINKS + 1, "hole_punched": 0, "relayed": 0},
            {"direct": 0, "hole_punched": 0, "relayed": 0, "diagnosis": "<script>"},
        ):
            with pytest.raises(CoordinatorRefused):
                await c.heartbeat(5, reach=bad)
        record = await _record(lc, me.peer_id_b58)
        assert record["reach"] == good and record["last_step"] == 4  # the refused calls changed nothing
        lost = {"direct": 0, "hole_punched": 0, "relayed": 0, "diagnosis": "no_relay"}
        await c.heartbeat(6, reach=lost)
        assert (await _record(lc, me.peer_id_b58))["reach"] == lost
