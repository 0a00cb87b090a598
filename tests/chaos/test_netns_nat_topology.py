"""The NAT test topology (``distronet.node.bench.netns_nat``) behaves like the routers it stands for.

Set-up: one public node and two homes of two nodes, one behind an endpoint-independent router,
one behind a symmetric one. In the public node, two TCP servers each answer a connection with
the ``address:port`` they saw it come from. Steps and verdicts:

1. a node in each home connects to both servers from one fixed local port: both servers see the
   router's WAN address; behind the ``eim`` router both see the same port, behind the
   ``symmetric`` router two different ones;
2. the public node cannot open a connection to a home node's LAN address, nor to its router's
   WAN address on that port (nothing is forwarded in);
3. the two nodes of one home reach each other on their LAN; a node of the other home does not
   reach that LAN address;
4. the kernel counts the bytes on each node's ``eth0`` (upload grows after a send).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from distronet.node.bench.netns import LinkShape
from distronet.node.bench.netns_nat import Home, NatKind, NatNet, missing_nat_requirements

pytestmark = [pytest.mark.nat, pytest.mark.netns, pytest.mark.chaos, pytest.mark.timeout(120)]

WHY_NOT = missing_nat_requirements()

SERVER = """
import socket, sys
s1, s2 = socket.socket(), socket.socket()
for s, port in ((s1, 9001), (s2, 9002)):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16)
print("ready", flush=True)
import selectors
sel = selectors.DefaultSelector()
for s in (s1, s2): sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        c, addr = key.fileobj.accept()
        c.sendall(f"{addr[0]}:{addr[1]}\\n".encode()); c.close()
"""

CLIENT = """
import socket, sys
host, ports, local = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
out = []
for p in ports:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.settimeout(3.0)
    if local: s.bind(("0.0.0.0", local))
    try:
        s.connect((host, int(p))); out.append(s.makefile().readline().strip())
    except OSError as e:
        out.append("fail:" + type(e).__name__)
    s.close()
print(" ".join(out))
"""


def _client(net: NatNet, i: int, host: str, ports: str, local: int = 0) -> list[str]:
    cmd = [*net.exec_prefix(i), sys.executable, "-c", CLIENT, host, ports, str(local)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.split()


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.skipif(WHY_NOT is not None and not os.environ.get("CI"), reason=WHY_NOT or "")
def test_homes_nat_like_their_routers() -> None:
    assert WHY_NOT is None, f"CI must run the NAT tests: {WHY_NOT}"
    homes = [Home(NatKind.EIM, 2), Home(NatKind.SYMMETRIC, 2)]
    with NatNet(
        1,
        homes,
        LinkShape("50mbit", "50mbit", 0.0),
        prefix="dnt",
        public_net="192.0.0.64/27",
        lan_base="10.79",
    ) as net:
        server = subprocess.Popen(
            [*net.exec_prefix(0), sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            pub = net.node_ip(0)
            eim, sym = net.indices(home=0), net.indices(home=1)
            up_before = net.counters(eim[0])[0]
            # 1: mapping
            a = _client(net, eim[0], pub, "9001,9002", local=40001)
            b = _client(net, sym[0], pub, "9001,9002", local=40001)
            assert all(x.startswith(net.router_wan_ip(0) + ":") for x in a), a
            assert all(x.startswith(net.router_wan_ip(1) + ":") for x in b), b
            assert a[0] == a[1], f"eim router changed the port per destination: {a}"
            assert b[0] != b[1], f"symmetric router kept one port for two destinations: {b}"
            assert net.counters(eim[0])[0] > up_before
            # 2: nothing gets in; a home node listening on 9001 is not reachable from outside
            listener = subprocess.Popen(
                [*net.exec_prefix(eim[1]), sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True
            )
            try:
                assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
                inward = _client(net, 0, net.node_ip(eim[1]), "9001") + _client(
                    net, 0, net.router_wan_ip(0), "9001"
                )
                assert all(x.startswith("fail:") for x in inward), inward
                # 3: the LAN works inside the home, not from the other home
                same = _client(net, eim[0], net.node_ip(eim[1]), "9001")
                assert same[0].startswith(net.node_ip(eim[0]) + ":"), same
                other = _client(net, sym[0], net.node_ip(eim[1]), "9001")
                assert other[0].startswith("fail:"), other
            finally:
                _stop(listener)
        finally:
            _stop(server)
