"""The coordinator's HTTP API end to end: real aiohttp server on loopback, real SQLite file,
the node's real client library."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import LocalCoordinator, local_coordinator
from distronet.node.daemon.coordinator_client import CoordinatorClient, CoordinatorRefused, sign_receipt
from distronet.protocol.coordinator_api import HDR_NONCE, HDR_PEER, HDR_SIGNATURE, HDR_TIME, sign_request
from distronet.protocol.coordinator_session import (
    HDR_MAC,
    SessionKey,
    derive_session_key,
    mac_headers,
    new_ephemeral,
)
from distronet.protocol.identity import Identity

TOKEN = "operator-secret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def spec(run_id: str = "r1", shards: int = 8, **extra: Any) -> dict[str, Any]:
    shard_list = [
        {"id": f"s{i}", "url": f"https://data.example/{i}", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(shards)
    ]
    manifest = {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shard_list}
    return {"id": run_id, "data": {"manifest": manifest}, "credit": {"min_steps": 0}, **extra}


@pytest.fixture
async def lc(tmp_path: Path) -> AsyncIterator[LocalCoordinator]:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    async with local_coordinator(cfg) as lc:
        yield lc


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _create(http: aiohttp.ClientSession, lc: LocalCoordinator, body: dict[str, Any]) -> int:
    async with http.post(lc.url + "/api/v1/runs", json=body, headers=AUTH) as r:
        return r.status


async def test_operator_creates_a_run_and_join_reads_it(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    assert await _create(http, lc, spec()) == 201
    assert await _create(http, lc, spec()) == 200  # identical: idempotent
    async with http.post(lc.url + "/api/v1/runs", json=spec(shards=3), headers=AUTH) as r:
        assert r.status == 409 and (await r.json())["error"]["code"] == "conflict"
    async with http.get(lc.url + "/api/v1/runs/r1") as r:
        run = await r.json()
    assert (
        run["data"]["shards"] == 8 and run["data"]["tokens"] == 800 and run["admission"]["policy"] == "open"
    )
    async with http.get(lc.url + "/api/v1/runs/nope") as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"


async def test_admission_needs_a_signature_of_the_challenge(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec())
    me, other = Identity.generate(), Identity.generate()
    async with http.post(lc.url + "/api/v1/runs/r1/challenge", json={"peer_id": me.peer_id_b58}) as r:
        ch = (await r.json())["challenge"]
    from distronet.protocol.coordinator_api import join_message

    forged = base64.b64encode(other.sign(join_message("r1", me.peer_id_b58, ch))).decode()
    body = {"peer_id": me.peer_id_b58, "challenge": ch, "signature": forged}
    async with http.post(lc.url + "/api/v1/runs/r1/join", json=body) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "bad_signature"
    async with CoordinatorClient(lc.url, "r1", me) as c:  # the challenge is single-use; a fresh one works
        joined = await c.join(multiaddrs=["/ip4/10.0.0.1/tcp/4001"])
    assert joined.node["peer_id"] == me.peer_id_b58 and joined.run["id"] == "r1"
    async with CoordinatorClient(lc.url, "r1", other) as c:
        joined = await c.join(multiaddrs=["/ip4/10.0.0.2/tcp/4001"])
    assert joined.bootstrap_peers == [{"peer_id": me.peer_id_b58, "multiaddrs": ["/ip4/10.0.0.1/tcp/4001"]}]


async def test_token_admission_policy(lc: LocalCoordinator, http: aiohttp.ClientSession) -> None:
    await _create(http, lc, spec(admission={"policy": "token"}))
    async with http.post(
        lc.url + "/api/v1/runs/r1/join-tokens", json={"count": 1, "uses": 1}, headers=AUTH
    ) as r:
        (tok,) = (await r.json())["tokens"]
    a, b = Identity.generate(), Identity.generate()
    async with CoordinatorClient(lc.url, "r1", a) as c:
        with pytest.raises(CoordinatorRefused) as e:
            await c.join()
        assert e.value.code == "bad_join_token"
        await c.join(join_token=tok)
    async with CoordinatorClient(lc.url, "r1", b) as c:
        with pytest.raises(CoordinatorRefused) as e:
            await c.join(join_token=tok)  # used up
        assert e.value.code == "bad_join_token"


async def test_leases_complete_once_and_ledger_credits_only_server_facts(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec(shards=4))
    a, b = Identity.generate(), Identity.generate()
    async with CoordinatorClient(lc.url, "r1", a) as ca, CoordinatorClient(lc.url, "r1", b) as cb:
        await ca.join()
        await cb.join()
        (lease,) = await ca.lease(4)  # unmeasured nodes hold one lease at a time
        assert lease.url == "https://data.example/0" and lease.tokens == 100
        assert await ca.renew(lease) >= lease.expires_at
        first = await ca.complete(lease)
        again = await ca.complete(lease)
        assert first is not None and first["credited"] is True
        assert again is not None and again["credited"] is False
        with pytest.raises(CoordinatorRefused) as e:
            await cb.renew(lease)  # someone else's lease
        assert e.value.code == "lease_lost"
        await ca.heartbeat(1_000_000 // 2, loss=1.5)  # a self-reported step earns nothing
        good = sign_receipt(b, "r1", 5, a.peer_id_b58, "cd" * 32)
        self_made = sign_receipt(a, "r1", 6, a.peer_id_b58, "cd" * 32)
        forged = dict(sign_receipt(a, "r1", 7, a.peer_id_b58, "cd" * 32), acceptor=b.peer_id_b58)
        out = await ca.submit_receipts([good, good, self_made, forged])
        assert out == {
            "accepted": 1,
            "duplicate": 1,
            "rejected": [{"index": 2, "code": "self_receipt"}, {"index": 3, "code": "bad_signature"}],
        }
    async with http.get(lc.url + "/api/v1/runs/r1/leaderboard") as r:
        board = (await r.json())["leaderboard"]
    assert board[0]["peer_id"] == a.peer_id_b58
    assert (board[0]["tokens"], board[0]["shards"], board[0]["steps_acknowledged"]) == (100, 1, 1)
    assert (board[1]["tokens"], board[1]["steps_acknowledged"]) == (0, 0)


async def test_leave_and_evict_give_leases_back(lc: LocalCoordinator, http: aiohttp.ClientSession) -> None:
    await _create(http, lc, spec(shards=2))
    a, b = Identity.generate(), Identity.generate()
    async with CoordinatorClient(lc.url, "r1", a) as ca, CoordinatorClient(lc.url, "r1", b) as cb:
        await ca.join()
        await cb.join()
        (la,) = await ca.lease()
        (lb,) = await cb.lease()
        await ca.leave()
        async with http.post(
            lc.url + f"/api/v1/runs/r1/nodes/{b.peer_id_b58}/evict", json={}, headers=AUTH
        ) as r:
            assert r.status == 200
        with pytest.raises(CoordinatorRefused) as e:
            await cb.lease()
        assert e.value.code == "evicted"
        with pytest.raises(CoordinatorRefused) as e:
            await ca.lease()
        assert e.value.code == "not_admitted"
        await ca.join()
        again = await ca.lease()
        assert [x.unit for x in again] == [lb.unit] or [x.unit for x in again] == [la.unit]


async def test_signed_requests_are_replay_and_tamper_proof(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec())
    me = Identity.generate()
    async with CoordinatorClient(lc.url, "r1", me) as c:
        await c.join()
    path = "/api/v1/runs/r1/heartbeat"
    body = json.dumps({"step": 3}).encode()
    headers = {**sign_request(me, "POST", path, body), "Content-Type": "application/json"}
    async with http.post(lc.url + path, data=body, headers=headers) as r:
        assert r.status == 200
    async with http.post(lc.url + path, data=body, headers=headers) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "replayed_request"
    h2 = {**sign_request(me, "POST", path, body), "Content-Type": "application/json"}
    async with http.post(lc.url + path, data=json.dumps({"step": 4}).encode(), headers=h2) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "bad_signature"
    old = {**sign_request(me, "POST", path, body, now_ms=1_000_000), "Content-Type": "application/json"}
    async with http.post(lc.url + path, data=body, headers=old) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "stale_request"
    bare = {k: v for k, v in h2.items() if k not in (HDR_SIGNATURE, HDR_TIME, HDR_NONCE)}
    async with http.post(lc.url + path, data=body, headers=bare) as r:
        assert r.status == 401 and (await r.json())["error"]["code"] == "unauthenticated"


async def test_limits_answer_413_and_429(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    cfg = CoordinatorConfig(
        db=f"sqlite:///{tmp_path / 'c.db'}",
        operator_token=TOKEN,
        ip_rate=1.0,
        ip_burst=5.0,
        node_body_limit=1024,
    )
    async with local_coordinator(cfg) as lc:
        await _create(http, lc, spec())
        big = json.dumps({"peer_id": "x" * 5000}).encode()
        async with http.post(lc.url + "/api/v1/runs/r1/challenge", data=big) as r:
            assert r.status == 413 and (await r.json())["error"]["code"] == "too_large"
        codes = []
        for _ in range(8):
            async with http.get(lc.url + "/api/v1/runs/r1") as r:
                codes.append(r.status)
                if r.status == 429:
                    assert r.headers["Retry-After"] == "1"
        assert 429 in codes and codes[0] == 200


async def test_sse_stream_carries_run_events(lc: LocalCoordinator, http: aiohttp.ClientSession) -> None:
    await _create(http, lc, spec(shards=2))
    me = Identity.generate()
    seen: list[str] = []

    async def listen() -> None:
        async with http.get(lc.url + "/api/v1/runs/r1/events") as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            async for line in r.content:
                if line.startswith(b"event: "):
                    seen.append(line[7:].strip().decode())
                    if "shard_completed" in seen:
                        return

    task = asyncio.create_task(listen())
    async with CoordinatorClient(lc.url, "r1", me) as c:
        await c.join()
        await c.heartbeat(7, loss=2.25)
        (lease,) = await c.lease()
        await c.complete(lease)
    await asyncio.wait_for(task, 10)
    assert seen[:1] == ["run_created"]  # replayed from the ring
    assert {"peer_joined", "step_progress", "loss", "shard_completed"} <= set(seen)


async def test_coordinator_serves_shards_with_range(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    data = bytes(range(256)) * 4
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "s0.bin").write_bytes(data)
    body = spec()
    body["data"]["manifest"]["shards"] = [
        {
            "id": "s0",
            "path": "s0.bin",
            "sha256": hashlib.sha256(data).hexdigest(),
            "tokens": 1024,
            "bytes": 1024,
        },
        {"id": "s1", "path": "../etc/passwd", "sha256": "ab" * 32, "tokens": 1, "bytes": 1},
    ]
    from distronet.coordinator.app import CoordinatorApp
    from distronet.protocol.coordinator_api import CREATE_RUN, ApiError

    with pytest.raises(ApiError):
        CREATE_RUN.validate(body)  # paths that climb out of the shard folder are refused
    body["data"]["manifest"]["shards"].pop()
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    app = CoordinatorApp(cfg)
    async with local_coordinator(cfg, app) as lc:
        app.svc.create_run(CREATE_RUN.validate(body), shard_root=str(tmp_path / "shards"))
        await app.committer.durable()
        url = lc.url + "/api/v1/runs/r1/shards/s0"
        async with http.get(url, headers={"Range": "bytes=10-19"}) as r:
            assert r.status == 206 and await r.read() == data[10:20]
        async with http.get(url) as r:
            assert (
                r.status == 200
                and hashlib.sha256(await r.read()).hexdigest() == hashlib.sha256(data).hexdigest()
            )


def _tokenizer_run(folder: Path, tokenizer: bytes) -> Path:
    """A run file whose manifest (version 2, beside it in ``data/``) names ``tokenizer.json``."""
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "tokenizer.json").write_bytes(tokenizer)
    manifest = {
        "version": 2, "tokenizer": "hf", "dtype": "uint16", "vocab_size": 300, "eos_id": 0,
        "tokenizer_file": "tokenizer.json", "tokenizer_sha256": hashlib.sha256(tokenizer).hexdigest(),
        "shards": [{"id": "s0", "url": "https://x.example/0", "sha256": "ab" * 32, "tokens": 8, "bytes": 16}],
    }  # fmt: skip
    (folder / "data" / "manifest.json").write_text(json.dumps(manifest))
    run = folder / "run.toml"
    run.write_text('id = "tok"\n[data]\nmanifest = "data/manifest.json"\n[credit]\nmin_steps = 0\n')
    return run


async def test_coordinator_serves_the_runs_tokenizer_and_a_node_keeps_it(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /runs/{id}/tokenizer.json``: the file beside the manifest, byte for byte, while it
    hashes to the manifest's sha256 and is within MAX_TOKENIZER_BYTES; 404 ``not_found`` for a
    byte-level run, a run created without its data folder, a changed or oversized file. A node
    fetches it once (the coordinator counts one download) and keeps it verified."""
    from distronet.coordinator import handlers
    from distronet.coordinator.app import CoordinatorApp
    from distronet.coordinator.config import load_run_file
    from distronet.node.data.tokenizer_fetch import ensure_run_tokenizer
    from distronet.protocol.coordinator_api import CREATE_RUN

    tokenizer = json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}).encode()
    sha = hashlib.sha256(tokenizer).hexdigest()
    body, root = load_run_file(_tokenizer_run(tmp_path, tokenizer))
    assert root == str(tmp_path / "data")
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    app = CoordinatorApp(cfg)
    async with local_coordinator(cfg, app) as lc:
        app.svc.create_run(body, shard_root=root)
        app.svc.create_run(CREATE_RUN.validate(spec("byte")), shard_root=root)
        inline = json.loads(json.dumps(body)) | {"id": "inline"}  # as validated, another id
        app.svc.create_run(inline, shard_root=None)  # POSTed: no data folder
        await app.committer.durable()
        url = lc.url + "/api/v1/runs/{}/tokenizer.json"
        async with http.get(url.format("tok")) as r:
            assert r.status == 200 and await r.read() == tokenizer
            assert r.content_type == "application/json"
        for run_id, why in [("byte", "has no tokenizer"), ("inline", "without its data folder"),
                            ("nope", "")]:  # fmt: skip
            async with http.get(url.format(run_id)) as r:
                err = (await r.json())["error"]
                assert r.status == 404 and err["code"] == "not_found" and why in err["message"], err
        # the node's side, against this coordinator: fetched once, then read from its cache
        async with http.get(lc.url + "/api/v1/runs/tok") as r:
            data = (await r.json())["data"]
        assert data["tokenizer_sha256"] == sha
        for _ in range(2):
            path = await ensure_run_tokenizer(lc.url, "tok", data, tmp_path / "node")
            assert path is not None and path.read_bytes() == tokenizer
        async with http.get(lc.url + "/metrics") as r:
            text = await r.text()
        assert (
            'distro_coordinator_requests_total{route="tokenizer",status="200"} 2.0' in text
        )  # ours + node's
        # a file changed after data prepare, or one over the limit, is not served
        (tmp_path / "data" / "tokenizer.json").write_bytes(tokenizer + b" ")
        async with http.get(url.format("tok")) as r:
            assert r.status == 404 and "differs" in (await r.json())["error"]["message"]
        (tmp_path / "data" / "tokenizer.json").write_bytes(tokenizer)
        monkeypatch.setattr(handlers, "MAX_TOKENIZER_BYTES", len(tokenizer) - 1)
        async with http.get(url.format("tok")) as r:
            assert r.status == 404 and "larger than" in (await r.json())["error"]["message"]
        # a tokenizer_file that leads out of the data folder (a symlink) is not served either
        monkeypatch.undo()
        (tmp_path / "outside.json").write_bytes(tokenizer)
        (tmp_path / "data" / "tokenizer.json").unlink()
        (tmp_path / "data" / "tokenizer.json").symlink_to(tmp_path / "outside.json")
        async with http.get(url.format("tok")) as r:
            assert r.status == 404 and "leads outside" in (await r.json())["error"]["message"]
    doc = app.openapi
    op = doc["paths"]["/api/v1/runs/{run_id}/tokenizer.json"]["get"]
    assert op["operationId"] == "tokenizer" and "application/json" in op["responses"]["200"]["content"]


