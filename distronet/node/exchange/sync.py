"""``SwarmExchange``: the synchronous ``Exchange`` over the async swarm exchange.

The trainer runs in a worker thread while the swarm's event loop runs elsewhere; each call is
handed to that loop and waited for with a timeout (a round that does not finish in time is a
``RoundUnavailable``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

from distronet.node.exchange.base import Exchange, ExchangeError, ExchangeStats, Round, RoundUnavailable
from distronet.node.exchange.swarm import AsyncSwarmExchange

__all__ = ["SwarmExchange"]

T = TypeVar("T")


class SwarmExchange(Exchange):
    """The synchronous ``Exchange`` over an ``AsyncSwarmExchange`` whose loop runs in another thread.

    Call it from a worker thread (the trainer's), never from the loop's own thread (that would
    deadlock: ``ExchangeError``).
    """

    def __init__(self, core: AsyncSwarmExchange, loop: asyncio.AbstractEventLoop) -> None:
        self.core, self.loop = core, loop
        cfg = core.config
        self._collect_timeout = (
            cfg.round_deadline_s + cfg.manifest_wait_s + 64 * cfg.manifest_grace_s + cfg.pull_timeout_s * 2
        )

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            coro.close()
            raise ExchangeError("SwarmExchange called from its own event loop; call it from a worker thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise RoundUnavailable(f"exchange call did not finish within {timeout:.1f} s") from None

    @property
    def peer_id(self) -> bytes:
        return self.core.peer_id

    @property
    def stats(self) -> ExchangeStats:
        return self.core.stats

    def publish(self, step: int, frame: bytes) -> None:
        self._run(self.core.publish(step, frame), 30.0)

    def collect(self, step: int) -> Round:
        return self._run(self.core.collect(step), self._collect_timeout)

    def close(self) -> None:
        self._run(self.core.close(), 30.0)
