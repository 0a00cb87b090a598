"""API fuzzing against the OpenAPI document (hypothesis): no input makes the coordinator answer
5xx; unauthenticated writes get 401, oversize bodies 413, bad signatures and bad session MACs 403.

The coordinator runs on loopback in a thread of its own; requests go over real HTTP with the
standard library's client, so every byte hypothesis invents reaches the real parser.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import local_coordinator
from distronet.protocol.coordinator_api import (
    CREATE_RUN,
    HDR_NONCE,
    HDR_PEER,
    HDR_SIGNATURE,
    HDR_TIME,
    ApiErrorCode,
    Field,
    Schema,
    join_message,
    sign_request,
)
from distronet.protocol.coordinator_session import (
    HDR_MAC,
    HDR_SESSION,
    SessionKey,
    derive_session_key,
    mac_headers,
    new_ephemeral,
)
from distronet.protocol.identity import Identity
from distronet.protocol.limits import MAX_PROBE_BYTES

TOKEN = "fuzz-operator-token"
ERROR_CODES = {c.value for c in ApiErrorCode}
NODE_LIMIT = 4096


class Server:
    """A coordinator in a background thread with its own event loop."""

    def __init__(self, cfg: CoordinatorConfig) -> None:
        self.cfg = cfg
        self.ready = threading.Event()
        self.port = 0
        self.app: Any = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._main(),), daemon=True
        )

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with local_coordinator(self.cfg) as lc:
            self.app = lc.app
            self.port = int(lc.url.rsplit(":", 1)[1])
            self.ready.set()
            await self._stop.wait()

    def __enter__(self) -> Server:
        self._thread.start()
        assert self.ready.wait(30), "coordinator did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._loop.close()

    def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body or None, headers=headers or {})
            r = conn.getresponse()
            data = r.read()
            ctype = r.getheader("Content-Type", "")
        finally:
            conn.close()
        return r.status, (json.loads(data) if ctype.startswith("application/json") and data else data)


def _spec() -> dict[str, Any]:
    shards = [
        {"id": f"s{i}", "url": f"https://d.example/{i}", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(50)
    ]
    return {
        "id": "r1",
        "data": {"manifest": {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards}},
        "credit": {"min_steps": 0},  # completions are trusted: no receipts here
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    cfg = CoordinatorConfig(
        db=f"sqlite:///{tmp / 'c.db'}", operator_token=TOKEN, peer_rate=1e6, peer_burst=1e6, ip_rate=1e6,
        ip_burst=1e6, node_body_limit=NODE_LIMIT, operator_body_limit=1 << 20,
    )  # fmt: skip
    with Server(cfg) as s:
        status, _ = s.call("POST", "/api/v1/runs", json.dumps(_spec()).encode(), _op())
        assert status == 201
        yield s


@pytest.fixture(scope="module")
def member(server: Server) -> Identity:
    """A peer admitted to run r1."""
    return _admit(server)


@pytest.fixture(scope="module")
def member_session(server: Server, member: Identity) -> SessionKey:
    """A session of ``member`` (the schema-shaped fuzz may make it leave: then its calls get 4xx)."""
    return _open_session(server, member)


def _admit(server: Server, run: str = "r1") -> Identity:
    me = Identity.generate()
    base = f"/api/v1/runs/{run}"
    _, ch = server.call("POST", base + "/challenge", json.dumps({"peer_id": me.peer_id_b58}).encode(), _js())
    sig = base64.b64encode(me.sign(join_message(run, me.peer_id_b58, ch["challenge"]))).decode()
    body = {"peer_id": me.peer_id_b58, "challenge": ch["challenge"], "signature": sig}
    status, _ = server.call("POST", base + "/join", json.dumps(body).encode(), _js())
    assert status == 200
    return me


def _open_session(server: Server, member: Identity, run: str = "r1") -> SessionKey:
    """A session of ``member`` (signed X25519 exchange)."""
    priv, pub = new_ephemeral()
    path = f"/api/v1/runs/{run}/session"
    body = json.dumps({"x25519": pub}).encode()
    status, ans = server.call("POST", path, body, {**_js(), **sign_request(member, "POST", path, body)})
    assert status == 200, ans
    key = derive_session_key(
        priv, ans["x25519"], run_id=run, peer_id_b58=member.peer_id_b58, session_id=ans["session_id"],
        client_public_b64=pub, server_public_b64=ans["x25519"],
    )  # fmt: skip
    return SessionKey(member.peer_id_b58, ans["session_id"], key)


def _js() -> dict[str, str]:
    return {"Content-Type": "application/json"}


def _op() -> dict[str, str]:
    return {**_js(), "Authorization": f"Bearer {TOKEN}"}


def _routes(server: Server) -> list[tuple[str, str, dict[str, Any]]]:
    _, doc = server.call("GET", "/api/v1/openapi.json")
    return [(m.upper(), p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def _assert_sane(status: int, body: Any) -> None:
    assert status < 500, (status, body)
    if status >= 400 and isinstance(body, dict):
        assert body["error"]["code"] in ERROR_CODES


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
path_values = st.sampled_from(
    ["r1", "0", "1", "999999", "nope", "s1", "%2e%2e", "12D3KooWxyz", "-1", "a" * 200]
)


def _fill(path: str, values: list[str]) -> str:
    out = []
    it = iter(values)
    for seg in path.split("/"):
        out.append(next(it, "r1") if seg.startswith("{") else seg)
    return "/".join(out)


def field_strategy(f: Field) -> st.SearchStrategy[Any]:
    """Values that pass ``f``'s validation (most of the time), to reach the operations themselves."""
    if f.kind == "str":
        if f.enum:
            return st.sampled_from(f.enum)
        if f.pattern:
            return st.from_regex(f"\\A{f.pattern}\\Z")
        return st.text(max_size=f.max_length or 20)
    if f.kind == "int":
        return st.integers(int(f.minimum or 0), int(min(f.maximum or 2**40, 2**40)))
    if f.kind == "float":
        return st.floats(f.minimum or 0, min(f.maximum or 1e9, 1e9))
    if f.kind == "bool":
        return st.booleans()
    if f.kind == "list":
        assert f.items is not None
        inner = schema_strategy(f.items) if isinstance(f.items, Schema) else field_strategy(f.items)
        return st.lists(inner, max_size=min(f.max_length or 3, 3))
    if f.schema is not None:
        return schema_strategy(f.schema)
    return st.dictionaries(st.text(max_size=8), json_values, max_size=3)


