"""The guard's replicated history travels with the state: an adopter judges the next rounds as the
swarm does; a lying history is refused; equal histories give equal bytes (catchup/guard_state.py,
catchup/state.py, daemon checkpoints)."""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from distronet.node.catchup.guard_state import MAX_GUARD_PEERS, guard_state, load_guard_state
from distronet.node.catchup.state import MAGIC, StateRefused, load_state_blob, state_blob
from distronet.node.daemon.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from distronet.node.exchange.memory import MemoryHub
from distronet.node.optim.config import UpdateRule, preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.node.optim.verify import Guard, Held
from distronet.protocol.identity import Identity

HOSTILE, NEWCOMER = 3, 4
ADOPT_AT = 6  # H is flagged every round and neutralised at round 4; rounds 0-5 are still held


def _ident(i: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"guard-state-test %d" % i).digest())


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(48, 32), nn.Tanh(), nn.Linear(32, 4))


class _Swarm:
    """Peers 0-2 honest, peer 3 hostile (its gradients ×1e3: flagged "norm" every round, clipped
    yet summed, neutralised after ``neutralise_after`` rounds), peer 4 a newcomer that starts
    from other weights. Every replica combines each round on its own (no shared cache)."""

    def __init__(self, overlap: bool) -> None:
        self.cfg = preset("ours_k32", lr=0.01, update=UpdateRule.SIGN, overlap=overlap)
        hub = MemoryHub()
        ids = [_ident(i) for i in range(5)]
        self.models = [_model() for _ in range(4)] + [_model(seed=7)]
        self.opts = [
            DistroOptimizer(m.named_parameters(), self.cfg, hub.join(i.peer_id), i, roles=tensor_roles(m))
            for m, i in zip(self.models, ids, strict=True)
        ]
        self.hostile = ids[HOSTILE].peer_id

    def run(self, step: int, live: list[int]) -> None:
        base = torch.Generator().manual_seed(1000 + step)
        shared = [torch.randn(p.shape, generator=base) for p in self.models[0].parameters()]
        for i in live:
            noise = torch.Generator().manual_seed(10 * step + i)
            for p, s in zip(self.models[i].parameters(), shared, strict=True):
                p.grad = s + 0.3 * torch.randn(p.shape, generator=noise)
                if i == HOSTILE:
                    p.grad.mul_(1e3)
            self.opts[i].begin_step()
        for i in live:
            self.opts[i].finish_step()

    def blob(self, i: int) -> bytes:
        return state_blob(ADOPT_AT, self.models[i], self.opts[i])


def _swarm_at_adoption(overlap: bool) -> _Swarm:
    swarm = _Swarm(overlap)
    for t in range(ADOPT_AT):
        swarm.run(t, [0, 1, 2, HOSTILE])
    return swarm


@pytest.fixture(scope="module")
def donor() -> _Swarm:
    """A swarm at ``ADOPT_AT`` (no overlap), read only by the tests that take it."""
    return _swarm_at_adoption(False)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_adopter_leaves_a_neutralised_peer_out_as_the_swarm_does(overlap: bool) -> None:
    """Before the history travelled, the adopter's clean guard clipped H's packet and summed it,
    while the swarm left H out: its parameters left the swarm's at the first round."""
    swarm = _swarm_at_adoption(overlap)
    donor, adopter = swarm.opts[0], swarm.opts[NEWCOMER]
    assert swarm.hostile in donor.guard.neutralised and donor.guard.flag_rounds[swarm.hostile] >= 5
    assert donor.guard.held and donor.guard.cos_history
    load_state_blob(swarm.blob(0), swarm.models[NEWCOMER], adopter)
    adopter.resume_at(ADOPT_AT)
    assert guard_state(adopter.guard) == guard_state(donor.guard)
    for t in range(ADOPT_AT, ADOPT_AT + 3):
        swarm.run(t, [0, 1, 2, HOSTILE, NEWCOMER])
        mine, theirs = adopter.reports[-1], donor.reports[-1]
        assert swarm.hostile in mine.accepted and swarm.hostile not in mine.combined, t
        assert (mine.combined, mine.flagged, mine.neutralised) == (
            theirs.combined,
            theirs.flagged,
            theirs.neutralised,
        )
        for a, b in zip(swarm.models[0].parameters(), swarm.models[NEWCOMER].parameters(), strict=True):
            assert torch.equal(a, b), t
    assert guard_state(adopter.guard) == guard_state(donor.guard)
    donor.guard.flush()
    adopter.guard.flush()
    settled = list(adopter.guard.final_credit)  # the rounds held at adoption, and those after
    assert settled[0][0] == 0 and settled == list(donor.guard.final_credit)


