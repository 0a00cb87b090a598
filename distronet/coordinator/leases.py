"""The shard lease book of one run: BOINC's rules for work units, in memory, clock injected.

A *unit* is one pass over one shard: ``unit = epoch * n_shards + shard_index``. Each unit is
FREE, LEASED (to one holder, with a token and an expiry) or DONE (credited once, to the node
whose lease completed it). The invariants the property test checks:

- a unit is never lost: an expired or released lease puts it back in the queue, first in line;
- a unit is never credited twice: completion moves LEASED -> DONE exactly once; repeating it
  with the same token is acknowledged without credit; any other token gets LEASE_LOST.

Units never touched need no memory: ``next_fresh`` walks them in order. Costs: issue, renew
and complete are O(log n) (expiry heap); memory is O(units touched).
"""

from __future__ import annotations

import heapq
import secrets
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from distronet.protocol.coordinator_api import ApiError, ApiErrorCode

__all__ = ["DONE", "FREE", "LEASED", "LeaseBook", "Unit"]

FREE, LEASED, DONE = 0, 1, 2


@dataclass(slots=True)
class Unit:
    """The state of one unit (the store's ``units`` row, less the run id)."""

    unit: int
    state: int = FREE
    token: str | None = None
    holder: str | None = None
    leased_at: float | None = None
    expires_at: float | None = None
    completed_by: str | None = None
    completed_at: float | None = None
    issues: int = 0

    def row(self, run_id: str) -> tuple[object, ...]:
        return (
            run_id, self.unit, self.state, self.token, self.holder, self.leased_at,
            self.expires_at, self.completed_by, self.completed_at, self.issues,
        )  # fmt: skip


