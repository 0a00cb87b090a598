"""What catch-up shares with the daemon: the replica it moves or replaces, and the counters it keeps.

The daemon's training loop advances a :class:`Replica` one step at a time; catch-up
(``resync.py``) moves it forward by replaying rounds or replaces its state with one adopted from
peers. Both hold ``Replica.lock`` while they change the model, and a state snapshot for a peer
waits for it, so no peer is served a half-updated model. The counters catch-up writes are
:class:`CatchUpStatus`'s (the daemon's ``NodeStatus`` has them all).

Imports no torch at run time: the daemon builds a ``Replica`` once torch has loaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # types only: these import torch, which the daemon loads in the background
    import torch
    from torch import nn

    from distronet.node.optim.distro import DistroOptimizer

__all__ = ["CatchUpStatus", "Replica", "Trains"]


class Trains(Protocol):
    """What catch-up touches of the trainer (``daemon.trainer.Trainer``): its model, and the
    optimizer it steps (replaced when a state is adopted)."""

    @property
    def model(self) -> nn.Module: ...

    optimizer: torch.optim.Optimizer


class CatchUpStatus(Protocol):
    """The status counters catch-up keeps (fields of the daemon's ``NodeStatus``)."""

    resyncs: int  # times this replica adopted the swarm's state or replayed up to it
    resync_steps: list[int]  # steps resumed from a downloaded state, with momentum at zero
    state_donors: list[str]  # for each of those states, the donor whose signed manifest was chosen
    replayed_rounds: int
    fell_behind: int  # failed rounds that found this replica behind the swarm
    warmup_until: int  # our packets for steps below this are masked warm-up packets
    drift_equal: int  # drift checks that found our parameters equal to the peers'
    drift_differs: int  # drift checks that made us adopt the peers' state


@dataclass
class Replica:
    """This node's copy of the model and its optimizer, at ``step`` (the next step to run).

    ``fresh_optimizer()`` makes an optimizer with no state over the same model and exchange:
    what an adopted state is loaded into (its momentum restarts at zero). ``verify_until``:
    after catching up, the drift check runs at every step up to this one (``drift.py``).
    """

    trainer: Trains
    optimizer: DistroOptimizer
    fresh_optimizer: Callable[[], DistroOptimizer]
    step: int = 0
    verify_until: int = -1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held while the model changes
    _wanted: dict[int, list[asyncio.Future[tuple[int, bytes] | None]]] = field(default_factory=dict)

    @property
    def model(self) -> nn.Module:
        return self.trainer.model

    def use(self, optimizer: DistroOptimizer, step: int) -> None:
        """Train on from ``step`` with ``optimizer`` (one a state was loaded into). Call with
        ``lock`` held."""
        optimizer.resume_at(step)
        self.optimizer = optimizer
        self.trainer.optimizer = optimizer
        self.step = step

    async def state_at(self, step: int) -> tuple[int, bytes] | None:
        """``(step, state blob)`` taken at the boundary where ``step`` is the next step to run:
        now if the replica rests there, else when :meth:`boundary` reaches it; None when the
        replica is past it (or moves past without stopping there). What lets donors a step
        apart offer one state (``statesync.StateDonor``). Cancel to stop waiting."""
        if self.step > step:
            return None
        if self.step == step:
            async with self.lock:  # held by the step `step` itself: we are past it once it is ours
                return (step, await self._blob(step)) if self.step == step else None
        fut: asyncio.Future[tuple[int, bytes] | None] = asyncio.get_running_loop().create_future()
        waiting = self._wanted.setdefault(step, [])
        waiting.append(fut)
        try:
            return await fut
        finally:
            if fut in waiting:
                waiting.remove(fut)
            if not waiting and self._wanted.get(step) is waiting:
                del self._wanted[step]

    async def boundary(self) -> None:
        """Call with ``lock`` held after moving ``step``: serve the :meth:`state_at` waiters of
        this step (one copy for all of them) and answer None to those of steps passed."""
        now = self.step
        for s in [s for s in self._wanted if s < now]:
            for fut in self._wanted.pop(s):
                if not fut.done():
                    fut.set_result(None)
        due = [f for f in self._wanted.pop(now, []) if not f.done()]
        if due:
            blob = await self._blob(now)
            for fut in due:
                if not fut.done():
                    fut.set_result((now, blob))

    async def _blob(self, step: int) -> bytes:
        from distronet.node.catchup.state import state_blob  # imports torch (loaded by now)

        return await asyncio.to_thread(state_blob, step, self.model, self.optimizer)

    async def snapshot(self) -> tuple[int, bytes]:
        """``(step, state blob)`` of the next step boundary (now, if no step is running): what the
        state donor serves on request. Copies params + replicated optimizer state (the guard's
        history too) once (~10 ms for the default model, in a worker thread); the next step waits
        for that copy."""
        async with self.lock:
            step = self.step
            return step, await self._blob(step)
