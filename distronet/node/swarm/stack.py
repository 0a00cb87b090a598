"""The whole transport of one node: p2pd + gossip + membership + pull, started and closed as one."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from distronet.node.swarm.budget import Bandwidth
from distronet.node.swarm.errors import DaemonError
from distronet.node.swarm.hivemind_shim import PeerID
from distronet.node.swarm.membership import Membership, MembershipConfig
from distronet.node.swarm.p2p import SwarmConfig, SwarmHost
from distronet.node.swarm.pubsub import Gossip
from distronet.node.swarm.pull import ContentStore, Puller
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

__all__ = ["Swarm", "announce_topic", "run_peers"]


def announce_topic(run_id: str) -> str:
    """The run's gossip topic for payload announcements."""
    return f"distronet/{run_id}/announce"


@dataclass
class Swarm:
    """A node's running transport. Build with :meth:`start`; always :meth:`close` (idempotent)."""

    identity: Identity
    host: SwarmHost
    gossip: Gossip
    membership: Membership
    puller: Puller
    bandwidth: Bandwidth

    @classmethod
    async def start(
        cls,
        identity: Identity,
        config: SwarmConfig,
        membership: MembershipConfig,
        *,
        bandwidth: Bandwidth | None = None,
        store: ContentStore | None = None,
    ) -> Swarm:
        """Start p2pd with ``config.identity_path`` (which must hold ``identity``), join the DHT via
        ``config.bootstrap``, announce membership and serve pulls. On any failure, what was
        started is closed again before the error propagates.

        Raises: ConfigError (identity), DaemonError (p2pd), MembershipError (DHT join/store).
        """
        if config.identity_path is None:
            raise ConfigError("the swarm needs identity_path: the key file p2pd and our signatures share")
        bw = bandwidth or Bandwidth.unlimited()
        host = await SwarmHost.start(config)
        try:
            members = await Membership.create(host, identity, membership, bootstrap=config.bootstrap)
            try:
                puller = await Puller.create(host, store, bw, reuse_streams=True)
            except BaseException:
                await members.close(leave=False)
                raise
        except BaseException:
            await host.close()
            raise
        return cls(identity, host, Gossip(host), members, puller, bw)

    @property
    def run_id(self) -> str:
        return self.membership.config.run_id

    @property
    def topic(self) -> str:
        return announce_topic(self.run_id)

    async def close(self, *, leave: bool = True) -> None:
        """Unsubscribe, leave the DHT (tombstone if ``leave``), stop p2pd. Never raises."""
        with contextlib.suppress(Exception):
            await self.gossip.close()
        with contextlib.suppress(Exception):
            await self.puller.close()
        with contextlib.suppress(Exception):
            await self.membership.close(leave=leave)
        await self.host.close()


async def run_peers(swarm: Swarm) -> list[PeerID]:
    """The run's other nodes to ask (drift checks, replay and state donors): the peers in our
    announcement topic, less the run's relays (they hold no state). gossipsub ignores relayed
    connections, so while a relay is in the topic (it forwards the run's gossip) the peers we
    reach only through a relay count too; when p2pd does not say which those are, the topic's
    peers alone."""
    topic = {p.to_base58(): p for p in await swarm.gossip.topic_peers(swarm.topic)}
    relays = swarm.host.relay_ids
    if relays & topic.keys():
        with contextlib.suppress(DaemonError):
            for b58 in await swarm.host.relayed_peers():
                topic.setdefault(b58, PeerID.from_base58(b58))
    return [p for b58, p in topic.items() if b58 not in relays]