async def test_openapi_metrics_and_health(lc: LocalCoordinator, http: aiohttp.ClientSession) -> None:
    async with http.get(lc.url + "/api/v1/openapi.json") as r:
        doc = await r.json()
    assert doc["openapi"].startswith("3.")
    assert "/api/v1/runs/{run_id}/leases/{unit}/complete" in doc["paths"]
    assert doc["components"]["schemas"]["HeartbeatRequest"]["additionalProperties"] is False
    async with http.get(lc.url + "/api/v1/health") as r:
        assert (await r.json())["ok"] is True
    await _create(http, lc, spec())
    async with http.get(lc.url + "/metrics") as r:
        text = await r.text()
    assert 'distro_coordinator_requests_total{route="create_run",status="201"} 1.0' in text
    assert 'distro_coordinator_units{run="r1",state="free"} 8.0' in text


async def test_a_node_recovers_the_leases_it_holds(lc: LocalCoordinator, http: aiohttp.ClientSession) -> None:
    await _create(http, lc, spec(shards=3))
    me = Identity.generate()
    async with CoordinatorClient(lc.url, "r1", me) as c:
        await c.join()
        assert await c.held_leases() == []
        (lease,) = await c.lease()
        assert await c.held_leases() == [lease]  # e.g. after a restart that lost the answer
        await c.complete(lease)
        assert await c.held_leases() == []


