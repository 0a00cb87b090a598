"""What the daemon's status shows of the peers admission keeps out (issue 17): the exchange counts
announcements and manifests it refused as not admitted per peer (``refused_peers``, bounded) and
knows each decided round's leader (``leader_of``); ``NodeStatus`` writes them (``not_admitted``,
``rejected``, ``leaders``; and ``state_donors``: whose state each adoption took)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from distronet.node.daemon.status import KEEP_ROUNDS, NodeStatus
from distronet.node.exchange.announced import MAX_REFUSED_SHOWN
from distronet.node.exchange.swarm import AsyncSwarmExchange, ExchangeConfig
from distronet.node.exchange.types import RoundState
from distronet.node.swarm.admission import Admission
from distronet.protocol.announce import seal_announcement
from distronet.protocol.credential import credential_ticket, seal_credential
from distronet.protocol.errors import RejectCode, Rejected
from distronet.protocol.identity import Identity
from distronet.protocol.manifest import open_manifest, seal_manifest

RUN = "refusals"
COORD, ROGUE = Identity.from_seed(b"\x07" * 32), Identity.from_seed(b"\x08" * 32)
FRAME = b"f" * 100


def credential(peer: Identity, signer: Identity = COORD) -> bytes:
    ticket = credential_ticket(b"secret", RUN, peer.peer_id)
    return seal_credential(
        signer, RUN, peer.peer_id, issued_at=int(time.time()), lifetime_s=600, ticket=ticket
    )


def exchange() -> AsyncSwarmExchange:
    swarm = SimpleNamespace(run_id=RUN, identity=Identity.generate())
    ex = AsyncSwarmExchange(swarm, ExchangeConfig(), None, Admission(RUN, COORD.peer_id))  # type: ignore[arg-type]
    ex._newest = 100  # a round of step 0 is out of the window: an admitted announcement stops there
    return ex


def refused_as(ex: AsyncSwarmExchange, peer: Identity, cred: bytes | None) -> RejectCode:
    with pytest.raises(Rejected) as e:
        ex._on_announcement(seal_announcement(peer, RUN, 0, FRAME, credential=cred), peer.peer_id)
    return e.value.code


def test_announcements_refused_for_their_credential_are_counted_per_peer() -> None:
    ex = exchange()
    honest, bare, forger, thief = (Identity.generate() for _ in range(4))
    assert refused_as(ex, honest, credential(honest)) is RejectCode.STALE_STEP  # admitted: past admission
    assert refused_as(ex, bare, None) is RejectCode.NOT_ADMITTED
    assert refused_as(ex, bare, None) is RejectCode.NOT_ADMITTED
    assert refused_as(ex, forger, credential(forger, ROGUE)) is RejectCode.BAD_SIGNATURE
    assert refused_as(ex, thief, credential(honest)) is RejectCode.WRONG_PEER
    assert ex.refused_peers == {bare.peer_id: 2, forger.peer_id: 1, thief.peer_id: 1}


def test_a_manifest_of_a_leader_not_admitted_is_counted_too() -> None:
    ex = exchange()
    liar = Identity.generate()
    with pytest.raises(Rejected) as e:
        ex._accept_manifest(seal_manifest(liar, RUN, 101, [(liar.peer_id, b"s" * 32, 100)]), liar.peer_id)
    assert e.value.code is RejectCode.NOT_ADMITTED and ex.refused_peers == {liar.peer_id: 1}


def test_the_latest_refused_peers_are_kept_and_no_more() -> None:
    ex = exchange()
    liars = [Identity.generate() for _ in range(MAX_REFUSED_SHOWN + 2)]
    for liar in liars[:MAX_REFUSED_SHOWN]:
        refused_as(ex, liar, None)
    refused_as(ex, liars[0], None)  # heard again: the newest now
    for liar in liars[MAX_REFUSED_SHOWN:]:  # two more push out the two oldest: liars 1 and 2
        refused_as(ex, liar, None)
    assert len(ex.refused_peers) == MAX_REFUSED_SHOWN and ex.refused_peers[liars[0].peer_id] == 2
    assert liars[1].peer_id not in ex.refused_peers and liars[2].peer_id not in ex.refused_peers
    assert list(ex.refused_peers)[-3:] == [liars[0].peer_id, *(x.peer_id for x in liars[-2:])]


def test_leader_of_a_round_is_its_adopted_manifests_leader() -> None:
    ex = exchange()
    leader = Identity.generate()
    data = seal_manifest(leader, RUN, 5, [(leader.peer_id, b"s" * 32, 100)])
    ex._rounds[5] = RoundState(0.0, adopted=open_manifest(data, run_id=RUN, max_entries=4, max_size=2**20))
    ex._rounds[6] = RoundState(0.0)  # not decided yet
    assert ex.leader_of(5) == leader.peer_id and ex.leader_of(6) is None and ex.leader_of(7) is None


def test_status_writes_leaders_refusals_and_keeps_leaders_with_their_rounds() -> None:
    s = NodeStatus("run", "peer")
    for step in range(KEEP_ROUNDS + 5):
        s.record_round(step, ["p1", "p2"], "p1" if step % 2 else None)
    s.rejected, s.not_admitted, s.state_donors = {"NOT_ADMITTED": 3}, {"liar": 3}, ["donor"]
    doc = s.to_json()
    assert set(doc["leaders"]) == {str(k) for k in range(5, KEEP_ROUNDS + 5) if k % 2}
    assert doc["rejected"] == {"NOT_ADMITTED": 3} and doc["not_admitted"] == {"liar": 3}
    assert doc["state_donors"] == ["donor"]