def schema_strategy(s: Schema) -> st.SearchStrategy[dict[str, Any]]:
    required = {f.name: field_strategy(f) for f in s.fields if f.required}
    optional = {f.name: field_strategy(f) for f in s.fields if not f.required}
    return st.fixed_dictionaries(required, optional=optional)


STATUSES: dict[int, int] = {}
ASCII = st.characters(min_codepoint=33, max_codepoint=126)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_no_input_gets_a_5xx(server: Server, data: st.DataObject) -> None:
    method, path, _op_doc = data.draw(st.sampled_from(_routes(server)))
    url = _fill(path, data.draw(st.lists(path_values, min_size=3, max_size=3)))
    raw = data.draw(st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=64)))
    headers = data.draw(
        st.fixed_dictionaries(
            {},
            optional={
                "Content-Type": st.sampled_from(["application/json", "text/plain", "application/json; x=1"]),
                "Authorization": st.sampled_from([f"Bearer {TOKEN}", "Bearer nope", "Basic abc", ""]),
                HDR_PEER: st.text("123456789ABCDEFGHJKLMNPQRSTUVWXYZabc", max_size=60),
                HDR_TIME: st.sampled_from(["0", "-5", "99999999999999999999", "abc"]),
                HDR_NONCE: st.text(ASCII, max_size=70),
                HDR_SIGNATURE: st.text(ASCII, max_size=100),
                HDR_SESSION: st.text(ASCII, max_size=30),
                HDR_MAC: st.text(ASCII, max_size=50),
            },
        )
    )
    headers = {k: v for k, v in headers.items() if v.isprintable() and "\n" not in v and "\r" not in v}
    if method == "GET" and path.endswith("/events"):
        return  # a stream that stays open; covered by the API tests
    status, body = server.call(method, url, raw if method == "POST" else b"", headers)
    _assert_sane(status, body)


@FUZZ
@given(data=st.data())
def _shaped_signed_call(server: Server, member: Identity, sess: SessionKey, data: st.DataObject) -> None:
    from distronet.coordinator.routes import ROUTES

    route = data.draw(st.sampled_from([r for r in ROUTES if r.method == "POST" and r.schema is not None]))
    assert route.schema is not None
    body = json.dumps(data.draw(schema_strategy(route.schema))).encode()
    url = _fill(
        route.full_path, ["r1", data.draw(st.sampled_from(["0", "1", "49", "50", member.peer_id_b58]))]
    )
    headers = _js()
    if route.auth == "signed" and route.mac and data.draw(st.booleans()):
        headers.update(mac_headers(sess, "POST", url, body))
    elif route.auth == "signed":
        headers.update(sign_request(member, "POST", url, body))
    elif route.auth == "operator":
        headers.update(_op())
        if route.name == "create_run":
            return  # creating thousands of runs is not the point here
    status, resp = server.call("POST", url, body, headers)
    _assert_sane(status, resp)
    STATUSES[status] = STATUSES.get(status, 0) + 1


