"""A swarm bound to admission, over three REAL p2pd peers: A and B hold credentials of the run's
coordinator, C's key was never admitted. C signs valid packets, announcements and manifests
(and ranks itself first wherever it can), yet no honest replica accepts a packet of C's, adopts
a manifest C leads, or pulls a frame from C. On the code before admission C's packet was in
every accepted set (it is a valid, signed packet of the run)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from p2p_trio import eventually, trio

from distronet.node.exchange.base import Round
from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig, manifest_topic, packet_check
from distronet.node.swarm.admission import Admission
from distronet.node.swarm.stack import Swarm
from distronet.protocol.announce import seal_announcement
from distronet.protocol.credential import credential_ticket, seal_credential
from distronet.protocol.errors import RejectCode
from distronet.protocol.identity import Identity
from distronet.protocol.layout import layout_digest
from distronet.protocol.manifest import seal_manifest
from distronet.protocol.packet import seal_packet

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

RUN = "admit-run"
DIGEST = layout_digest([("w", (64, 64), 32)])
CONFIG = ExchangeConfig(round_deadline_s=1.0, manifest_grace_s=0.3, manifest_wait_s=2.0, pull_timeout_s=10.0)
COORD = Identity.generate()
ROGUE = Identity.generate()  # a key that signs credentials, but not the run's coordinator key


def credential(peer: bytes, signer: Identity = COORD) -> bytes:
    ticket = credential_ticket(b"coordinator secret", RUN, peer)
    return seal_credential(signer, RUN, peer, issued_at=int(time.time()), lifetime_s=600, ticket=ticket)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def peers(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[list[tuple[Swarm, AsyncSwarmExchange]]]:
    async with trio(tmp_path_factory.mktemp("admit"), RUN, CONFIG) as out:
        (a, xa), (b, xb), (c, xc) = out
        for swarm, ex in ((a, xa), (b, xb)):
            ex.admission = Admission(RUN, COORD.peer_id)
            ex.credential = credential(swarm.identity.peer_id)
            ex.admission.offer(ex.credential)
        xc.credential = credential(c.identity.peer_id, ROGUE)  # well formed, wrong signer
        yield out


def packet(swarm: Swarm, step: int) -> bytes:
    return seal_packet(swarm.identity, RUN, step, DIGEST, os.urandom(20_000))


async def test_a_peer_never_admitted_gets_no_packet_accepted_no_round_led_and_no_pull(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (a, xa), (b, xb), (c, xc) = peers
    honest = sorted([a.identity.peer_id, b.identity.peer_id])
    for step in range(4):
        sent = {s.identity.peer_id: packet(s, step) for s, _ in peers}
        for swarm, ex in peers:
            await ex.publish(step, sent[swarm.identity.peer_id])
        # C also leads every round at once: a valid manifest, signed by C, listing all three
        entries = [(p, hashlib.sha256(f).digest(), len(f)) for p, f in sent.items()]
        forged = seal_manifest(c.identity, RUN, step, entries)
        await xc._manifest_gossip.publish(manifest_topic(RUN), forged)
        rounds: list[Round] = await asyncio.gather(xa.collect(step), xb.collect(step))
        assert all(r.manifest == tuple(honest) for r in rounds), step
        assert all(dict(r) == {p: sent[p] for p in honest} for r in rounds)
        for ex in (xa, xb):
            adopted = ex._rounds[step].adopted
            assert adopted is not None and adopted.leader in honest
            assert c.identity.peer_id not in ex._rounds[step].announced
    for ex in (xa, xb):
        assert ex.rejected[RejectCode.NOT_ADMITTED] >= 1  # its manifests (and announcements)

    async def announcements_refused() -> bool:  # gossip is best-effort: C's reach A at least once
        return bool(xa._not_admitted) or xa.rejected[RejectCode.BAD_SIGNATURE] > 0

    await eventually(announcements_refused, 10.0, "A to refuse C's announcements")
    # nobody pulled a frame (20 kB each) from C; it may have served a manifest it was asked for
    # (a replica starting up asks the topic's peers), which was then refused
    assert c.bandwidth.up.total_bytes < 20_000


async def test_an_announcement_without_a_credential_is_not_admitted(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (_, xa), (b, _), _ = peers
    bare = seal_announcement(b.identity, RUN, 4, b"z" * 100)  # B's own key, but no credential
    before = xa.rejected[RejectCode.NOT_ADMITTED]
    last = [0.0]

    async def refused() -> bool:
        if time.monotonic() - last[0] > 1.0:
            last[0] = time.monotonic()
            await b.gossip.publish(b.topic, bare)
        return xa.rejected[RejectCode.NOT_ADMITTED] > before

    await eventually(refused, 10.0, "A to refuse an announcement without a credential")
    assert 4 not in xa._rounds or b.identity.peer_id not in xa._rounds[4].announced


async def test_membership_records_carry_credentials_so_donors_are_known_before_announcing(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (a, xa), (b, _), (c, xc) = peers
    a.membership.credential = xa.credential
    c.membership.credential = xc.credential  # signed by another key than the run's coordinator
    await a.membership.announce()
    await c.membership.announce()
    fresh = Admission(RUN, COORD.peer_id)  # as a replica that has heard no announcement yet
    b.membership.on_members = fresh.learn_members

    async def a_known() -> bool:
        await b.membership.members()
        return fresh.admits(a.identity.peer_id)

    await eventually(a_known, 10.0, "B to learn A's credential from A's membership record")
    found = await b.membership.members()
    assert found[c.identity.peer_id_b58].credential == xc.credential  # carried, but it does not verify
    assert not fresh.admits(c.identity.peer_id) and fresh.admitted() == [a.identity.peer_id]


async def test_a_leader_lists_only_frames_that_open_as_the_producers_packet(
    peers: list[tuple[Swarm, AsyncSwarmExchange]],
) -> None:
    (a, xa), (b, xb), _ = peers
    for ex in (xa, xb):
        ex.frame_check = packet_check(RUN, DIGEST)
    step = 6
    bogus = b"\x00" * 20_000  # announced and signed by B, admitted, but no packet at all
    await xa.publish(step, packet(a, step))
    await xb.publish(step, bogus)

    async def refused() -> bool:
        return xa.frames_refused >= 1

    await eventually(refused, 10.0, "A to pull B's frame and refuse it")
    assert b.identity.peer_id not in xa._rounds[step].frames
