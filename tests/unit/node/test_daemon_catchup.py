"""``catchup/resync.CatchUp``'s decisions with the network stubbed out: when a node replays, when it
downloads the swarm's state, what adopting one resets, drift repair, and the resync after a failed
round (``replay_rounds``, ``fetch_state`` and the blob loader replaced by fakes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from distronet.node.catchup import resync, state
from distronet.node.catchup.digests import DigestBoard
from distronet.node.catchup.replay import Replayed
from distronet.node.catchup.replica import Replica
from distronet.node.catchup.resync import VERIFY_STEPS, CatchUp, CatchUpError
from distronet.node.catchup.state import StateRefused
from distronet.node.catchup.statesync import NoNewerState, NoQuorum
from distronet.node.daemon.status import NodeStatus
from distronet.node.exchange.swarm import FellBehind
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

WARMUP = 3


class _Peer:
    def __init__(self, name: bytes) -> None:
        self.name = name

    def to_bytes(self) -> bytes:
        return self.name

    def to_base58(self) -> str:  # what the run's peers are keyed by (never a relay's id here)
        return self.name.hex()


A, B = _Peer(b"a" * 38), _Peer(b"b" * 38)
DONOR = Identity.from_seed(b"\x05" * 32)  # the signer of the state manifest the fake fetch chooses


@dataclass
class _Optimizer:
    resumed: list[int] = field(default_factory=list)

    def resume_at(self, step: int) -> None:
        self.resumed.append(step)


@dataclass
class _Net:
    """What the fakes were asked: replays (peers, timeout), fetches (donors, newer_than)."""

    replays: list[Replayed | None]  # answers, in order (the step moves by ``rounds``)
    fetch: int | Exception | None = None  # the fetched state's step, or what fetching raises
    loads: list[Exception | None] = field(default_factory=list)  # a load that raises, in order
    replayed: list[tuple[set[bytes], float]] = field(default_factory=list)
    fetched: list[tuple[set[bytes], int]] = field(default_factory=list)
    bounds: list[int | None] = field(default_factory=list)  # what ``bound()`` gave, once offers came
    ats: list[int] = field(default_factory=list)  # the step each fetch asked the donors' state of


def _catch_up(monkeypatch: pytest.MonkeyPatch, net: _Net, step: int = 0) -> tuple[CatchUp, Replica, Any]:
    swarm = SimpleNamespace(
        topic="t",
        gossip=SimpleNamespace(topic_peers=_async([A, B])),
        host=SimpleNamespace(relay_ids=frozenset()),
    )
    core = SimpleNamespace(start_warmup=lambda s: s + WARMUP)
    offered: list[int] = []
    donor = SimpleNamespace(offer=lambda s, blob: offered.append(s))
    trainer = SimpleNamespace(model=object(), optimizer=_Optimizer())
    replica = Replica(trainer, trainer.optimizer, _Optimizer, step=step)
    status = NodeStatus("r", "me")

    async def replay_rounds(rep: Replica, _core: Any, peers: list[bytes], timeout: float) -> Replayed | None:
        net.replayed.append((set(peers), timeout))
        got = net.replays.pop(0)
        if got is not None:
            rep.step += got.rounds
        return got

    async def fetch_state(
        _swarm: Any, donors: list[Any], *, newer_than: int, bound: Any = None, at: int = 0, **_: Any
    ) -> tuple[Any, bytes]:
        net.fetched.append(({d.name for d in donors}, newer_than))  # the offers are in ...
        net.ats.append(at)
        if bound is not None:
            net.bounds.append(await bound())  # ... then the bound is asked
        if isinstance(net.fetch, Exception):
            raise net.fetch
        if net.fetch is None:
            raise NoNewerState("nothing newer")
        return SimpleNamespace(step=net.fetch, peer_id=DONOR.peer_id), b"blob"

    def load_state_blob(blob: bytes, model: Any, optimizer: Any) -> int:
        err = net.loads.pop(0) if net.loads else None
        if err is not None:
            raise err
        assert isinstance(net.fetch, int)
        return net.fetch

    monkeypatch.setattr(resync, "replay_rounds", replay_rounds)
    monkeypatch.setattr(resync, "vouched_step", _async(None))  # no peer vouches: no bound
    monkeypatch.setattr(resync, "fetch_state", fetch_state)
    monkeypatch.setattr(state, "load_state_blob", load_state_blob)
    cu = CatchUp(
        swarm, core, donor, DigestBoard(), replica, status,
        count_drift=lambda _: None, stop=asyncio.Event(),
    )  # fmt: skip
    cu.offered = offered
    return cu, replica, status


def _async(value: Any) -> Any:
    async def call(*_: Any) -> Any:
        return value

    return call


async def test_a_newcomer_in_step_with_the_swarm_downloads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _Net([Replayed(first=0, rounds=0, swarm_step=1)])
    cu, replica, status = _catch_up(monkeypatch, net)
    assert not await cu.catch_up(newer_than=0, timeout=30.0, joining=True)
    assert net.fetched == [] and replica.step == 0 and status.resyncs == 0
    assert net.replayed == [({A.name, B.name}, 20.0)]  # the replay is capped at REPLAY_S


async def test_replaying_to_the_tip_keeps_momentum_and_verifies(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _Net([Replayed(first=2, rounds=5, swarm_step=7)])
    cu, replica, status = _catch_up(monkeypatch, net, step=2)
    optimizer = replica.optimizer
    assert await cu.catch_up(newer_than=2, timeout=5.0)
    assert replica.step == 7 and replica.optimizer is optimizer and net.fetched == []
    assert (status.resyncs, status.replayed_rounds, status.warmup_until) == (1, 5, -1)  # no warm-up
    assert replica.verify_until == 7 + VERIFY_STEPS


async def test_too_far_behind_it_adopts_a_state_with_zero_momentum_then_replays_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = _Net([None, Replayed(first=40, rounds=2, swarm_step=42)], fetch=40)
    cu, replica, status = _catch_up(monkeypatch, net, step=3)
    old = replica.optimizer
    assert await cu.catch_up(newer_than=3, timeout=30.0)
    assert net.fetched == [({A.name, B.name}, 3)]
    assert replica.optimizer is not old and replica.trainer.optimizer is replica.optimizer
    assert replica.optimizer.resumed == [40]
    assert cu.offered == [40]  # offered to others in turn
    assert replica.step == 42 and net.replayed[1][1] == resync.REPLAY_AFTER_S
    assert status.resyncs == 2 and status.resync_steps == [42]  # the download and the replay after it
    assert status.state_donors == [DONOR.peer_id_b58]  # whose state it adopted
    assert status.warmup_until == 42 + WARMUP and replica.verify_until == 42 + VERIFY_STEPS


async def test_the_step_bound_is_asked_after_the_offers_so_a_fast_swarm_is_not_out_of_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI saw a newcomer never join: it asked the peers' steps (34), then the offers (37, the
    swarm steps ~7 a second) were past the bound 34 + SWARM_SLACK, again and again. The bound is
    now asked once the offers are in; a drift repair (donors given) has none. The peers' steps
    are also asked before the fetch: the donors are asked for their state RENDEZVOUS_AHEAD past
    the vouched step (a drift repair asks the winners' state of now)."""
    net = _Net([None, Replayed(first=40, rounds=0, swarm_step=40)], fetch=40)
    cu, _, _ = _catch_up(monkeypatch, net, step=3)
    asked: list[int] = []

    async def vouched(_core: Any, peers: list[bytes], quorum: int) -> int:
        asked.append(len(net.fetched))  # how many fetches had begun when the peers were asked
        return 39

    monkeypatch.setattr(resync, "vouched_step", vouched)
    assert await cu.catch_up(newer_than=3, timeout=30.0)
    assert asked == [0, 1] and net.bounds == [39 + resync.SWARM_SLACK]
    assert net.ats == [39 + resync.RENDEZVOUS_AHEAD]
    assert await cu.catch_up(newer_than=8, timeout=30.0, donors=[B])
    assert net.bounds == [39 + resync.SWARM_SLACK]  # no bound for the drift check's winners
    assert net.ats == [39 + resync.RENDEZVOUS_AHEAD, 0]


