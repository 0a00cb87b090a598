"""The guard's replicated history (``optim/verify.py``) as a JSON document: what the state blob
(``state.py``, header key ``"guard"``) and the local checkpoint carry, so that a replica that adopts
the swarm's state, or restarts from its checkpoint, judges the next rounds as the donors do.

Document (every list in a fixed order, so equal histories give equal bytes on every donor)::

    {"flags":       [[peer, rounds flagged], ...],                    peers ascending
     "cos":         [[peer, [cosine, ...]], ...],                     peers ascending, oldest first
     "neutralised": [[peer, step], ...],                              peers ascending
     "copiers":     [[peer, step], ...],                              peers ascending
     "copy_window": [[group, ...], ...],                              oldest round first
     "held":        [[step, [credited], [combined], [group, ...]], ...]}   steps ascending

``peer`` is a 38-byte peer id in lowercase hex; a ``group`` (one copy group of a round) its peers
ascending, a round's groups ascending. ``Guard.final_credit`` is left out: it is this replica's
log of settled credit, read as it comes and never read back by the guard, so nothing the swarm
decides depends on it. An adopter's log starts with the rounds it settles itself, the rounds
still held at adoption included (their credit is in ``"held"``); rounds settled before are the
donors' to report (the daemon's receipts come from each round's ``StepReport.credited``, not from
this log). ``Guard._patterns`` is a cache.

Reading (:func:`load_guard_state`) checks the form and bounds of everything, not whether the
history could have happened (a quorum of donors vouches for that, as for the parameters):
exactly these keys; each peer a 38-byte Ed25519 peer id, ascending without repeats, at most
``MAX_GUARD_PEERS`` per table or list; flag counts 1 … 2^53; steps 0 … the state's step; cosines
finite floats within ±``MAX_COSINE``, 1 … ``cos_window`` per peer; copy groups of two peers or
more; at most ``credit_delay`` rounds in ``copy_window`` and in ``held``. A document that breaks a
rule raises ``StateRefused`` and leaves the guard as it was.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeVar

from distronet.node.catchup.errors import StateRefused
from distronet.node.optim.verify import Guard, Held
from distronet.protocol.identity import PEER_ID_BYTES, is_ed25519_peer_id

__all__ = ["GUARD_KEYS", "MAX_COSINE", "MAX_GUARD_PEERS", "guard_state", "load_guard_state"]

GUARD_KEYS = ("flags", "cos", "neutralised", "copiers", "copy_window", "held")
MAX_GUARD_PEERS = 1 << 16
"""The most peers one table of the history, or one list in it, may name: far above any swarm
(admission holds at most 16,384 peers at a time); the blob's header limit bounds the whole."""
MAX_COSINE = 2.0
"""A stored cosine's bound: an honest one lies in [-1, 1] up to rounding."""
MAX_COUNT = 2**53

V = TypeVar("V")


def _hex(peers: Iterable[bytes]) -> list[str]:
    return [p.hex() for p in sorted(peers)]


def _groups_doc(groups: Iterable[frozenset[bytes]]) -> list[list[str]]:
    return sorted(_hex(g) for g in groups)


def guard_state(guard: Guard) -> dict[str, Any]:
    """``guard``'s replicated history as a JSON-safe document (module docstring). Equal histories
    give equal documents, and so equal ``json.dumps`` bytes."""
    return {
        "flags": [[p.hex(), n] for p, n in sorted(guard.flag_rounds.items())],
        "cos": [[p.hex(), list(h)] for p, h in sorted(guard.cos_history.items())],
        "neutralised": [[p.hex(), s] for p, s in sorted(guard.neutralised.items())],
        "copiers": [[p.hex(), s] for p, s in sorted(guard.copiers.items())],
        "copy_window": [_groups_doc(r) for r in guard.copy_window],
        "held": [[h.step, _hex(h.credited), _hex(h.combined), _groups_doc(h.copies)] for h in guard.held],
    }


def _refuse(what: str, why: str) -> NoReturn:
    raise StateRefused(f"guard history: {what}: {why}")


def _list(x: object, what: str, limit: int) -> list[Any]:
    if not isinstance(x, list):
        _refuse(what, f"not a list but {type(x).__name__}")
    if len(x) > limit:
        _refuse(what, f"{len(x)} entries, at most {limit}")
    return x


def _int(x: object, what: str, lo: int, hi: int) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= hi:
        _refuse(what, f"{str(x)[:40]!r} is not an integer in [{lo}, {hi}]")
    return x


