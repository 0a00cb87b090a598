"""A node's shards, one ahead: a shard boundary never waits for the coordinator.

When a node has read its shard through, it reports it complete and needs the next. Done inline,
that is two coordinator calls and a download between two training steps; with the coordinator
stalled (not refusing connections, just not answering) each call waits out its deadline, and
training stood still for tens of seconds. :class:`ShardSupply` instead

- reports the finished shard in the background (the client queues the report while the
  coordinator is down and replays it later, exactly once);
- leases and downloads the *next* shard in the background as soon as the node switches to a new
  one, after the previous completion has been answered or queued (so a node allowed a single
  lease at a time is not refused for still holding the finished one);
- at the boundary takes that shard if it has arrived; if it is still on its way, the node reads
  its current shard again rather than wait (the ``DataFeed`` rule for "no new shard now"); only
  when nothing is on its way (no lease ahead was granted, e.g. the node may hold one lease only)
  does it lease inline, as before.

The lease ahead is renewed by the node's heartbeats like any lease it holds, and released with
the others when the node leaves. Each shard is still completed exactly once: ``completed`` holds
every unit reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from distronet.node.daemon.coordinator_client import (
    CoordinatorClient,
    CoordinatorClientError,
    CoordinatorRefused,
    Lease,
)
from distronet.node.data.errors import ShardIntegrityError
from distronet.node.data.shards import fetch_shard, shard_tokens

__all__ = ["DOWNLOAD_S", "ShardSupply"]

log = logging.getLogger(__name__)
DOWNLOAD_S = 600.0  # one shard download's deadline
Shard = tuple[Lease, Any]  # (lease, the shard's tokens: numpy, 1-D)


class ShardSupply:
    """Completes finished shards and fetches the next one ahead (module docstring).

    ``on_completed(lease)`` runs once the coordinator credited a shard, or queued its report.
    Use from one event loop; call :meth:`close` when the node stops.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        base_url: str,
        folder: Path,
        dtype: str,
        *,
        vocab_size: int | None = None,
        on_completed: Callable[[Lease], None] | None = None,
    ) -> None:
        self.client, self.base_url, self.folder, self.dtype = client, base_url, folder, dtype
        self.vocab_size = vocab_size  # every token id of a shard must be below it (None: unchecked)
        self.on_completed = on_completed
        self.completed: set[int] = set()  # units reported complete (each reported once)
        self._completing: asyncio.Task[None] | None = None
        self._ahead: asyncio.Task[Shard | None] | None = None

    async def next(self, old: Lease | None) -> Shard | None:
        """The shard to read after ``old`` (None: the first). Reports ``old`` complete in the
        background. None: no new shard now — read ``old`` again (a lease ahead may still be on
        its way; the next boundary takes it). Raises nothing the coordinator can cause; a failed
        download is logged and counts as no shard."""
        if old is not None and old.unit not in self.completed:
            self.completed.add(old.unit)
            self._completing = asyncio.create_task(self._complete(old), name=f"complete {old.shard_id}")
        ahead, self._ahead = self._ahead, None
        got: Shard | None = None
        if ahead is not None:
            if not ahead.done() and old is not None:
                self._ahead = ahead  # still on its way: keep reading the old shard meanwhile
                return None
            got = await ahead
        if got is None:
            got = await self._lease_and_fetch(strict=old is None)
        if got is not None:
            self._ahead = asyncio.create_task(self._lease_and_fetch(), name="shard ahead")
        return got

    async def _complete(self, lease: Lease) -> None:
        # no deadline of our own: the client bounds each call and queues the report when the
        # coordinator does not answer; cancelling it would lose the report
        try:
            await self.client.complete(lease)
        except CoordinatorRefused as e:  # e.g. our lease expired and went to another node
            log.warning("shard %s was not credited to this node: %s", lease.shard_id, e)
            return
        if self.on_completed is not None:
            self.on_completed(lease)

    async def _lease_and_fetch(self, *, strict: bool = False) -> Shard | None:
        """Lease one shard and download it; None when the coordinator has none for us now or the
        download failed (the lease then lapses or is released when the node leaves). ``strict``
        (the node's first shard, which it cannot train without): a failed download raises
        (``ShardIntegrityError``, ``aiohttp.ClientError``, ``asyncio.TimeoutError``, ``OSError``)."""
        if self._completing is not None:
            await asyncio.wait([self._completing])  # its report answered or queued first
        try:
            leases = await self.client.lease(1)
        except CoordinatorClientError as e:
            log.warning("cannot lease a new shard now: %s", e)
            return None
        if not leases:
            return None
        lease = leases[0]
        try:
            path = await asyncio.wait_for(fetch_shard(self.base_url, lease, self.folder), DOWNLOAD_S)
            vocab = (
                () if self.vocab_size is None else (self.vocab_size,)
            )  # checked against the run's vocabulary
            tokens = await asyncio.to_thread(shard_tokens, path, self.dtype, *vocab)
        except (ShardIntegrityError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            if strict:
                raise
            log.warning("shard %s could not be fetched: %r", lease.shard_id, e)
            return None
        return lease, tokens

    async def close(self) -> None:
        """Stop fetching ahead; a completion report in flight is left to finish (or be queued)
        within ``timeout``-free client calls, so it is awaited, not cancelled."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ahead
        if self._completing is not None:
            await asyncio.wait([self._completing])
