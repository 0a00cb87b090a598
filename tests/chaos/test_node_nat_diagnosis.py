"""A node behind NAT whose relay is blocked says so: the "reaching nobody" diagnosis, end to end.

Set-up (``netns_nat.NatNet``): one public namespace holding the run's relay, a bare p2pd with its
relay service on (the relay a run hands out with its bootstrap peers; the test joins it to the
coordinator with its address, as a relay node does), and one home behind an
endpoint-independent NAT router holding node B, a real ``distro-node join`` process. The
coordinator listens on the public bridge. Steps and verdicts:

1. before B starts, the home router drops everything B's home sends to the relay's address
   (an nftables rule of the router's own, as a filtering router or firewall would);
2. B starts (bootstrap dial fails; it starts alone), keeps dialling the coordinator's peers and,
   after ``--reach-diagnosis-after-s 3`` without a peer, writes the diagnosis ``no_relay`` in its
   status file, its message naming the relay's address and the remedy; the log has that warning
   once (it repeats only every ``reach_diagnosis_every_s``); the coordinator's record of B
   carries the cause from B's heartbeat; B is still running (the diagnosis does not stop it);
3. the rule is removed: B reaches the relay (a direct link in its status), and the diagnosis
   moves off ``no_relay`` (to ``alone``: the relay is no training peer, and B is the run's only
   node).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from distronet.node.bench.netns import LinkShape
from distronet.node.bench.netns_nat import Home, NatKind, NatNet, missing_nat_requirements
from distronet.node.bench.netns_swarm import NetnsSwarm
from distronet.node.daemon.coordinator_client import CoordinatorClient
from distronet.node.demo import wait_until, write_run
from distronet.protocol.identity import Identity

pytestmark = [
    pytest.mark.nat,
    pytest.mark.netns,
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(150),
]

WHY_NOT = missing_nat_requirements()
RUN_ID = "reach"
RELAY_PORT = 4011
BLOCK_TABLE = "reachblock"


def _p2pd() -> str:
    spec = importlib.util.find_spec("hivemind")
    assert spec is not None and spec.submodule_search_locations, "hivemind is not installed"
    return str(Path(spec.submodule_search_locations[0]) / "hivemind_cli" / "p2pd")


def _nft(net: NatNet, ruleset: str) -> None:
    proc = subprocess.run(
        ["ip", "netns", "exec", net.router_ns(0), "nft", "-f", "-"],
        input=ruleset, capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def _block(net: NatNet, ip: str) -> None:
    """The router drops whatever its home sends to ``ip`` (before its NAT's own forward filter)."""
    _nft(net, f"table ip {BLOCK_TABLE} {{\n  chain forward {{ type filter hook forward priority -10; "
              f"policy accept;\n    ip daddr {ip} drop\n  }}\n}}\n")  # fmt: skip


def _unblock(net: NatNet) -> None:
    _nft(net, f"delete table ip {BLOCK_TABLE}\n")


async def _join_relay(url: str, relay: Identity, maddr: str) -> None:
    async with CoordinatorClient(url, RUN_ID, relay) as c:
        await c.join(multiaddrs=[maddr], agent="test-relay")


@pytest.mark.skipif(WHY_NOT is not None and not os.environ.get("CI"), reason=WHY_NOT or "")
def test_a_blocked_relay_is_diagnosed_as_no_relay(tmp_path: Path) -> None:
    assert WHY_NOT is None, f"CI must run the NAT tests: {WHY_NOT}"
    run = write_run(tmp_path, RUN_ID, shards=2, node_timeout_s=300.0)
    with NatNet(1, [Home(NatKind.EIM, 1)], LinkShape("50mbit", "50mbit", 0.0), prefix="dnd",
                public_net="192.0.0.96/27", lan_base="10.81") as net:  # fmt: skip
        relay_ip = net.node_ip(0)
        relay = Identity.generate()
        relay.save(tmp_path / "relay.key")
        relay_addr = f"/ip4/{relay_ip}/tcp/{RELAY_PORT}"
        relay_proc = subprocess.Popen(
            [*net.exec_prefix(0), _p2pd(), "-listen", f"/unix{tmp_path}/relay.sock", "-hostAddrs", relay_addr,
             "-id", str(tmp_path / "relay.key"), "-relay", "-relayService", "-q"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            with NetnsSwarm(net, tmp_path, run, RUN_ID) as swarm:
                swarm.start_coordinator()
                asyncio.run(_join_relay(swarm.url, relay, relay_addr))
                _block(net, relay_ip)  # 1
                # start_node runs node i in namespace i: index 0, the relay's, is taken by a
                # placeholder that has already exited
                swarm.nodes.append(subprocess.Popen(["true"]))
                swarm.node_dirs.append(tmp_path / "relay")
                b = swarm.start_node(
                    "--reach-diagnosis-after-s", "3", "--start-timeout-s", "140", min_peers=2
                )
                assert b == 1

                def diagnosed(cause: str) -> bool:
                    assert swarm.nodes[b].poll() is None, f"B exited:\n{swarm.log_tail(b)}"
                    return swarm.status(b).get("diagnosis") == cause

                try:  # 2
                    wait_until(lambda: diagnosed("no_relay"), 90, "B's no_relay diagnosis")
                except Exception as e:
                    raise AssertionError(f"{e}; B's log:\n{swarm.log_tail(b)}") from None
                text = swarm.status(b)["diagnosis_text"]
                assert text.startswith("reaching no peer: no relay reachable"), text
                assert f"{relay_addr}/p2p/{relay.peer_id_b58}" in text and "outbound TCP" in text
                log = (tmp_path / "node1.log").read_text(errors="replace")
                assert log.count("no relay reachable") == 1, swarm.log_tail(b)

                def coordinator_knows() -> bool:
                    nodes = swarm.api(f"/runs/{RUN_ID}/nodes")["nodes"]
                    mine = [n for n in nodes if n["peer_id"] == swarm.status(b).get("peer_id")]
                    return bool(mine) and (mine[0]["reach"] or {}).get("diagnosis") == "no_relay"

                wait_until(coordinator_knows, 20, "the coordinator's record of B's diagnosis")
                _unblock(net)  # 3
                wait_until(lambda: diagnosed("alone"), 60, "B's diagnosis after the relay came back")
                st = swarm.status(b)
                assert st["reach"].get(relay.peer_id_b58) == "direct", st["reach"]
                assert st["reach_direct"] >= 1 and st["reach_relayed"] == 0
                assert swarm.nodes[b].poll() is None
        finally:
            relay_proc.kill()
            relay_proc.wait(10)
