"""Membership credentials from a real coordinator over HTTP: join and heartbeat (the hot path)
answers carry one that verifies offline against the run's published ``coordinator_key``; the
key survives a restart; a node that left or was evicted gets none."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import local_coordinator
from distronet.node.daemon.coordinator_client import CoordinatorClient, CoordinatorRefused
from distronet.node.swarm.admission import Admission
from distronet.protocol.coordinator_api import CREATE_RUN
from distronet.protocol.credential import open_credential
from distronet.protocol.identity import Identity, peer_id_from_b58


def _spec() -> dict[str, object]:
    shards = [
        {"id": f"s{i}", "url": f"https://d.example/{i}", "sha256": "ab" * 32, "tokens": 100, "bytes": 100}
        for i in range(4)
    ]
    manifest = {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards}
    return CREATE_RUN.validate({"id": "r1", "data": {"manifest": manifest}})


async def test_join_and_heartbeat_carry_verifiable_credentials(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token="t", credential_ttl_s=120)
    me, other = Identity.generate(), Identity.generate()
    async with local_coordinator(cfg) as lc:
        lc.app.svc.create_run(_spec())
        async with CoordinatorClient(lc.url, "r1", me) as client:
            joined = await client.join()
            key = peer_id_from_b58(joined.run["coordinator_key"])
            first = client.credential
            assert first is not None
            cred = open_credential(
                first, run_id="r1", coordinator_key=key, now=time.time(), peer_id=me.peer_id
            )
            assert 119 <= cred.not_after - cred.issued_at <= 120
            seen: list[bytes] = []
            client.on_credential = seen.append
            answer = await client.heartbeat(3)  # served by the hot path
            assert answer is not None and answer["renewed"] == 0 and "credential" in answer
            assert seen and Admission("r1", key).offer(seen[0]) is not None
            async with CoordinatorClient(lc.url, "r1", other) as c2:
                await c2.join()
                assert c2.credential is not None
                ticket_a = cred.ticket
                ticket_b = open_credential(
                    c2.credential, run_id="r1", coordinator_key=key, now=time.time()
                ).ticket
                assert ticket_a != ticket_b
                lc.app.svc.evict(lc.app.svc.run("r1"), other.peer_id_b58, "test")
                with pytest.raises(CoordinatorRefused):
                    await c2.heartbeat(4)
            await client.leave()
            assert (
                lc.app.svc.credential(lc.app.svc.run("r1"), lc.app.svc.run("r1").nodes[me.peer_id_b58])
                is None
            )
    async with local_coordinator(cfg) as lc:  # restarted: the same key, the same tickets
        client = CoordinatorClient(lc.url, "r1", me)
        joined = await client.join()
        await client.close()
        assert peer_id_from_b58(joined.run["coordinator_key"]) == key
        assert client.credential is not None
        again = open_credential(client.credential, run_id="r1", coordinator_key=key, now=time.time())
        assert again.ticket == ticket_a
    assert (tmp_path / "coordinator.key").stat().st_mode & 0o077 == 0


async def test_no_credentials_when_turned_off(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(db=f"sqlite:///{tmp_path / 'c.db'}", operator_token="t", credential_ttl_s=0)
    async with local_coordinator(cfg) as lc:
        lc.app.svc.create_run(_spec())
        async with CoordinatorClient(lc.url, "r1", Identity.generate()) as client:
            joined = await client.join()
            assert joined.run["coordinator_key"] is None and client.credential is None
            answer = await client.heartbeat(1)
            assert answer == {"renewed": 0, "peers_live": 1, "step": 1}
    assert not (tmp_path / "coordinator.key").exists()