def test_client_public_surface() -> None:
    import distronet.node.daemon.coordinator_client as m

    assert sorted(m.__all__) == [
        "CoordinatorClient", "CoordinatorClientError", "CoordinatorRefused", "CoordinatorUnreachable",
        "JoinResult", "Lease", "sign_receipt",
    ]  # fmt: skip
    public = {n for n in vars(m.CoordinatorClient) if not n.startswith("_")}
    assert public == {
        "close", "get_run", "join", "lease", "held_leases", "renew", "leave", "complete", "heartbeat",
        "submit_receipts", "pending", "flush", "resume",
    }  # fmt: skip


async def test_forgeries_cannot_spend_a_peers_rate_limit(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    cfg = CoordinatorConfig(
        db=f"sqlite:///{tmp_path / 'c.db'}",
        operator_token=TOKEN,
        peer_rate=0.5,
        peer_burst=3,
        ip_rate=0.5,
        ip_burst=3,
    )
    async with local_coordinator(cfg) as lc:
        await _create(http, lc, spec())
        victim, forger = Identity.generate(), Identity.generate()
        async with CoordinatorClient(lc.url, "r1", victim) as c:
            await c.join()
        path = "/api/v1/runs/r1/heartbeat"
        body = json.dumps({"step": 1}).encode()
        codes = []
        for _ in range(6):
            h = {**sign_request(forger, "POST", path, body), "Content-Type": "application/json"}
            h["X-Distro-Peer"] = victim.peer_id_b58
            async with http.post(lc.url + path, data=body, headers=h) as r:
                codes.append(r.status)
        assert codes[0] == 403 and codes[-1] == 429  # the forger's IP is throttled, not the victim
        h = {**sign_request(victim, "POST", path, body), "Content-Type": "application/json"}
        async with http.post(lc.url + path, data=body, headers=h) as r:
            assert r.status == 200


# ------------------------------------------------------------------ sessions (HMAC per call)


async def _open_session(http: aiohttp.ClientSession, lc: LocalCoordinator, me: Identity) -> SessionKey:
    """Open a session with a signed X25519 exchange, as the client library does."""
    priv, pub = new_ephemeral()
    path = "/api/v1/runs/r1/session"
    body = json.dumps({"x25519": pub}).encode()
    headers = {**sign_request(me, "POST", path, body), "Content-Type": "application/json"}
    async with http.post(lc.url + path, data=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        ans = await r.json()
    key = derive_session_key(
        priv, ans["x25519"], run_id="r1", peer_id_b58=me.peer_id_b58, session_id=ans["session_id"],
        client_public_b64=pub, server_public_b64=ans["x25519"],
    )  # fmt: skip
    return SessionKey(me.peer_id_b58, ans["session_id"], key)


async def _post(
    http: aiohttp.ClientSession, lc: LocalCoordinator, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str]:
    async with http.post(
        lc.url + path, data=body, headers={**headers, "Content-Type": "application/json"}
    ) as r:
        return r.status, (await r.json())["error"]["code"] if r.status >= 400 else ""


async def test_session_calls_are_mac_checked_replay_and_tamper_proof(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec())
    await _create(http, lc, spec("r2"))
    me, other, stranger = Identity.generate(), Identity.generate(), Identity.generate()
    for ident, run in ((me, "r1"), (other, "r1"), (me, "r2")):
        async with CoordinatorClient(lc.url, run, ident) as c:
            await c.join()
    s = await _open_session(http, lc, me)
    path, body = "/api/v1/runs/r1/heartbeat", json.dumps({"step": 3}).encode()
    h = mac_headers(s, "POST", path, body)
    assert await _post(http, lc, path, body, h) == (200, "")
    assert await _post(http, lc, path, body, h) == (403, "replayed_request")
    tampered = mac_headers(s, "POST", path, body)
    assert await _post(http, lc, path, b'{"step":4}', tampered) == (403, "bad_signature")
    zero_mac = {**mac_headers(s, "POST", path, body), HDR_MAC: base64.b64encode(bytes(32)).decode()}
    assert await _post(http, lc, path, body, zero_mac) == (403, "bad_signature")
    old = mac_headers(s, "POST", path, body, now_ms=1_000_000)
    assert await _post(http, lc, path, body, old) == (403, "stale_request")
    unknown = mac_headers(SessionKey(me.peer_id_b58, "x" * 22, s.key), "POST", path, body)
    assert await _post(http, lc, path, body, unknown) == (401, "unknown_session")
    as_other = {**mac_headers(s, "POST", path, body), HDR_PEER: other.peer_id_b58}
    assert await _post(http, lc, path, body, as_other) == (403, "bad_signature")
    r2 = "/api/v1/runs/r2/heartbeat"  # a session belongs to one run
    assert await _post(http, lc, r2, body, mac_headers(s, "POST", r2, body)) == (403, "bad_signature")
    no_mac = {k: v for k, v in mac_headers(s, "POST", path, body).items() if k != HDR_MAC}
    assert await _post(http, lc, path, body, no_mac) == (401, "unauthenticated")
    # opening a session takes the peer key itself, never a session MAC
    sp = "/api/v1/runs/r1/session"
    sbody = json.dumps({"x25519": new_ephemeral()[1]}).encode()
    assert await _post(http, lc, sp, sbody, mac_headers(s, "POST", sp, sbody)) == (401, "unauthenticated")
    assert await _post(http, lc, sp, sbody, sign_request(stranger, "POST", sp, sbody)) == (
        403,
        "not_admitted",
    )
    low_order = json.dumps({"x25519": base64.b64encode(bytes(32)).decode()}).encode()
    assert await _post(http, lc, sp, low_order, sign_request(me, "POST", sp, low_order)) == (
        400,
        "invalid_field",
    )


async def test_the_client_uses_one_session_and_reopens_a_forgotten_one(
    lc: LocalCoordinator, http: aiohttp.ClientSession
) -> None:
    await _create(http, lc, spec(shards=4))
    me = Identity.generate()
    async with CoordinatorClient(lc.url, "r1", me) as c:
        await c.join()
        for step in range(3):
            await c.heartbeat(step)
        (lease,) = await c.lease()
        assert len(lc.app.sessions) == 1
        lc.app.sessions.prune(float("inf"))  # as after a restart: every session forgotten
        assert await c.renew(lease) >= lease.expires_at  # no error: the client opened a new session
        assert len(lc.app.sessions) == 1
    async with http.get(lc.url + "/metrics") as r:
        text = await r.text()
    assert 'distro_coordinator_requests_total{route="session",status="200"} 2.0' in text
    assert 'distro_coordinator_requests_total{route="heartbeat",status="200"} 3.0' in text
    assert 'route="renew",status="401"} 1.0' in text  # the forgotten session, retried once


async def test_the_client_signs_every_call_when_sessions_are_not_offered(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distronet.coordinator import handlers
    from distronet.protocol.coordinator_api import ApiError, ApiErrorCode

    def no_sessions(app: Any, ctx: Any) -> Any:  # an older coordinator has no such route
        raise ApiError(ApiErrorCode.NOT_FOUND, "no such route")

    monkeypatch.setattr(handlers, "session", no_sessions)
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN)
    async with local_coordinator(cfg) as lc:
        await _create(http, lc, spec())
        me = Identity.generate()
        async with CoordinatorClient(lc.url, "r1", me) as c:
            await c.join()
            assert await c.heartbeat(1) is not None and await c.heartbeat(2) is not None
            assert len(await c.lease()) == 1
        async with http.get(lc.url + "/metrics") as r:
            text = await r.text()
    assert 'distro_coordinator_requests_total{route="session",status="404"} 1.0' in text  # tried once
    assert 'distro_coordinator_requests_total{route="heartbeat",status="200"} 2.0' in text
