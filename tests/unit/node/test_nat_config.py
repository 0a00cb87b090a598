"""NAT traversal settings: p2pd flags for relays and the relay role, what a join answer's and a
run file's relays may be, the NAT topology's address plan, and the direct/relayed verdict."""

from __future__ import annotations

import pytest

from distronet.node.bench.nat_probe import link_kinds
from distronet.node.bench.netns import LinkShape, NetnsError
from distronet.node.bench.netns_nat import Home, NatKind, NatNet
from distronet.node.config import NetConfig
from distronet.node.daemon.coordinator_client import MAX_RELAYS, relay_list
from distronet.node.swarm.p2p import RelayService, SwarmConfig, _daemon_flags, _uses_relays
from distronet.protocol.coordinator_api import CREATE_RUN, ApiError
from distronet.protocol.errors import ConfigError

PEER = "12D3KooWGmGvoHiaFxgtH7iuGJ555s2nZcKcFdudizUic4JEwYwY"
RELAY = f"/ip4/192.0.0.130/tcp/4002/p2p/{PEER}"


def test_a_node_relays_for_nobody_and_reserves_on_the_run_relays() -> None:
    plain = _daemon_flags(SwarmConfig())
    assert plain["relayService"] == 0 and "relayDiscovery" not in plain
    cfg = SwarmConfig(relays=(RELAY,), reachability="private")
    assert _uses_relays(cfg)
    flags = _daemon_flags(cfg)
    assert flags["relayService"] == 0 and flags["relayDiscovery"] == 0  # static relays, no 3-min wait
    assert not _uses_relays(SwarmConfig(relays=(RELAY,), nat_traversal=False))


def test_the_relay_role_passes_its_limits() -> None:
    limits = RelayService(max_circuits=4, max_reservations=32, circuit_bytes=1 << 20, circuit_s=60.0)
    flags = _daemon_flags(SwarmConfig(relay_service=limits))
    assert flags["relay"] == 1 and flags["relayService"] == 1
    assert flags["relayMaxCircuits"] == 4 and flags["relayMaxReservations"] == 32
    assert flags["relayDataLimit"] == 1 << 20 and flags["relayTimeLimit"] == "60.0s"


@pytest.mark.parametrize(
    "kwargs",
    [{"max_circuits": 0}, {"circuit_bytes": 10}, {"circuit_s": 0.1}, {"buffer_bytes": 1 << 30}],
)
def test_relay_limits_out_of_range_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RelayService(**kwargs)  # type: ignore[arg-type]


def test_bad_reachability_or_relay_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="reachability"):
        SwarmConfig(reachability="maybe")
    with pytest.raises(ConfigError, match="/p2p/"):
        SwarmConfig(relays=("/ip4/1.2.3.4/tcp/1",))
    with pytest.raises(ConfigError, match="/p2p/"):
        NetConfig(relays="/ip4/1.2.3.4/tcp/1")
    assert NetConfig(relays=f" {RELAY} , ,{RELAY}").relay_list == (RELAY, RELAY)


def test_a_join_answer_relays_are_checked_and_capped() -> None:
    assert relay_list(None) == () and relay_list("x") == ()
    got = relay_list([RELAY, 7, "/ip4/1.2.3.4/tcp/1", "no-slash/p2p/x", "/" + "a" * 300 + "/p2p/x"])
    assert got == (RELAY,)
    assert len(relay_list([RELAY] * 50)) == MAX_RELAYS


def _run(relays: object) -> dict[str, object]:
    shard = {"id": "s0", "path": "s0.bin", "sha256": "0" * 64, "tokens": 10, "bytes": 10}
    manifest = {"version": 1, "tokenizer": "bytes", "dtype": "uint8", "shards": [shard]}
    return CREATE_RUN.validate({"id": "r", "data": {"manifest": manifest}, "relays": relays}, "run")


def test_a_run_file_relays_must_be_full_multiaddrs() -> None:
    assert _run([RELAY])["relays"] == [RELAY]
    with pytest.raises(ApiError):
        _run(["/ip4/1.2.3.4/tcp/1"])
    with pytest.raises(ApiError):
        _run([RELAY] * 9)


def test_nat_net_address_plan() -> None:
    net = NatNet(1, [Home(NatKind.EIM, 2), Home(NatKind.SYMMETRIC, 1)], LinkShape(), prefix="dnu")
    assert net.n == 4 and net.host_ip == "192.0.0.129"
    assert [x.ip for x in net.nodes] == ["192.0.0.130", "10.78.10.10", "10.78.10.11", "10.78.11.10"]
    assert net.indices(public=True) == [0] and net.indices(home=0) == [1, 2] and net.indices(home=1) == [3]
    assert net.router_wan_ip(0) == "192.0.0.158" and net.seen_as(3) == net.router_wan_ip(1)
    assert net.exec_prefix(3) == ["ip", "netns", "exec", "dnu-h1n0"]
    with pytest.raises(NetnsError):
        NatNet(1, [], LinkShape(), prefix="toolong")
    with pytest.raises(NetnsError):
        NatNet(30, [], LinkShape(), public_net="192.0.0.128/27")
    with pytest.raises(NetnsError):
        Home(NatKind.EIM, 0)


def test_a_peer_is_direct_when_any_connection_is() -> None:
    circuit = f"{RELAY}/p2p-circuit"
    kinds = link_kinds({"a": [circuit], "b": [circuit, "/ip4/10.0.0.1/tcp/5"], "c": ["/ip4/10.0.0.2/tcp/5"]})
    assert kinds == {"a": "relayed", "b": "direct", "c": "direct"}
