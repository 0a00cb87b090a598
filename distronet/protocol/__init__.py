"""distronet.protocol: everything that crosses the wire between nodes, and nothing else.

Modules (the spec is docs/protocol.md):

- ``errors``     the project's error tree, ``Rejected`` and the enumerated ``RejectCode``
- ``identity``   Ed25519 identity in libp2p's key-file format; peer ids; sign / verify
- ``limits``     ``Limits`` and ``DEFAULT_LIMITS``: every bound a decoder checks
- ``layout``     ``layout_digest``: the 32 bytes that pin a run's tensors
- ``framing``    the 16-byte frame header, bounded zstd, strict msgpack
- ``packet``     the signed step packet: ``seal_packet`` / ``open_packet``
- ``announce``   the signed <= 1 KiB gossip announcement
- ``manifest``   the signed round manifest (gossip, and manifest-ask answers)
- ``pull``       ``/distronet/pull/1`` (and ``/distronet/state/1``): content by sha256
- ``manifest_ask`` ``/distronet/manifest/1``: sealed / decided manifests, the newest step
- ``digest``     ``/distronet/digest/1``: a peer's parameter digest after one step
- ``state``      ``/distronet/state-manifest/2``: a signed state manifest, its ask (a step) and answer
- ``membership`` the signed membership record a node keeps in the run's DHT
- ``coordinator_api``  the coordinator's HTTP schemas

Imports only the standard library, msgpack, zstandard, numpy, cryptography and PyNaCl
(libsodium: every signature check, ``identity.verify``).
"""
