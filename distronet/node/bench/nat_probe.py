"""Ask a running node's p2pd how it is connected to each peer (for NAT tests and benches).

p2pd's control socket is a Unix socket, so a process in any network namespace can reach it. The
node's p2pd is the ``p2pd`` child of its process; its ``-listen=/unix/<path>`` names the socket.
``LIST_PEERS`` answers one entry per open connection with that connection's remote multiaddr:
one that contains ``/p2p-circuit`` is relayed, any other is direct (a hole-punched connection
is direct too; p2pd does not say how a direct connection came about).
"""

from __future__ import annotations

import os
import socket

from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.reach import is_relayed
from distronet.protocol.errors import DistroError

__all__ = ["ProbeError", "connections", "control_socket", "link_kinds"]

MAX_ANSWER_BYTES = 4 << 20  # a LIST_PEERS answer of 10k connections is well under this


class ProbeError(DistroError):
    """The node's p2pd could not be found or did not answer."""


def control_socket(node_pid: int) -> str:
    """The control socket path of the p2pd that ``node_pid`` started. Raises ProbeError."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid != node_pid or not argv or not argv[0].endswith(b"p2pd"):
            continue
        for arg in argv:
            if arg.startswith(b"-listen=/unix"):
                return arg.split(b"=", 1)[1][len(b"/unix") :].decode()
    raise ProbeError(f"no p2pd child with a control socket under process {node_pid}")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(sock: socket.socket) -> int:
    shift = value = 0
    for _ in range(10):
        b = sock.recv(1)
        if not b:
            raise ProbeError("p2pd closed the control connection")
        value |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return value
        shift += 7
    raise ProbeError("bad length prefix from p2pd")


def connections(path: str, timeout_s: float = 5.0) -> dict[str, list[str]]:
    """Peer id (base58) → remote multiaddrs of our open connections to it. Raises ProbeError."""
    from hivemind.proto import p2pd_pb2  # after the shim (imported above): no torch
    from hivemind.utils.multiaddr import Multiaddr

    req = p2pd_pb2.Request(type=p2pd_pb2.Request.LIST_PEERS).SerializeToString()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(_varint(len(req)) + req)
            size = _read_varint(sock)
            if size > MAX_ANSWER_BYTES:
                raise ProbeError(f"p2pd answer of {size} bytes is over {MAX_ANSWER_BYTES}")
            buf = bytearray()
            while len(buf) < size:
                chunk = sock.recv(size - len(buf))
                if not chunk:
                    raise ProbeError("p2pd closed the control connection mid-answer")
                buf += chunk
    except OSError as e:
        raise ProbeError(f"p2pd at {path}: {e}") from e
    resp = p2pd_pb2.Response()
    resp.ParseFromString(bytes(buf))
    if resp.type != p2pd_pb2.Response.OK:
        raise ProbeError(f"p2pd at {path} refused LIST_PEERS: {resp.error.msg}")
    out: dict[str, list[str]] = {}
    for info in resp.peers:
        pid = PeerID(info.id).to_base58()
        out.setdefault(pid, []).extend(str(Multiaddr(a)) for a in info.addrs)
    return out


def link_kinds(conns: dict[str, list[str]]) -> dict[str, str]:
    """Peer id → ``direct`` (at least one connection not through a relay) or ``relayed``."""
    return {
        pid: "direct" if not all(is_relayed(a) for a in addrs) else "relayed" for pid, addrs in conns.items()
    }
