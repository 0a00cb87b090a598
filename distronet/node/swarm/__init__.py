"""The node's libp2p transport over the p2pd that the hivemind 1.1.12 wheel bundles.

Parts (each usable alone; :class:`~distronet.node.swarm.stack.Swarm` starts them together):

- ``p2p``        :class:`SwarmHost` — one p2pd per node (DHT, streams, gossipsub), our Ed25519 key.
- ``pubsub``     :class:`Gossip` — gossipsub over p2pd's control socket (small announcements only).
- ``membership`` :class:`Membership` — expiring, signed DHT records under the run's key.
- ``pull``       :class:`Puller`, :class:`ContentStore` — payloads by sha256 over direct streams.
- ``stack``      :class:`Swarm` — the above as one object; ``announce_topic(run_id)``.
- ``exchange``   :class:`AsyncSwarmExchange` — the optimizer's ``Exchange`` over the swarm
                 (announce → pull → leader-ranked signed round manifest).
- ``exchange_sync`` :class:`SwarmExchange` — the same, synchronous, for a trainer thread.
- ``manifest``   the signed round manifest and ``leader_rank``.
- ``statesync``  :class:`StateDonor`, :func:`fetch_state` — newcomer state from several donors in
                 verified, resumable chunks.
- ``control``    p2pd control framing and a leak-free ``open_stream``.
- ``selfcheck``  ``python -m distronet.node.swarm.selfcheck``: loopback figures.

p2pd / hivemind quirks learned building this (hivemind 1.1.12, its bundled p2pd):

- ``import hivemind`` imports torch, ``hivemind.moe``, ``hivemind.averaging`` and
  ``hivemind.optim`` (scipy, ...), which trips torch's ``torch.jit.script`` DeprecationWarning
  (an error under our pytest settings) and takes seconds. We use only ``hivemind.p2p``,
  ``hivemind.dht`` and ``hivemind.utils``: this package registers the ``hivemind`` package
  without running its ``__init__`` (about 1 CPU-s less at every node start), and runs it, with
  that one warning silenced, the first time anything asks the package for a top-level name.
  ``hivemind.utils``' and ``hivemind.dht``'s own ``__init__`` import torch (``MPFuture``,
  ``DHT``): they are registered the same way, and the names hivemind's p2p and DHT modules take
  from ``hivemind.utils`` come from their torch-free submodules (``_UTILS_NAMES``). So the
  node's swarm starts with no torch loaded (``join`` loads it in a background thread meanwhile).
- ``P2P.create`` builds p2pd's flags in the static ``_make_process_args``; a subclass that adds
  ``-pubsub`` there works (one daemon serves hivemind's DHT, our streams and gossipsub). The
  subclass is made per start so flags (``-metricsAddr``, gossipsub heartbeat) are not global.
- ``P2P.create`` has no overall deadline (only the "Peer ID:" line is awaited with
  ``startup_timeout``) and, if cancelled midway, leaves the child running: we wrap it in a
  deadline and terminate any half-built instance.
- ``P2P.create(identity_path=missing)`` silently writes an *RSA* key there; we refuse a missing
  file instead. p2pd reads our Ed25519 libp2p-protobuf key file fine (peer id ``12D3KooW…``).
- ``check_if_identity_free`` (default on) starts a second, throwaway p2pd to probe the swarm
  whenever an identity file and bootstrap peers are given: slow; we turn it off.
- ``-idleTimeout`` counts from the last persistent control connection: when the Python process
  dies (even by SIGKILL) p2pd exits within about a second, so a crashed node leaves no daemon.
- ``ControlClient.stream_open`` leaves its control socket open when p2pd refuses the stream
  (no handler, peer unreachable); the ``StreamWriter.__del__`` that follows is an unraisable
  error under pytest. ``control.open_stream`` closes it on every failure path.
- p2pd started with ``-bootstrapPeers`` of which none answers exits at once ("failed to connect
  to bootstrap peers"): a node cannot start alone with a stale bootstrap list (``DaemonError``;
  the daemon retries or asks the coordinator for fresh peers).
- ``P2P.shutdown`` waits on the child with no deadline: we SIGKILL after ``close_timeout_s``.
- The control client has no pubsub calls; PSRequest SUBSCRIBE answers one ``Response`` and then
  streams varint-delimited ``PSMessage``s on the same connection until it is closed (closing
  unsubscribes). Our own publishes are delivered to our own subscriptions. ``from`` is a Python
  keyword: read it with ``getattr(msg, "from")``. ``-pubsubSign``/``Strict`` default on, so the
  sender is authenticated by libp2p.
- gossipsub needs its heartbeat to graft a mesh (1 s default); ``PSRequest LIST_PEERS`` on a
  topic is the readiness condition before publishing (flood-publish then reaches every known
  subscriber). Messages over 1 MiB are dropped silently: gossip carries ≤ 1 KiB announcements.
- hivemind's DHT validator sees the *hashed* key, the msgpack-*serialised* sub-key and value,
  and every record in the DHT, so our signed-record validator keys on the sub-key (peer id).
  A stored record cannot be shortened or deleted (the latest expiry wins): graceful leave writes
  a tombstone with a later expiry. DHT expiry is wall-clock (``get_dht_time``).
- ``DHTNode.create(p2p=...)`` over the shared ``P2P`` runs in our own loop; ``ensure_bootstrap_
  success`` must be False for the first node (no initial peers).
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from typing import Any


def _full_init(spec: Any, pkg: Any) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*", category=DeprecationWarning)
        spec.loader.exec_module(pkg)


# The names that hivemind.p2p and hivemind.dht take from ``hivemind.utils`` and the torch-free
# submodule that defines each; any other name runs the package's own ``__init__`` (torch).
_UTILS_NAMES: dict[str, str] = {
    "get_logger": "logging",
    "MSGPackSerializer": "serializer",
    "SerializerBase": "serializer",
    "get_dht_time": "timed_storage",
    "DHTExpiration": "timed_storage",
    "ValueWithExpiration": "timed_storage",
    "TimedStorage": "timed_storage",
    "MAX_DHT_TIME_DISCREPANCY_SECONDS": "timed_storage",
    "as_aiter": "asyncio",
    "amap_in_executor": "asyncio",
    "switch_to_uvloop": "asyncio",
    "enter_asynchronously": "asyncio",
}


def _register_lazy(name: str, cheap: dict[str, str] | None = None) -> None:
    """Package ``name`` in ``sys.modules`` with its ``__init__`` deferred (see the quirks above):
    its submodules import as usual; a name in ``cheap`` comes from that submodule alone; any other
    top-level name runs the ``__init__`` first."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        _full_init(spec, None)  # pragma: no cover  (no hivemind: the import below fails clearly)
        return
    pkg = importlib.util.module_from_spec(spec)

    def __getattr__(attr: str) -> Any:  # PEP 562: runs only for a name the module lacks
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = sys.modules.get(f"{name}.{attr}")
        if sub is not None:  # a submodule still being imported (``import hivemind.a.b as c``)
            return sub
        if cheap is not None and attr in cheap:
            value = getattr(importlib.import_module(f"{name}.{cheap[attr]}"), attr)
            setattr(pkg, attr, value)
            return value
        del pkg.__dict__["__getattr__"]
        _full_init(spec, pkg)
        return getattr(pkg, attr)

    pkg.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = pkg


def _register_hivemind() -> None:
    """``hivemind``, ``hivemind.utils`` and ``hivemind.dht`` in ``sys.modules`` with their
    ``__init__`` deferred: what the node uses of them imports no torch."""
    _register_lazy("hivemind")
    _register_lazy("hivemind.utils", _UTILS_NAMES)
    _register_lazy("hivemind.dht")


_register_hivemind()