def test_equal_histories_give_byte_equal_blobs(donor: _Swarm) -> None:
    blobs = {donor.blob(i) for i in range(4)}  # the hostile replica judged the same rounds too
    assert len(blobs) == 1
    assert b'"guard":' in blobs.pop()
    other = _model(seed=7)
    fresh = DistroOptimizer(
        other.named_parameters(), donor.cfg, MemoryHub().join(b"x"), _ident(9), roles=tensor_roles(other)
    )
    load_state_blob(donor.blob(0), other, fresh)
    assert state_blob(ADOPT_AT, other, fresh) == donor.blob(0)  # the adopter serves the same root
    fresh.guard.flag_rounds[donor.hostile] += 1
    assert state_blob(ADOPT_AT, other, fresh) != donor.blob(0)


def _copy_history(guard: Guard, peers: list[bytes]) -> None:
    """A history with copy groups and a copier (the swarm above has none)."""
    a, b, c, d = peers[:4]
    guard.copy_window.extend([(frozenset({a, b}), frozenset({c, d})), (), (frozenset({a, c}),)])
    guard.neutralised[a] = guard.copiers[a] = 2
    guard.held.append(Held(2, (b, d), frozenset({a, b, d}), (frozenset({a, c}),)))
    guard.cos_history[b] = collections.deque([0.5, -0.25], maxlen=guard.cfg.cos_window)
    guard.flag_rounds[c] = 3


def test_a_history_with_copies_round_trips_exactly(donor: _Swarm) -> None:
    peers = sorted(_ident(i).peer_id for i in range(10, 14))
    g = Guard(donor.cfg.robust, donor.opts[0].plans)
    _copy_history(g, peers)
    doc = json.loads(json.dumps(guard_state(g)))  # as it travels
    h = Guard(donor.cfg.robust, donor.opts[0].plans)
    load_guard_state(h, doc, max_step=ADOPT_AT)
    assert guard_state(h) == guard_state(g)
    assert (h.flag_rounds, h.neutralised, h.copiers, h.cos_history) == (
        g.flag_rounds,
        g.neutralised,
        g.copiers,
        g.cos_history,
    )
    assert list(h.copy_window) == list(g.copy_window) and list(h.held) == list(g.held)
    assert h.copy_window.maxlen == g.copy_window.maxlen and h.cos_history[peers[1]].maxlen == 8


def _p(i: int) -> str:
    return sorted(_ident(i).peer_id for i in range(20, 24))[i].hex()


def _set(key: str, value: object) -> Callable[[dict[str, Any]], object]:
    def change(doc: dict[str, Any]) -> object:
        doc[key] = value
        return doc

    return change


CFG = preset("ours_k32").robust
HOSTILE_DOCS: dict[str, Callable[[dict[str, Any]], object]] = {
    "not a dict": lambda doc: [doc],
    "missing key": lambda doc: {k: v for k, v in doc.items() if k != "held"},
    "unknown key": _set("extra", []),
    "a key not a string": lambda doc: {**doc, 1: []},  # a checkpoint's dict may hold any key
    "flags not a list": _set("flags", {}),
    "flags entry not a pair": _set("flags", [[_p(0)]]),
    "peer id of 37 bytes": _set("flags", [[_p(0)[:-2], 1]]),
    "peer id of 39 bytes": _set("flags", [[_p(0) + "00", 1]]),
    "peer id in upper case": _set("flags", [[_p(0).upper(), 1]]),
    "peer id not ed25519": _set("flags", [["ff" * 38, 1]]),
    "peer id not a string": _set("flags", [[5, 1]]),
    "count a string": _set("flags", [[_p(0), "1"]]),
    "count a bool": _set("flags", [[_p(0), True]]),
    "count zero": _set("flags", [[_p(0), 0]]),
    "count over 2**53": _set("flags", [[_p(0), 2**53 + 1]]),
    "peers out of order": _set("flags", [[_p(1), 1], [_p(0), 1]]),
    "peer repeated": _set("flags", [[_p(0), 1], [_p(0), 2]]),
    "too many peers": _set("flags", [[_p(0), 1]] * (MAX_GUARD_PEERS + 1)),
    "cosine nan": _set("cos", [[_p(0), [float("nan")]]]),
    "cosine infinite": _set("cos", [[_p(0), [float("-inf")]]]),
    "cosine an int": _set("cos", [[_p(0), [1]]]),
    "cosine far out": _set("cos", [[_p(0), [3.5]]]),
    "cosines empty": _set("cos", [[_p(0), []]]),
    "cosines over cos_window": _set("cos", [[_p(0), [0.1] * (CFG.cos_window + 1)]]),
    "step negative": _set("neutralised", [[_p(0), -1]]),
    "step past the state's": _set("neutralised", [[_p(0), ADOPT_AT + 1]]),
    "step a float": _set("copiers", [[_p(0), 1.0]]),
    "copy window over credit_delay": _set("copy_window", [[]] * (CFG.credit_delay + 1)),
    "copy group of one": _set("copy_window", [[[_p(0)]]]),
    "copy group repeats a peer": _set("copy_window", [[[_p(0), _p(0)]]]),
    "copy groups out of order": _set("copy_window", [[[_p(2), _p(3)], [_p(0), _p(1)]]]),
    "held over credit_delay": _set("held", [[i, [], [], []] for i in range(CFG.credit_delay + 1)]),
    "held entry of three": _set("held", [[0, [], []]]),
    "held steps out of order": _set("held", [[2, [], [], []], [1, [], [], []]]),
    "held step repeated": _set("held", [[1, [], [], []], [1, [], [], []]]),
    "held step negative": _set("held", [[-1, [], [], []]]),
    "held step past the state's": _set("held", [[ADOPT_AT + 1, [], [], []]]),
    "held credit out of order": _set("held", [[0, [_p(1), _p(0)], [], []]]),
    "held combined not a list": _set("held", [[0, [], "all", []]]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_DOCS))
