"""The hot path's route match: it takes exactly the four hot node routes, and a call answered
through it is answered as the router would (same auth, errors, durability and metrics)."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.hotpath import match_hot
from distronet.coordinator.local import local_coordinator
from distronet.node.daemon.coordinator_client import CoordinatorClient
from distronet.protocol.coordinator_api import sign_request
from distronet.protocol.identity import Identity

TOKEN = "fast-path-operator-token"


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/api/v1/runs/r1/heartbeat", ("heartbeat", {"run_id": "r1"})),
        ("/api/v1/runs/r-1.x/leases", ("lease", {"run_id": "r-1.x"})),
        ("/api/v1/runs/r1/leases/17/renew", ("renew", {"run_id": "r1", "unit": "17"})),
        ("/api/v1/runs/r1/leases/17/complete", ("complete", {"run_id": "r1", "unit": "17"})),
        ("/api/v1/runs/r1/leases/x/complete", ("complete", {"run_id": "r1", "unit": "x"})),
    ],
)
def test_the_hot_routes_match(path: str, want: tuple[str, dict[str, str]]) -> None:
    assert match_hot("POST", path) == want


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runs/r1/heartbeat?x=1",  # a query: the router's business
        "/api/v1/runs/r%2F1/heartbeat",  # escapes: the router decodes them its own way
        "/api/v1/runs//heartbeat",
        "/api/v1/runs/{r}/heartbeat",
        "/api/v1/runs/r1/heartbeat/",
        "/api/v1/runs/r1/session",
        "/api/v1/runs/r1/join",
        "/api/v1/runs/r1/leases/1/state",
        "/api/v1/runs/r1/leases//complete",
        "/api/v2/runs/r1/heartbeat",
        "/api/v1/run/r1/heartbeat",
        "/x/api/v1/runs/r1/heartbeat",
        "/api/v1/runs/r1/nodes/1/complete",
    ],
)
def test_everything_else_goes_through_the_router(path: str) -> None:
    assert match_hot("POST", path) is None
    assert match_hot("GET", "/api/v1/runs/r1/heartbeat") is None


async def test_hot_calls_answer_as_through_the_router(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    shards = [
        {"id": f"s{i}", "url": f"https://d.example/{i}", "sha256": "ab" * 32, "tokens": 10, "bytes": 10}
        for i in range(4)
    ]
    spec = {
        "id": "r1",
        "data": {"manifest": {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards}},
        "credit": {"min_steps": 0},  # completions are trusted: no receipts here
    }
    async with local_coordinator(cfg) as lc, aiohttp.ClientSession() as http:
        async with http.post(
            lc.url + "/api/v1/runs", json=spec, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as r:
            assert r.status == 201
        me = Identity.generate()
        async with CoordinatorClient(lc.url, "r1", me) as c:
            await c.join(multiaddrs=["/ip4/127.0.0.1/tcp/4001"])
            (lease,) = await c.lease(1)
            await c.heartbeat(step=3, loss=1.5)
            assert (await c.complete(lease)) is not None
        assert lc.app.svc.runs["r1"].book.done == 1  # committed before the answer
        # Unsigned, bad JSON, wrong run: typed JSON errors, through either way in.
        for path in ("/api/v1/runs/r1/heartbeat", "/api/v1/runs/r1/heartbeat?via=router"):
            async with http.post(lc.url + path, data=b"{}") as r:
                assert r.status == 401 and (await r.json())["error"]["code"] == "unauthenticated"
        body = b'{"step": 1'
        path = "/api/v1/runs/r1/heartbeat"
        h = {**sign_request(me, "POST", path, body), "Content-Type": "application/json"}
        async with http.post(lc.url + path, data=body, headers=h) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "malformed"
        path = "/api/v1/runs/nope/leases"
        h = {**sign_request(me, "POST", path, b'{"want":1}'), "Content-Type": "application/json"}
        async with http.post(lc.url + path, data=b'{"want":1}', headers=h) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
        async with http.get(lc.url + "/metrics") as r:
            text = await r.text()
        counted = {
            line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("distro_coordinator_requests_total{")
        }
        assert counted['route="heartbeat",status="401"'] == 2  # both ways in count alike
        assert counted['route="heartbeat",status="400"'] == 1
        assert counted['route="complete",status="200"'] == 1
        assert json.loads(json.dumps(counted))  # plain numbers
