"""Newcomer state sync over REAL p2pd: several donors, verified chunks, spread load, resume from disk."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from distronet.node.swarm.errors import PullError
from distronet.node.swarm.membership import MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig
from distronet.node.swarm.stack import Swarm
from distronet.node.swarm.statesync import NoNewerState, StateDonor, ask_manifest, describe, fetch_state
from distronet.protocol.identity import Identity

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

RUN = "sync-run"
CHUNK = 256 * 1024
BLOB = os.urandom(12 * CHUNK + 1000)  # 13 chunks, the last one short


async def start(tmp: Path, name: str, boot: tuple[str, ...] = ()) -> Swarm:
    ident = Identity.generate()
    ident.save(tmp / name)
    cfg = SwarmConfig(identity_path=str(tmp / name), bootstrap=boot, nat_traversal=False)
    return await Swarm.start(ident, cfg, MembershipConfig(run_id=RUN, ttl_s=10.0, dht_wait_timeout_s=1.0))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[list[Swarm], list[StateDonor]]]:
    tmp = tmp_path_factory.mktemp("sync")
    nodes = [await start(tmp, "a")]
    donors: list[StateDonor] = []
    try:
        boot = tuple(await nodes[0].host.maddrs())
        nodes += [await start(tmp, "b", boot), await start(tmp, "c", boot)]
        donors = [await StateDonor.create(n) for n in nodes[:2]]
        yield nodes, donors
    finally:
        for d in donors:
            await d.close()
        for n in nodes:
            await n.close()


async def test_newcomer_fetches_from_several_donors_with_progress(
    cluster: tuple[list[Swarm], list[StateDonor]],
) -> None:
    (a, b, c), (da, db) = cluster
    offered = [da.offer(7, BLOB, chunk_bytes=CHUNK), db.offer(7, BLOB, chunk_bytes=CHUNK)]
    assert offered[0].root == offered[1].root and len(offered[0].chunks) == 13
    seen: list[tuple[int, int]] = []
    manifest, blob = await fetch_state(
        c,
        [a.host.peer_id, b.host.peer_id],
        timeout=60.0,
        per_donor=2,
        progress=lambda d, t: seen.append((d, t)),
    )
    assert blob == BLOB and manifest.step == 7
    assert "13 chunks" in describe(manifest)
    assert da.puller.served + db.puller.served == 13
    assert da.puller.served >= 3 and db.puller.served >= 3  # spread, not one donor doing it all
    assert seen[-1] == (len(BLOB), len(BLOB)) and [d for d, _ in seen] == sorted(d for d, _ in seen)


async def test_newest_step_wins_and_a_fetch_resumes_from_its_cache(
    cluster: tuple[list[Swarm], list[StateDonor]], tmp_path: Path
) -> None:
    (a, b, c), (da, db) = cluster
    newer = bytes(reversed(BLOB))
    da.offer(9, newer, chunk_bytes=CHUNK)
    db.offer(8, BLOB, chunk_bytes=CHUNK)  # stale donor: must not be used
    # a previous, interrupted fetch left 5 verified chunks and one corrupt file behind
    for i in range(5):
        piece = newer[i * CHUNK : (i + 1) * CHUNK]
        (tmp_path / hashlib.sha256(piece).hexdigest()).write_bytes(piece)
    bad = newer[5 * CHUNK : 6 * CHUNK]
    (tmp_path / hashlib.sha256(bad).hexdigest()).write_bytes(b"x" * len(bad))
    served = da.puller.served, db.puller.served
    manifest, blob = await fetch_state(c, [b.host.peer_id, a.host.peer_id], timeout=60.0, cache_dir=tmp_path)
    assert manifest.step == 9 and blob == newer
    assert da.puller.served - served[0] == 13 - 5  # only what the cache lacked (the corrupt one refetched)
    assert db.puller.served == served[1]
    assert len(list(tmp_path.iterdir())) == 13  # every chunk now cached for the next resume


async def test_no_donor_is_a_typed_error(cluster: tuple[list[Swarm], list[StateDonor]]) -> None:
    (a, _, c), _ = cluster
    start = time.monotonic()
    with pytest.raises(PullError, match="offered a state"):
        await fetch_state(a, [c.host.peer_id], timeout=5.0)  # c serves no manifests
    assert time.monotonic() - start < 6.0


async def test_nothing_newer_is_decided_from_the_manifests_alone(
    cluster: tuple[list[Swarm], list[StateDonor]],
) -> None:
    (a, b, c), (da, db) = cluster
    da.offer(11, BLOB, chunk_bytes=CHUNK)
    db.offer(11, BLOB, chunk_bytes=CHUNK)
    served = da.puller.served, db.puller.served
    with pytest.raises(NoNewerState, match="step 11 <= 11"):
        await fetch_state(c, [a.host.peer_id, b.host.peer_id], timeout=30.0, newer_than=11)
    assert (da.puller.served, db.puller.served) == served  # not one chunk downloaded
    manifest, _ = await fetch_state(c, [a.host.peer_id, b.host.peer_id], timeout=30.0, newer_than=10)
    assert manifest.step == 11


async def test_a_lazy_offer_is_built_once_on_the_first_request_and_fetched(
    cluster: tuple[list[Swarm], list[StateDonor]],
) -> None:
    (a, b, c), (da, db) = cluster
    calls: list[int] = []
    newer = os.urandom(3 * CHUNK + 5)

    def build() -> bytes:
        calls.append(1)
        return newer

    da.chunk_bytes = db.chunk_bytes = CHUNK
    built = da.built
    da.offer_lazy(20, build)
    db.offer_lazy(20, build)
    assert calls == []  # offering costs nothing until a peer asks
    manifest, blob = await fetch_state(c, [a.host.peer_id, b.host.peer_id], timeout=60.0, newer_than=19)
    assert blob == newer and manifest.step == 20
    assert len(calls) == 2 and da.built == built + 1  # one build per donor, however many asks
    mine = await da.current()
    assert mine is not None and mine.sha256 == hashlib.sha256(newer).digest() and len(calls) == 2
    da.offer_lazy(21, lambda: (_ for _ in ()).throw(RuntimeError("overwritten")))
    with pytest.raises(RuntimeError):
        await da.current()
    old = await ask_manifest(c, a.host.peer_id, 10.0)
    assert old is not None and old.step == 20  # a snapshot that cannot be built: the last good offer
