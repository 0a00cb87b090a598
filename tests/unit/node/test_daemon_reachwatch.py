"""The node's reach bookkeeping: dial outcomes, the diagnosis's timing, status and heartbeat."""

from __future__ import annotations

import pytest

from distronet.node.config import NetConfig
from distronet.node.daemon.loops import reach_report
from distronet.node.daemon.reachwatch import MAX_DIALS, ReachWatch, port_of
from distronet.node.daemon.status import NodeStatus, StatusLine
from distronet.protocol.coordinator_api import HEARTBEAT, REACH_MAX_LINKS, ApiError
from distronet.protocol.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_dials_are_booked_as_relay_or_member_by_peer() -> None:
    w = ReachWatch(60, 600)
    w.set_relays(("/ip4/1.2.3.4/tcp/1/p2p/R1", "/ip6/::1/tcp/1/p2p/R1", "/ip4/5.6.7.8/tcp/1/p2p/R2"))
    assert w.relays == {"R1": ("/ip4/1.2.3.4/tcp/1/p2p/R1", "/ip6/::1/tcp/1/p2p/R1"),
                        "R2": ("/ip4/5.6.7.8/tcp/1/p2p/R2",)}  # fmt: skip
    w.dialled("/ip4/1.2.3.4/tcp/1/p2p/R1", False)
    w.dialled("M1", True)
    assert w.relay_dials == {"R1": False} and w.member_dials == {"M1": True}
    for i in range(MAX_DIALS + 10):
        w.dialled(f"X{i}", False)
    assert len(w.member_dials) == MAX_DIALS


def test_the_diagnosis_waits_after_s_then_repeats_every_s_or_on_a_new_cause() -> None:
    clock = Clock()
    w = ReachWatch(30, 600, clock=clock)
    assert not w.waited(False)
    clock.t += 29.9
    assert not w.waited(False)
    clock.t += 0.2
    assert w.waited(False) and w.due(cause_changed=False)  # never logged yet
    w._logged_at = clock.t
    clock.t += 300
    assert w.waited(False) and not w.due(cause_changed=False)
    assert w.due(cause_changed=True)
    clock.t += 300
    assert w.due(cause_changed=False)
    # a peer reached resets the wait
    assert not w.waited(True)
    clock.t += 10
    assert not w.waited(False)


def test_ports_of_multiaddrs() -> None:
    assert port_of("/ip4/0.0.0.0/tcp/4001") == 4001
    assert port_of("/ip4/1.2.3.4/udp/4001/quic-v1") == 4001
    assert port_of("/ip4/0.0.0.0/tcp/0") is None
    assert port_of("/unix/tmp/x") is None


def test_status_line_file_and_heartbeat_show_the_reach() -> None:
    s = NodeStatus("r", "me")
    s.reach = {f"P{i}": "direct" for i in range(300)}
    s.reach_direct, s.reach_relayed, s.reach_hole_punched = 300, 2, 1
    line = StatusLine.render(s)
    assert "links 300 direct 1 punched 2 relayed" in line and "REACHING NO PEER" not in line
    s.diagnosis, s.diagnosis_text = "no_relay", "reaching no peer: no relay reachable ..."
    assert "REACHING NO PEER: no_relay" in StatusLine.render(s)
    doc = s.to_json()
    assert len(doc["reach"]) == 256 and doc["diagnosis"] == "no_relay" and doc["reach_relayed"] == 2
    body = {"step": 1, "reach": reach_report(s)}
    assert HEARTBEAT.validate(body)["reach"] == {"direct": 300, "hole_punched": 1, "relayed": 2,
                                                 "diagnosis": "no_relay"}  # fmt: skip
    s.reach_direct = REACH_MAX_LINKS + 5  # clamped to what the protocol takes
    assert reach_report(s)["direct"] == REACH_MAX_LINKS


@pytest.mark.parametrize(
    "reach",
    [
        {"direct": REACH_MAX_LINKS + 1, "hole_punched": 0, "relayed": 0},
        {"direct": -1, "hole_punched": 0, "relayed": 0},
        {"direct": 0, "hole_punched": 0, "relayed": 0, "diagnosis": "gremlins"},
        {"direct": 0, "hole_punched": 0, "relayed": 0, "extra": 1},
        {"direct": 0, "relayed": 0},
        {"direct": "1", "hole_punched": 0, "relayed": 0},
        [1, 2, 3],
    ],
)
def test_a_heartbeats_reach_is_bounded_and_strict(reach: object) -> None:
    with pytest.raises(ApiError) as e:
        HEARTBEAT.validate({"step": 1, "reach": reach})
    assert e.value.body()["error"]["field"].startswith("body.reach")


def test_a_heartbeat_without_reach_leaves_it_none() -> None:
    assert HEARTBEAT.validate({"step": 1})["reach"] is None


def test_diagnosis_delays_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        NetConfig(reach_diagnosis_after_s=0)
    with pytest.raises(ConfigError):
        NetConfig(reach_diagnosis_every_s=-1)


def test_metrics_carry_routes_and_the_one_current_cause() -> None:
    from prometheus_client import generate_latest

    from distronet.node.daemon import reachwatch
    from distronet.node.daemon.metrics import NodeMetrics
    from distronet.node.swarm.diagnose import Cause, Diagnosis
    from distronet.node.swarm.reach import Route

    m, s, w = NodeMetrics(), NodeStatus("r", "me"), ReachWatch(1, 1)
    reachwatch._show_routes(s, m, {"A": Route.DIRECT, "B": Route.RELAYED, "C": Route.HOLE_PUNCHED})
    w._set(s, m, Diagnosis(Cause.FIREWALL, "m", "r"))
    text = generate_latest(m.registry).decode()
    for route in ("direct", "hole_punched", "relayed"):
        assert f'distro_node_peer_links{{route="{route}"}} 1.0' in text
    assert 'distro_node_reach_diagnosis{cause="firewall"} 1.0' in text
    assert 'distro_node_reach_diagnosis{cause="no_relay"} 0.0' in text
    assert s.diagnosis == "firewall" and s.diagnosis_text == "reaching no peer: m. What to do: r"
    w._set(s, m, None)
    assert 'distro_node_reach_diagnosis{cause="firewall"} 0.0' in generate_latest(m.registry).decode()
    assert s.diagnosis == "" and s.diagnosis_text == ""
