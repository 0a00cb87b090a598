"""The credit rules on a run's memory, clock driven by hand: which receipts back a lease, how
many steps a completion spends, how bootstrap reads a peer's network."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distronet.coordinator.bootstrap import network_of as _network_of
from distronet.coordinator.runs import ACTIVE, EVICTED, NodeRecord, RunState
from distronet.protocol.coordinator_api import CREATE_RUN


def _run(spec_factory: Callable[..., dict[str, Any]], **credit: Any) -> RunState:
    spec = spec_factory()
    spec["credit"] = credit
    run = RunState(CREATE_RUN.validate(spec), shard_root=None, created_at=0.0, state="open")
    for p in ("a", "b", "c"):
        run.nodes[p] = NodeRecord(p, ACTIVE, [], "", 0.0, 0.0)
    return run


def test_a_completion_spends_only_what_it_needs(spec_factory: Callable[..., dict[str, Any]]) -> None:
    run = _run(spec_factory, min_steps=2, min_acceptors=2)
    a = run.nodes["a"]
    a.credit_step(1, "c", 10.0, want=2)
    for step in range(2, 102):
        a.credit_step(step, "b", 10.0 + step, want=2)
    assert run.verified_steps(a, since=11.0) is None  # c's receipt came before the lease
    chosen = run.verified_steps(a, since=5.0)
    assert chosen == {101, 1}  # b's newest and c's one, not the hundred steps between
    a.spent |= chosen
    assert run.verified_steps(a, since=5.0) is None  # c has vouched for nothing unspent


def test_receipts_of_an_evicted_acceptor_back_nothing(spec_factory: Callable[..., dict[str, Any]]) -> None:
    run = _run(spec_factory, min_steps=1, min_acceptors=1)
    a = run.nodes["a"]
    a.credit_step(7, "b", 1.0)
    assert run.verified_steps(a, since=0.0) == {7}
    run.nodes["b"].state = EVICTED
    assert run.verified_steps(a, since=0.0) is None


def test_one_step_counts_up_to_min_acceptors_acceptors(spec_factory: Callable[..., dict[str, Any]]) -> None:
    run = _run(spec_factory, min_steps=1, min_acceptors=2)
    a = run.nodes["a"]
    assert a.credit_step(3, "b", 1.0, want=2) and a.credit_step(3, "c", 1.0, want=2)
    assert not a.may_credit(3, "d", 2) and not a.may_credit(3, "b", 2)
    assert a.steps == 1 and run.verified_steps(a, since=0.0) == {3}


def test_step_bound(spec_factory: Callable[..., dict[str, Any]]) -> None:
    run = _run(spec_factory, step_slack=10, max_step_rate=2.0)
    assert run.step_bound(now=3.0) == 9  # no receipts yet: 10 - 1, or 2/s for 3 s = 6
    assert run.step_bound(now=100.0) == 200
    run.max_credited = 500
    assert run.step_bound(now=100.0) == 510


def test_network_of_reads_the_first_ip_multiaddr() -> None:
    assert _network_of(["/dns4/x.example/tcp/1", "/ip4/10.1.2.3/tcp/4001"]) == ("10.1.0.0/16", "10.1.2.3")
    assert _network_of(["/ip6/2001:db8:1:2::5/udp/1/quic-v1"]) == ("2001:db8:1::/48", "2001:db8:1:2::5")
    assert _network_of(["/ip4/999.1.1.1/tcp/1"]) == ("/ip4/999.1.1.1/tcp/1", "/ip4/999.1.1.1/tcp/1")
