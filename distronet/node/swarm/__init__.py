"""The node's libp2p transport over the p2pd that the hivemind 1.1.12 wheel bundles.

Parts (each usable alone; :class:`~distronet.node.swarm.stack.Swarm` starts them together):

- ``p2p``        :class:`SwarmHost` — one p2pd per node (DHT, streams, gossipsub), our Ed25519 key.
- ``pubsub``     :class:`Gossip` — gossipsub over p2pd's control socket (small announcements only).
- ``membership`` :class:`Membership` — expiring, signed DHT records under the run's key.
- ``pull``       :class:`Puller`, :class:`ContentStore` — payloads by sha256 over direct streams.
- ``stack``      :class:`Swarm` — the above as one object; ``announce_topic(run_id)``.
- ``budget``     token-bucket upload and download limiters.
- ``control``    p2pd control framing and a leak-free ``open_stream``.
- ``servicer``   :class:`StreamServicer` — the one seam every stream protocol is served through
  (framing, deadlines, error mapping), and ``ask`` for one-shot requests; the codecs are in
  ``distronet.protocol`` (pull, manifest_ask, digest, state).
- ``hivemind_shim`` imports hivemind's p2p and DHT without its torch-importing ``__init__``.
- ``selfcheck``  ``python -m distronet.node.swarm.selfcheck``: loopback figures.

The exchange over this transport is :mod:`distronet.node.exchange.swarm`; hivemind's and p2pd's
quirks, and what this package does about each, are in ``docs/hivemind.md``.
"""

from distronet.node.swarm import hivemind_shim as _hivemind_shim  # noqa: F401  (before any hivemind import)