def _peer(x: object, what: str) -> bytes:
    peer = b""
    if isinstance(x, str) and len(x) == 2 * PEER_ID_BYTES:
        with contextlib.suppress(ValueError):
            peer = bytes.fromhex(x)
    if not is_ed25519_peer_id(peer) or peer.hex() != x:
        _refuse(what, f"{str(x)[:80]!r} is not a {PEER_ID_BYTES}-byte Ed25519 peer id in lowercase hex")
    return peer


def _ascending(keys: Sequence[Any], what: str) -> None:
    if any(a >= b for a, b in itertools.pairwise(keys)):
        _refuse(what, "not in ascending order, or repeated")


def _peers(x: object, what: str) -> tuple[bytes, ...]:
    out = tuple(_peer(p, what) for p in _list(x, what, MAX_GUARD_PEERS))
    _ascending(out, what)
    return out


def _table(x: object, what: str, value: Callable[[object, str], V]) -> dict[bytes, V]:
    """A ``[[peer, value], ...]`` table, peers ascending, each value read by ``value``."""
    rows = _list(x, what, MAX_GUARD_PEERS)
    if not all(isinstance(r, list) and len(r) == 2 for r in rows):
        _refuse(what, "an entry is not a [peer, value] pair")
    peers = [_peer(r[0], what) for r in rows]
    _ascending(peers, what)
    return {p: value(r[1], f"{what} of {r[0][12:28]}…") for p, r in zip(peers, rows, strict=True)}


def _groups(x: object, what: str) -> tuple[frozenset[bytes], ...]:
    """One round's copy groups: each two peers or more, ascending; the groups ascending."""
    groups = [_peers(g, what) for g in _list(x, what, MAX_GUARD_PEERS)]
    if any(len(g) < 2 for g in groups):
        _refuse(what, "a copy group of fewer than two peers")
    _ascending(groups, what)
    return tuple(frozenset(g) for g in groups)


class _Reader:
    """The checks that depend on the run's settings and the state's step."""

    def __init__(self, guard: Guard, max_step: int) -> None:
        self.cos_window, self.delay, self.max_step = guard.cfg.cos_window, guard.cfg.credit_delay, max_step

    def step(self, x: object, what: str) -> int:
        return _int(x, what, 0, self.max_step)

    def cosines(self, x: object, what: str) -> list[float]:
        vals = _list(x, what, self.cos_window)
        ok = all(type(v) is float and math.isfinite(v) and abs(v) <= MAX_COSINE for v in vals)
        if not vals or not ok:
            _refuse(what, f"not 1 to {self.cos_window} finite cosines within ±{MAX_COSINE}")
        return vals

    def held(self, x: object) -> list[Held]:
        rows = _list(x, "held", self.delay)
        if not all(isinstance(r, list) and len(r) == 4 for r in rows):
            _refuse("held", "an entry is not [step, credited, combined, copy groups]")
        held = [
            Held(
                self.step(r[0], "held"),
                _peers(r[1], "held"),
                frozenset(_peers(r[2], "held")),
                _groups(r[3], "held"),
            )
            for r in rows
        ]
        _ascending([h.step for h in held], "held steps")
        return held


def load_guard_state(guard: Guard, doc: object, *, max_step: int) -> None:
    """Replace ``guard``'s replicated history by ``doc``'s (``guard_state``'s form), every part
    checked first (module docstring); ``max_step`` is the state's step (the next step to run).
    ``final_credit`` is left as it is. Raises ``StateRefused``; ``guard`` is untouched then."""
    if not isinstance(doc, dict) or set(doc) != set(GUARD_KEYS):
        keys = sorted(map(str, doc))[:8] if isinstance(doc, dict) else type(doc).__name__
        _refuse("keys", f"{keys}, expected {list(GUARD_KEYS)}")
    r = _Reader(guard, max_step)
    flags = _table(doc["flags"], "flags", lambda x, what: _int(x, what, 1, MAX_COUNT))
    cos = _table(doc["cos"], "cos", r.cosines)
    neutralised = _table(doc["neutralised"], "neutralised", r.step)
    copiers = _table(doc["copiers"], "copiers", r.step)
    window = [_groups(g, "copy_window") for g in _list(doc["copy_window"], "copy_window", r.delay)]
    held = r.held(doc["held"])
    guard.flag_rounds = collections.Counter(flags)
    guard.cos_history = {p: collections.deque(h, maxlen=r.cos_window) for p, h in cos.items()}
    guard.neutralised, guard.copiers = neutralised, copiers
    guard.copy_window = collections.deque(window, maxlen=r.delay)
    guard.held = collections.deque(held)
