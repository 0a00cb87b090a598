"""The hand-written HTTP/1.1 way in (coordinator/hotpath.py), over raw loopback sockets: hot
calls answered by it keep every check of the pipeline (auth, limits, schema, durability,
metrics); anything else on the same connection goes on through aiohttp unchanged."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from distronet.coordinator import hotpath
from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.hotpath import parse_head
from distronet.coordinator.local import LocalCoordinator, local_coordinator
from distronet.node.daemon.coordinator_client import CoordinatorClient
from distronet.protocol.coordinator_api import sign_request
from distronet.protocol.identity import Identity

TOKEN = "hot-path-operator-token"
HB = "/api/v1/runs/r1/heartbeat"

_SIGNED_HEAD = (
    "POST /api/v1/runs/r1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "X-Distro-Peer: p\r\nContent-Length: 2"
)


def test_parse_head_takes_plain_hot_calls_only() -> None:
    h = parse_head(_SIGNED_HEAD.encode())
    assert h is not None and (h.name, h.length, h.close) == ("heartbeat", 2, False)
    assert h.headers.get("x-distro-peer") == "p" and h.params == {"run_id": "r1"}
    closing = parse_head((_SIGNED_HEAD + "\r\nConnection: close").encode())
    assert closing is not None and closing.close
    for bad in (
        _SIGNED_HEAD.replace("HTTP/1.1", "HTTP/1.0"),  # aiohttp's business
        _SIGNED_HEAD.replace("heartbeat", "heartbeat?x=1"),
        _SIGNED_HEAD.replace("POST", "GET"),
        _SIGNED_HEAD.replace("/runs/r1/", "/runs/../"),
        _SIGNED_HEAD.replace("/r1/", "/r%31/"),
        _SIGNED_HEAD + "\r\nTransfer-Encoding: chunked",
        _SIGNED_HEAD + "\r\nExpect: 100-continue",
        _SIGNED_HEAD + "\r\nContent-Length: 2",  # repeated
        _SIGNED_HEAD.replace("Length: 2", "Length: +2"),
        _SIGNED_HEAD + "\r\n folded",  # obs-fold
        _SIGNED_HEAD + "\r\nBad Name: x",
        _SIGNED_HEAD + "\r\nX: caf\u00e9",  # not ASCII
        _SIGNED_HEAD + "\r\nX: " + "a" * 9000,  # over aiohttp's line limit
    ):
        assert parse_head(bad.encode("utf-8")) is None, bad


def _spec(shards: int = 4) -> dict[str, object]:
    rows = [
        {"id": f"s{i}", "url": f"https://d.example/{i}", "sha256": "ab" * 32, "tokens": 10, "bytes": 10}
        for i in range(shards)
    ]
    return {
        "id": "r1",
        "data": {"manifest": {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": rows}},
        "credit": {"min_steps": 0},  # completions are trusted: no receipts here
    }


def _request(me: Identity, path: str, body: bytes, extra: str = "") -> bytes:
    h = sign_request(me, "POST", path, body)
    lines = "".join(f"{k}: {v}\r\n" for k, v in h.items())
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{lines}{extra}"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
    status = int(head.split(" ", 2)[1])
    hdrs = {}
    for line in head.split("\r\n")[1:]:
        if line:
            k, _, v = line.partition(":")
            hdrs[k.strip().lower()] = v.strip()
    body = await asyncio.wait_for(reader.readexactly(int(hdrs.get("content-length", "0"))), 10)
    return status, hdrs, body


async def _started(tmp_path: Path, lc: LocalCoordinator) -> Identity:
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            lc.url + "/api/v1/runs", json=_spec(), headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert r.status == 201
    me = Identity.generate()
    async with CoordinatorClient(lc.url, "r1", me) as c:
        await c.join(multiaddrs=["/ip4/127.0.0.1/tcp/4001"])
    return me


def _cfg(tmp_path: Path) -> CoordinatorConfig:
    return CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token=TOKEN, node_body_limit=1024)


async def test_hot_calls_then_other_routes_on_one_connection(tmp_path: Path) -> None:
    async with local_coordinator(_cfg(tmp_path)) as lc:
        me = await _started(tmp_path, lc)
        host, port = lc.url.split("//")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        # Two pipelined hot calls in one write: answered in order, each after its commit.
        lease_path = "/api/v1/runs/r1/leases"
        writer.write(_request(me, lease_path, b'{"want":1}') + _request(me, HB, b'{"step":7,"loss":1.5}'))
        status, hdrs, body = await _answer(reader)
        assert status == 200 and hdrs["content-type"] == "application/json"
        (lease,) = json.loads(body)["leases"]
        status, _, body = await _answer(reader)
        answer = json.loads(body)
        assert (
            status == 200
            and answer.pop("credential")
            and answer == {"renewed": 1, "peers_live": 1, "step": 7}
        )
        assert lc.app.committer.failed is None
        db = sqlite3.connect(tmp_path / "c.db")  # acknowledged means on disk: another connection sees it
        assert db.execute("SELECT last_step FROM nodes WHERE peer_id = ?", (me.peer_id_b58,)).fetchone() == (
            7,
        )
        assert db.execute("SELECT holder FROM units WHERE unit = ?", (lease["unit"],)).fetchone() == (
            me.peer_id_b58,
        )
        db.close()
        # Unsigned, bad signature, wrong media type: the pipeline's typed errors.
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" % HB.encode())
        status, _, body = await _answer(reader)
        assert status == 401 and json.loads(body)["error"]["code"] == "unauthenticated"
        forged = _request(me, HB, b'{"step":8,"loss":null}').replace(b'"step":8', b'"step":9')
        writer.write(forged)
        status, _, body = await _answer(reader)
        assert status == 403 and json.loads(body)["error"]["code"] == "bad_signature"
        writer.write(_request(me, HB, b'{"step":8,"loss":null}').replace(b"application/json", b"text/plain"))
        status, _, body = await _answer(reader)
        assert status == 415
        # Another route on the same connection: handed over to aiohttp, which keeps it.
        writer.write(b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = await _answer(reader)
        assert status == 200 and "paths" in json.loads(body)
        path = f"/api/v1/runs/r1/leases/{lease['unit']}/complete"
        writer.write(_request(me, path, json.dumps({"lease_token": lease["lease_token"]}).encode()))
        status, _, body = await _answer(reader)
        assert status == 200 and json.loads(body)["credited"] is True
        writer.close()
        async with aiohttp.ClientSession() as http, http.get(lc.url + "/metrics") as r:
            text = await r.text()
        for want in (
            'distro_coordinator_requests_total{route="heartbeat",status="200"} 1.0',
            'distro_coordinator_requests_total{route="heartbeat",status="401"} 1.0',
            'distro_coordinator_requests_total{route="heartbeat",status="403"} 1.0',
            'distro_coordinator_requests_total{route="heartbeat",status="415"} 1.0',
            'distro_coordinator_requests_total{route="complete",status="200"} 1.0',
        ):
            assert want in text


@pytest.mark.parametrize("declared", [True, False])
async def test_oversize_body_is_413(tmp_path: Path, declared: bool) -> None:
    async with local_coordinator(_cfg(tmp_path)) as lc:
        me = await _started(tmp_path, lc)
        host, port = lc.url.split("//")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = b'{"step":1,"loss":null,"pad":"' + b"x" * 2000 + b'"}'
        if declared:  # a declared length over the limit: refused before the body, connection closed
            writer.write(_request(me, HB, body)[: -len(body)])
        else:  # chunked: aiohttp's way, which counts while reading
            h = sign_request(me, "POST", HB, body)
            lines = "".join(f"{k}: {v}\r\n" for k, v in h.items())
            writer.write(
                f"POST {HB} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n{lines}\r\n".encode()
                + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            )
        status, _, answer = await _answer(reader)
        assert status == 413 and json.loads(answer)["error"]["code"] == "too_large"
        if declared:
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server
        writer.close()


async def test_shutdown_closes_its_connections(tmp_path: Path) -> None:
    async with local_coordinator(_cfg(tmp_path)) as lc:
        me = await _started(tmp_path, lc)
        host, port = lc.url.split("//")[1].split(":")
        idle_r, idle_w = await asyncio.open_connection(host, int(port))
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(_request(me, HB, b'{"step":1,"loss":1.0}'))
        status, _, body = await _answer(reader)
        assert status == 200, body
    assert await asyncio.wait_for(idle_r.read(), 10) == b""  # idle connections are closed
    assert await asyncio.wait_for(reader.read(), 10) == b""
    idle_w.close()
    writer.close()


async def test_silent_connections_are_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "IDLE_TIMEOUT_S", 0.05)
    monkeypatch.setattr(hotpath, "SWEEP_EVERY_S", 0.05)
    async with local_coordinator(_cfg(tmp_path)) as lc:
        host, port = lc.url.split("//")[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /api/v1/runs/r1/heartbeat HTTP/1.1\r\n")  # a head that never ends
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


class _Transport:
    """What HotProtocol needs of a transport; keeps what it writes."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.out += data

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 1) if name == "peername" else None

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_a_request_fed_byte_by_byte_is_answered_once(tmp_path: Path) -> None:
    async with local_coordinator(_cfg(tmp_path)) as lc:
        me = await _started(tmp_path, lc)
        conn = hotpath.HotProtocol(hotpath._Shared(lc.app, lc.runner))
        t = _Transport()
        conn.connection_made(t)  # type: ignore[arg-type]
        data = _request(me, HB, b'{"step":2,"loss":1.0}') + _request(me, HB, b'{"step":3,"loss":1.0}')
        for i in range(len(data)):
            conn.data_received(data[i : i + 1])
        for _ in range(100):  # each answer waits for its commit; the second is read after the first
            if t.out.count(b"HTTP/1.1 ") == 2:
                break
            await lc.app.committer.flush()
            await asyncio.sleep(0)  # the commit's done-callbacks run on the next loop turn
        answers = bytes(t.out).split(b"HTTP/1.1 ")[1:]
        assert [a[:3] for a in answers] == [b"200", b"200"] and not t.closed
        assert b'{"renewed":0,"peers_live":1,"step":3,"credential":"' in answers[1]


def test_hot_answers_encode_as_the_json_encoder_does() -> None:
    import json

    from distronet.coordinator.hotpath import _encode_answer

    for obj in (
        {"renewed": 2, "peers_live": 250, "step": 2**53},
        {"unit": 7, "credited": True, "tokens": 65536},
        {"unit": 7, "credited": False, "tokens": 0},
        {"unit": 7, "credited": 1, "tokens": 0},  # not a bool: the general encoder
        {"renewed": True, "peers_live": 1, "step": 0},  # not an int: the general encoder
        {"renewed": 1, "peers_live": 2, "step": 3, "credential": "RE5DMQ+/=="},
        {"renewed": 1, "peers_live": 2, "step": 3, "credential": 'no"base64'},  # the general encoder
        {"unit": 7, "expires_at": 1764480000.125},
        {"leases": [], "held": 0, "exhausted": False, "max_leases": 1},
    ):
        assert json.loads(_encode_answer(obj)) == obj
        assert _encode_answer(obj) == json.dumps(obj, separators=(",", ":")).encode()