async def test_drift_repair_fetches_from_the_winners_only_and_never_replays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = _Net([], fetch=9)
    cu, replica, _ = _catch_up(monkeypatch, net, step=9)
    assert await cu.catch_up(newer_than=8, timeout=30.0, donors=[B])
    assert net.replayed == [] and net.fetched == [({B.name}, 8)] and replica.step == 9


async def test_a_state_that_does_not_fit_fails_and_the_newcomer_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = _Net([None, None, None], fetch=12, loads=[ConfigError("other model")])
    cu, replica, status = _catch_up(monkeypatch, net)
    await cu.join(timeout=10.0)
    assert len(net.fetched) == 2 and replica.step == 12 and status.resyncs == 1 and not cu.failed


async def test_no_quorum_or_a_refused_state_adopts_nothing_and_the_newcomer_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = _Net([None] * 50, fetch=NoQuorum("1 of the 2 donors needed"))
    cu, replica, status = _catch_up(monkeypatch, net)
    await cu.join(timeout=1.0)
    assert len(net.fetched) >= 2 and replica.step == 0 and status.resyncs == 0 and cu.failed
    net = _Net([None] * 50, fetch=12, loads=[StateRefused("NaN")] * 50)
    cu, replica, status = _catch_up(monkeypatch, net)
    await cu.join(timeout=1.0)
    assert len(net.fetched) >= 2 and replica.step == 0 and status.resyncs == 0 and cu.failed


async def test_a_failed_round_without_a_newer_state_raises_catch_up_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = _Net([None] * 8)
    cu, replica, status = _catch_up(monkeypatch, net, step=5)
    with pytest.raises(CatchUpError, match="step 5 failed"):
        await cu.after_failed_round(FellBehind("paused", swarm_step=9), timeout=0.2)
    assert status.fell_behind == 1 and net.fetched and replica.step == 5
    cu.stop.set()  # a stop request ends the resync without an error
    await cu.after_failed_round(RuntimeError("round failed"), timeout=0.2)
    assert status.fell_behind == 1


async def test_a_drift_check_that_found_drift_is_acted_on_at_the_next_boundary_unless_moot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = _Net([], fetch=6)
    cu, replica, status = _catch_up(monkeypatch, net, step=6)
    found = asyncio.get_running_loop().create_future()
    found.set_result([B])  # a finished check: our digest after step 5 lost to B's
    cu.drift.task, cu.drift.resyncs = found, status.resyncs
    await cu.after_step(5, "ab" * 32, drift_every=0)
    assert cu.board.get(5) == bytes.fromhex("ab" * 32)  # served to the peers' checks
    assert net.fetched == [({B.name}, 5)] and net.replayed == [] and status.resyncs == 1
    assert cu.drift.task is not None  # just caught up: the next check starts at once (verify_until)
    cu.drift.cancel()
    moot = asyncio.get_running_loop().create_future()
    moot.set_result([A])
    cu.drift.task, cu.drift.resyncs = moot, status.resyncs - 1  # a catch-up came after it began
    replica.verify_until = -1
    await cu.after_step(6, "cd" * 32, drift_every=0)
    assert len(net.fetched) == 1 and cu.drift.task is None  # nothing adopted, no check due