def test_a_hostile_history_is_refused_and_the_guard_left_as_it_was(donor: _Swarm, case: str) -> None:
    doc = guard_state(donor.opts[0].guard)
    load_guard_state(Guard(CFG, donor.opts[0].plans), doc, max_step=ADOPT_AT)  # the real one loads
    target = Guard(CFG, donor.opts[0].plans)
    _copy_history(target, sorted(_ident(i).peer_id for i in range(10, 14)))
    before = guard_state(target)
    with pytest.raises(StateRefused, match="guard history"):
        load_guard_state(target, HOSTILE_DOCS[case](copy.deepcopy(doc)), max_step=ADOPT_AT)
    assert guard_state(target) == before


def _with_header(blob: bytes, change: Callable[[dict[str, Any]], None], magic: bytes = MAGIC) -> bytes:
    (n,) = struct.unpack(">I", blob[4:8])
    head = json.loads(blob[8 : 8 + n])
    change(head)
    h = json.dumps(head, separators=(",", ":")).encode()
    return magic + struct.pack(">I", len(h)) + h + blob[8 + n :]


@pytest.mark.parametrize("case", ["older format", "no guard", "lying guard"])
def test_a_blob_without_a_sound_history_is_refused_whole(donor: _Swarm, case: str) -> None:
    blob = donor.blob(0)
    bad = {
        "older format": _with_header(blob, lambda h: h.pop("guard"), magic=b"DNS0"),
        "no guard": _with_header(blob, lambda h: h.pop("guard")),
        "lying guard": _with_header(blob, lambda h: h["guard"].pop("cos")),
    }[case]
    why = {"older format": "DNS0", "no guard": "no guard", "lying guard": "keys"}[case]
    model = _model(seed=7)
    opt = DistroOptimizer(
        model.named_parameters(), donor.cfg, MemoryHub().join(b"x"), _ident(9), roles=tensor_roles(model)
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(StateRefused, match=why):
        load_state_blob(bad, model, opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert guard_state(opt.guard) == guard_state(Guard(CFG, opt.plans))


def test_a_checkpoint_keeps_the_history(donor: _Swarm, tmp_path: Path) -> None:
    from distronet.node.daemon.training import _restore_guard

    opt0 = donor.opts[0]
    path = tmp_path / "ck.pt"
    save_checkpoint(path, Checkpoint("r", ADOPT_AT, "", {}, {}, guard_state(opt0.guard)))
    ck = load_checkpoint(path, run_id="r")
    assert ck is not None and ck.guard == guard_state(opt0.guard)
    fresh = DistroOptimizer(_model().named_parameters(), donor.cfg, MemoryHub().join(b"x"), _ident(9))
    _restore_guard(fresh, ck, path)
    assert guard_state(fresh.guard) == guard_state(opt0.guard)
    lying = Checkpoint("r", 1, "", {}, {}, ck.guard)  # held rounds past the checkpoint's step
    with pytest.raises(CheckpointError, match="delete it"):
        _restore_guard(fresh, lying, path)
    older = Checkpoint("r", ADOPT_AT, "", {}, {})  # written before the history was kept
    _restore_guard(fresh, older, path)
    assert guard_state(fresh.guard) == guard_state(opt0.guard)  # left as it was
