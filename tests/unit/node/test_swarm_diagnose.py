"""The 'reaching nobody' diagnosis: each cause from the facts that point to it (swarm/diagnose.py)."""

from __future__ import annotations

from distronet.node.swarm.diagnose import CAUSES, Cause, ReachFacts, diagnose, is_public
from distronet.node.swarm.reach import Route
from distronet.protocol.coordinator_api import REACH_CAUSES

RELAY_ID = "12D3KooWRelayAAAA"
RELAY = {RELAY_ID: ("/ip4/203.0.113.7/tcp/4001/p2p/" + RELAY_ID,)}
HOME = frozenset({"127.0.0.1", "10.1.0.2"})  # a machine behind a home router
PUBLIC_HOST = frozenset({"127.0.0.1", "8.8.4.4"})  # a machine with a public interface address
NATTED_PEER = ("/ip4/10.2.0.2/tcp/4001",)  # a peer that offers only its private address
PUBLIC_PEER = ("/ip4/9.9.9.9/tcp/4001",)


def test_causes_are_the_protocols() -> None:
    assert CAUSES == REACH_CAUSES


def test_public_means_globally_routable() -> None:
    assert is_public("8.8.4.4") and is_public("2606:4700::1111")
    for ip in ("10.1.0.2", "192.168.1.4", "100.64.0.1", "127.0.0.1", "fe80::1", "not-an-ip"):
        assert not is_public(ip), ip


def test_every_relay_dial_failed_is_no_relay_and_names_the_relay() -> None:
    f = ReachFacts(relays=RELAY, relay_dials={RELAY_ID: False}, local_ips=HOME)
    d = diagnose(f)
    assert d.cause is Cause.NO_RELAY
    assert "203.0.113.7/tcp/4001" in d.message and "relay" in d.message
    assert "outbound TCP" in d.remedy and "distro-node relay" in d.remedy
    assert d.text().startswith("reaching no peer: no relay reachable")


def test_a_relay_not_tried_yet_or_one_that_answered_is_not_no_relay() -> None:
    assert diagnose(ReachFacts(relays=RELAY, local_ips=HOME)).cause is Cause.ALONE
    ok = ReachFacts(relays=RELAY, relay_dials={RELAY_ID: True}, connected={RELAY_ID: Route.DIRECT})
    d = diagnose(ok)
    assert d.cause is Cause.ALONE and "relay/bootstrap peers only" in d.message
    # a failed dial while something is still connected (e.g. through another relay) is not it either
    other = ReachFacts(relays=RELAY, relay_dials={RELAY_ID: False}, connected={"X": Route.RELAYED})
    assert diagnose(other).cause is not Cause.NO_RELAY


def test_nobody_else_in_the_dht_is_alone() -> None:
    d = diagnose(ReachFacts(local_ips=HOME))
    assert d.cause is Cause.ALONE and "no other node" in d.message


def test_a_public_host_that_nobody_dials_has_a_firewall_on_its_listen_port() -> None:
    f = ReachFacts(members={"P": NATTED_PEER}, local_ips=PUBLIC_HOST, listen_ports=(4001,))
    d = diagnose(f)
    assert d.cause is Cause.FIREWALL
    assert "8.8.4.4" in d.message and "listen port 4001" in d.message
    assert "allow inbound TCP and UDP on port 4001" in d.remedy
    # AutoNAT's failed dial-backs say the same, whatever the peers offer
    g = ReachFacts(members={"P": PUBLIC_PEER}, local_ips=PUBLIC_HOST, reachability="private")
    assert diagnose(g).cause is Cause.FIREWALL and "AutoNAT" in diagnose(g).message
    # AutoNAT saying we are public rules the firewall out
    h = ReachFacts(members={"P": NATTED_PEER}, local_ips=PUBLIC_HOST, reachability="public")
    assert diagnose(h).cause is Cause.UNREACHABLE


def test_natted_on_both_sides_without_relay_addresses_is_symmetric_nat() -> None:
    f = ReachFacts(members={"P": NATTED_PEER, "Q": NATTED_PEER}, member_dials={"P": False}, local_ips=HOME)
    d = diagnose(f)
    assert d.cause is Cause.SYMMETRIC_NAT
    assert "every known peer (2)" in d.message and "symmetric" in d.message
    assert "distro-node relay" in d.remedy and "forward a port" in d.remedy


def test_a_peer_with_a_relayed_or_public_address_is_not_symmetric_nat() -> None:
    circuit = ("/ip4/203.0.113.7/tcp/4001/p2p/R/p2p-circuit",)
    for addrs in (circuit, PUBLIC_PEER):
        f = ReachFacts(members={"P": addrs}, member_dials={"P": False}, local_ips=HOME)
        d = diagnose(f)
        assert d.cause is Cause.UNREACHABLE, addrs
        assert "1 peer(s) known, 1 dialled without success (P)" in d.message


def test_relays_are_not_counted_as_peers_to_reach() -> None:
    f = ReachFacts(relays=RELAY, relay_dials={RELAY_ID: True}, members={RELAY_ID: PUBLIC_PEER},
                   connected={RELAY_ID: Route.DIRECT}, local_ips=HOME)  # fmt: skip
    assert diagnose(f).cause is Cause.ALONE