@pytest.mark.slow
def test_schema_shaped_signed_calls_never_5xx(
    server: Server, member: Identity, member_session: SessionKey
) -> None:
    """Schema-shaped, correctly signed calls never get a 5xx, and the fuzz gets past validation
    into the operations (some calls succeed), so it is not only exercising the 4xx paths."""
    STATUSES.clear()
    _shaped_signed_call(server, member, member_session)
    assert STATUSES.get(200, 0) > 0, STATUSES


def _valid_body(name: str) -> dict[str, Any]:
    token = {"lease_token": "x" * 22}
    bodies = {
        "heartbeat": {"step": 1},
        "lease": {"want": 1},
        "receipts": {"receipts": []},
        "create_run": _spec(),
    }
    return {**bodies, "renew": token, "complete": token}.get(name, {})


def _writes(server: Server, auth: str) -> list[Any]:
    from distronet.coordinator.routes import ROUTES

    return [r for r in ROUTES if r.method == "POST" and r.auth == auth]


def test_unauthenticated_writes_get_401(server: Server, member: Identity) -> None:
    for r in _writes(server, "operator") + _writes(server, "signed"):
        url = _fill(r.full_path, ["r1", member.peer_id_b58 if "peer_id" in r.full_path else "0"])
        status, body = server.call("POST", url, json.dumps(_valid_body(r.name)).encode(), _js())
        assert status == 401 and body["error"]["code"] == "unauthenticated", (r.name, status, body)


def test_oversize_bodies_get_413(server: Server, member: Identity) -> None:
    from distronet.coordinator.routes import ROUTES

    for r in [r for r in ROUTES if r.method == "POST"]:
        limit = {"node": NODE_LIMIT, "probe": MAX_PROBE_BYTES}.get(r.limit, 1 << 20)
        body = b'{"pad": "' + b"x" * limit + b'"}'
        url = _fill(r.full_path, ["r1", "0"])
        for headers in (_js(), _op(), {**_js(), **sign_request(member, "POST", url, body)}):
            status, resp = server.call("POST", url, body, headers)
            assert status == 413 and resp["error"]["code"] == "too_large", (r.name, status)


def test_bad_signatures_get_403(server: Server) -> None:
    # a fresh run and member: the fuzz above may have closed r1 or made its member leave
    status, _ = server.call("POST", "/api/v1/runs", json.dumps({**_spec(), "id": "sig"}).encode(), _op())
    assert status in (200, 201)
    member, stranger = _admit(server, "sig"), Identity.generate()
    member_session = _open_session(server, member, "sig")
    wrong_key = SessionKey(member.peer_id_b58, member_session.session_id, bytes(32))
    for r in _writes(server, "signed"):
        url = _fill(r.full_path, ["sig", "0"])
        body = json.dumps(_valid_body(r.name)).encode()
        forged = sign_request(stranger, "POST", url, body)
        forged[HDR_PEER] = member.peer_id_b58  # signed by another key
        other_body = sign_request(member, "POST", url, body + b" ")  # signature of other bytes
        garbage = {**sign_request(member, "POST", url, body), HDR_SIGNATURE: "A" * 86 + "=="}
        bad = [forged, other_body, garbage]
        if r.mac:  # session MACs: under a key the coordinator does not hold, of other bytes, garbage
            bad += [
                mac_headers(wrong_key, "POST", url, body),
                mac_headers(member_session, "POST", url, body + b" "),
                {**mac_headers(member_session, "POST", url, body), HDR_MAC: "A" * 43 + "="},
            ]
        for h in bad:
            status, resp = server.call("POST", url, body, {**_js(), **h})
            assert status == 403 and resp["error"]["code"] == "bad_signature", (r.name, status, resp)


def test_create_run_schema_rejects_with_field_names() -> None:
    bad = _spec()
    bad["data"]["manifest"]["shards"][3]["tokens"] = -1
    with pytest.raises(Exception) as e:
        CREATE_RUN.validate(bad)
    assert getattr(e.value, "field", None) == "body.data.manifest.shards[3].tokens"
