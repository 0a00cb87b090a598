"""Node sessions: both sides derive one key, it is bound to run/peer/session, the table is bounded."""

from __future__ import annotations

import base64

import pytest

from distronet.coordinator.sessions import SessionTable
from distronet.protocol.coordinator_api import ApiError, request_message
from distronet.protocol.coordinator_session import (
    SessionKey,
    b64decode_mac,
    derive_session_key,
    mac_headers,
    new_ephemeral,
    request_mac,
)

PEER = "12D3KooWBhMbLvQGgqByteXd8aDEcrhbYbDRSpGsVqQ4iFD6H2Bq"


def _client_key(
    table: SessionTable, run: str = "r1", peer: str = PEER, now: float = 0.0
) -> tuple[str, bytes]:
    """Open a session as a node would: (session id, the node's derived key)."""
    priv, pub = new_ephemeral()
    s, server_pub = table.open(run, peer, pub, now)
    key = derive_session_key(
        priv, server_pub, run_id=run, peer_id_b58=peer, session_id=s.sid,
        client_public_b64=pub, server_public_b64=server_pub,
    )  # fmt: skip
    return s.sid, key


def test_node_and_coordinator_derive_the_same_mac_key() -> None:
    table = SessionTable(60.0)
    sid, key = _client_key(table)
    s = table.get(sid, 1.0)
    assert s is not None and s.peer == PEER and s.run_id == "r1"
    msg = request_message("POST", "/api/v1/runs/r1/heartbeat", 1000, "n" * 16, b'{"step":1}')
    assert s.mac(msg) == request_mac(key, "POST", "/api/v1/runs/r1/heartbeat", 1000, "n" * 16, b'{"step":1}')
    h = mac_headers(SessionKey(PEER, sid, key), "POST", "/p", b"", now_ms=5, nonce="x" * 16)
    assert b64decode_mac(h["X-Distro-Mac"]) == request_mac(key, "POST", "/p", 5, "x" * 16, b"")


def test_the_key_is_bound_to_run_peer_and_session() -> None:
    a, b = new_ephemeral(), new_ephemeral()
    base = {"run_id": "r1", "peer_id_b58": PEER, "session_id": "s" * 22}
    pubs = {"client_public_b64": a[1], "server_public_b64": b[1]}
    k = derive_session_key(a[0], b[1], **base, **pubs)
    assert k == derive_session_key(b[0], a[1], **base, **pubs)  # both ends agree
    for change in ({"run_id": "r2"}, {"peer_id_b58": PEER[:-1] + "C"}, {"session_id": "t" * 22}):
        assert derive_session_key(a[0], b[1], **{**base, **change}, **pubs) != k
    swapped = {"client_public_b64": b[1], "server_public_b64": a[1]}
    assert derive_session_key(a[0], b[1], **base, **swapped) != k


@pytest.mark.parametrize("bad", [base64.b64encode(bytes(32)).decode(), "AAAA", "not base64!" * 4])
def test_unusable_node_keys_are_refused(bad: str) -> None:
    with pytest.raises(ApiError) as e:
        SessionTable(60.0).open("r1", PEER, bad, 0.0)
    assert e.value.code.value == "invalid_field" and e.value.field == "body.x25519"


def test_sessions_expire_and_the_table_is_bounded() -> None:
    table = SessionTable(10.0, per_peer=2, max_sessions=5)
    first, _ = _client_key(table, now=0.0)
    second, _ = _client_key(table, now=1.0)
    third, _ = _client_key(table, now=2.0)  # a peer's third session drops its oldest
    assert table.get(first, 3.0) is None and table.get(second, 3.0) is not None
    assert table.get(third, 11.9) is not None and table.get(third, 12.0) is None  # ttl from creation
    others = [_client_key(table, peer=PEER[:-2] + c, now=3.0)[0] for c in "CDEF"]
    assert len(table) == 5  # the cap holds: the oldest session went first
    assert table.get(second, 3.0) is None and all(table.get(s, 3.0) for s in others)
    table.prune(100.0)
    assert len(table) == 0


def test_mac_header_must_be_32_bytes_of_base64() -> None:
    for bad in ("A" * 43, "!" * 44, base64.b64encode(bytes(33)).decode()):
        with pytest.raises(ApiError) as e:
            b64decode_mac(bad)
        assert e.value.code.value == "bad_signature"


def test_the_documented_test_vector() -> None:
    """docs/protocol.md §11: fixed X25519 keys give this session key and this request MAC."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from distronet.protocol.coordinator_session import public_b64

    c = X25519PrivateKey.from_private_bytes(bytes(range(32)))
    s = X25519PrivateKey.from_private_bytes(bytes(range(32, 64)))
    cp, sp = public_b64(c), public_b64(s)
    assert (cp, sp) == (
        "j0DFrbaPJWJK5bIU6nZ6bslNgp09e14a0bpvPiE4KF8=",
        "NYBy1jZYgNGu6jKa35EhODhR7SGijjt16WXQ0s0WYlQ=",
    )
    ids = {"run_id": "r1", "peer_id_b58": PEER, "session_id": "A" * 22}
    key = derive_session_key(c, sp, **ids, client_public_b64=cp, server_public_b64=sp)
    assert key.hex() == "2f58f344f9e8fd2d5d5326a9a31c64c1b0f1806551d7a079a5f38fbec2618d3d"
    mac = request_mac(
        key, "POST", "/api/v1/runs/r1/heartbeat", 1700000000000, "abcdefghijklmnop", b'{"step":1}'
    )
    assert base64.b64encode(mac).decode() == "BDZxRy85w4gV98StMmvcpyLOQGUFMeQa4vmJPLp0Yco="
