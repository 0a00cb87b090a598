"""AutoNAT's verdict and the hole punches, read from p2pd's metrics page (swarm/p2pd_metrics.py)."""

from __future__ import annotations

from distronet.node.swarm.p2pd_metrics import P2pdReach, parse

PAGE = """# HELP libp2p_autonat_reachability_status Current node reachability
# TYPE libp2p_autonat_reachability_status gauge
libp2p_autonat_reachability_status 2
# HELP libp2p_holepunch_outcomes_total Hole punch outcome per Transport
# TYPE libp2p_holepunch_outcomes_total counter
libp2p_holepunch_outcomes_total{num_attempts="1",outcome="success",side="initiator"} 2
libp2p_holepunch_outcomes_total{num_attempts="2",outcome="failed",side="initiator"} 5
libp2p_holepunch_outcomes_total{num_attempts="1",outcome="success",side="receiver"} 1
"""


def test_a_page_with_autonat_private_and_three_punches() -> None:
    assert parse(PAGE) == P2pdReach("private", 3)


def test_no_holepunch_family_is_unknown_and_odd_values_are_ignored() -> None:
    assert parse("libp2p_autonat_reachability_status 1\n") == P2pdReach("public", -1)
    assert parse("libp2p_autonat_reachability_status 7\n").reachability == "unknown"
    assert parse("libp2p_autonat_reachability_status NaN\n").reachability == "unknown"
    odd = (
        "# TYPE libp2p_holepunch_outcomes_total counter\n"
        + 'libp2p_holepunch_outcomes_total{outcome="success"} x\n'
    )
    assert parse(odd) == P2pdReach("unknown", 0)
    assert parse("") == P2pdReach()
