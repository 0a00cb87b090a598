"""The shard a node trains on, and the switch to the next one at a shard boundary.

:class:`Shards` puts the leased shard's tokens into the trainer's ``ShardFeed`` and, once it has
been read through, completes the lease and switches to the next shard, fetched one ahead
(``data/shard_supply.py``: a boundary never waits for a slow coordinator).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from distronet.node.daemon.coordinator_client import CoordinatorClient, Lease
from distronet.node.daemon.errors import NodeError
from distronet.node.daemon.parts import ShardFeed
from distronet.node.daemon.status import NodeStatus
from distronet.node.data.shard_supply import DOWNLOAD_S, ShardSupply
from distronet.node.exitcodes import ExitCode

__all__ = ["Shards"]


class Shards:
    """The node's leases, read through ``feed``; shard files are kept in ``folder``.

    ``status`` counts the shards completed (``shards_done``, ``completed_units``) and names the
    current one (``shard``). Nothing is leased before the first :meth:`next`.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        coordinator: str,
        folder: Path,
        dtype: str,
        feed: ShardFeed,
        status: NodeStatus,
        vocab_size: int | None = None,
    ) -> None:
        self.client, self.coordinator, self.folder, self.dtype = client, coordinator, folder, dtype
        self.vocab_size = vocab_size  # the run's vocabulary: a shard with a token id >= it is refused
        self.feed, self.status = feed, status
        self.supply: ShardSupply | None = None  # completes shards, fetches the next one ahead
        self._tokens: Any = None  # the current shard's tokens (numpy, 1-D)

    def done(self, step: int) -> bool:
        """True when ``step`` (the next to run) is past the current shard's share of steps."""
        return self.feed.done(step)

    async def next(self, step: int) -> None:
        """Complete the current lease (if any) and switch to the next shard from ``step`` on.

        Keeps training on the old shard when no new one is here yet (it is completed only once:
        the report is queued while the coordinator is down and replayed later). Raises
        ``NodeError`` when there is no shard at all, and a failed first download.
        """
        if self.supply is None:
            self.supply = ShardSupply(
                self.client,
                self.coordinator,
                self.folder,
                self.dtype,
                vocab_size=self.vocab_size,
                on_completed=self._credited,
            )
        old = self.feed.lease
        try:
            got = await self.supply.next(old)
        except asyncio.TimeoutError:
            raise NodeError(f"shard download: no answer within {DOWNLOAD_S:.0f} s") from None
        if got is None:
            if old is None:
                raise NodeError("the coordinator has no shard to lease to this node", ExitCode.REJECTED)
            self.feed.switch(old, self._tokens, step)  # read the old shard again
            return
        lease, self._tokens = got
        self.feed.switch(lease, self._tokens, step)
        self.status.shard = lease.shard_id

    def _credited(self, lease: Lease) -> None:
        self.status.shards_done += 1
        self.status.completed_units.append(lease.unit)

    async def close(self) -> None:
        """Stop fetching ahead; a completion report still gets sent or queued."""
        if self.supply is not None:
            await self.supply.close()