class LeaseBook:
    """Leases of one run's ``n_units`` units, ``ttl`` seconds each (renewable)."""

    def __init__(self, n_units: int, ttl: float) -> None:
        self.n_units = n_units
        self.ttl = ttl
        self.units: dict[int, Unit] = {}
        self.requeue: deque[int] = deque()
        self.next_fresh = 0
        self.heap: list[tuple[float, int, str]] = []
        self.held: dict[str, set[int]] = {}
        self.done = 0
        self.leased = 0

    # ---------------------------------------------------------------- restore

    def restore(self, units: Iterable[Unit]) -> None:
        """Load units from the store (before any other call)."""
        for u in units:
            self.units[u.unit] = u
            if u.state == DONE:
                self.done += 1
            elif u.state == LEASED:
                assert u.holder is not None and u.token is not None and u.expires_at is not None
                self.leased += 1
                self.held.setdefault(u.holder, set()).add(u.unit)
                self.heap.append((u.expires_at, u.unit, u.token))
            else:
                self.requeue.append(u.unit)
        heapq.heapify(self.heap)

    # ---------------------------------------------------------------- queries

    @property
    def remaining(self) -> int:
        """Units not yet done."""
        return self.n_units - self.done

    def held_by(self, holder: str) -> int:
        return len(self.held.get(holder, ()))

    def get(self, unit: int) -> Unit:
        """The unit; raises ApiError(NOT_FOUND) when out of range."""
        if not 0 <= unit < self.n_units:
            raise ApiError(ApiErrorCode.NOT_FOUND, f"no unit {unit} in this run")
        u = self.units.get(unit)
        return u if u is not None else Unit(unit)  # untouched: FREE, not stored until issued

    # ---------------------------------------------------------------- transitions

    def _next_free(self) -> int | None:
        while self.requeue:
            n = self.requeue.popleft()
            if self.units[n].state == FREE:
                return n
        while self.next_fresh < self.n_units:
            n = self.next_fresh
            self.next_fresh += 1
            u = self.units.get(n)
            if u is None or u.state == FREE:  # a duplicate queue entry is harmless: state is checked
                return n
        return None

    def issue(self, holder: str, now: float) -> Unit | None:
        """Lease the next free unit to ``holder``; None when no unit is free."""
        n = self._next_free()
        if n is None:
            return None
        u = self.units.get(n)
        if u is None:
            u = self.units[n] = Unit(n)
        u.state, u.token, u.holder = LEASED, secrets.token_urlsafe(16), holder
        u.leased_at, u.expires_at = now, now + self.ttl
        u.issues += 1
        self.leased += 1
        self.held.setdefault(holder, set()).add(n)
        heapq.heappush(self.heap, (u.expires_at, n, u.token))
        return u

    def _check(self, unit: int, token: str, holder: str) -> Unit:
        u = self.get(unit)
        if u.token != token or u.holder != holder:
            raise ApiError(
                ApiErrorCode.LEASE_LOST, f"unit {unit}: this lease expired and the shard went to another node"
            )
        return u

    def renew(self, unit: int, token: str, holder: str, now: float) -> Unit:
        """Extend a live lease to ``now + ttl``. Raises ApiError(LEASE_LOST) / (CONFLICT) if done."""
        u = self._check(unit, token, holder)
        if u.state == DONE:
            raise ApiError(ApiErrorCode.CONFLICT, f"unit {unit} is already completed")
        u.expires_at = now + self.ttl
        heapq.heappush(self.heap, (u.expires_at, unit, token))
        self._maybe_compact()
        return u

    def complete(self, unit: int, token: str, holder: str, now: float) -> tuple[Unit, bool]:
        """Mark the unit done; ``(unit, True)`` the first time, ``(unit, False)`` on a repeat.

        Raises ApiError(LEASE_LOST) when ``token`` is not the unit's current lease.
        """
        u = self._check(unit, token, holder)
        if u.state == DONE:
            return u, False
        u.state, u.completed_by, u.completed_at, u.expires_at = DONE, holder, now, None
        self.leased -= 1
        self.done += 1
        self._unhold(holder, unit)
        return u, True

    def give_back(self, unit: int, token: str, holder: str) -> Unit:
        """Return a live lease to the queue, first in line (its completion was not verified).

        Raises ApiError(LEASE_LOST) when ``token`` is not the unit's current lease and
        ApiError(CONFLICT) when the unit is already done.
        """
        u = self._check(unit, token, holder)
        if u.state == DONE:
            raise ApiError(ApiErrorCode.CONFLICT, f"unit {unit} is already completed")
        self._free(u)
        return u

    def _free(self, u: Unit) -> None:
        assert u.holder is not None
        self._unhold(u.holder, u.unit)
        u.state, u.token, u.holder, u.expires_at, u.leased_at = FREE, None, None, None, None
        self.leased -= 1
        self.requeue.appendleft(u.unit)

    def _unhold(self, holder: str, unit: int) -> None:
        s = self.held.get(holder)
        if s is not None:
            s.discard(unit)
            if not s:
                del self.held[holder]

    def release(self, holder: str) -> list[Unit]:
        """Give back every lease ``holder`` holds (it left or was evicted)."""
        out = [self.units[n] for n in sorted(self.held.get(holder, ()))]
        for u in out:
            self._free(u)
        return out

    def expire_due(self, now: float) -> list[Unit]:
        """Free every lease whose expiry has passed; returns the units freed."""
        out: list[Unit] = []
        heap = self.heap
        while heap and heap[0][0] <= now:
            exp, n, token = heapq.heappop(heap)
            u = self.units[n]
            if u.state == LEASED and u.token == token and u.expires_at == exp:
                self._free(u)
                out.append(u)
        return out

    def _maybe_compact(self) -> None:
        if len(self.heap) > 64 and len(self.heap) > 4 * self.leased:
            self.heap = [
                (u.expires_at, u.unit, u.token)
                for s in self.held.values()
                for n in s
                for u in (self.units[n],)
                if u.expires_at is not None and u.token is not None
            ]
            heapq.heapify(self.heap)
