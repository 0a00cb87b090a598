"""Issue 17, state and drift a minority cannot fake: quorum adoption (``statesync.choose_root``),
the drift vote over admitted peers (``digests.state_to_adopt``), and a loaded state checked
before use (``state.load_state_blob``)."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
import torch

from distronet.node.catchup.digests import state_to_adopt
from distronet.node.catchup.replay import kth_newest
from distronet.node.catchup.state import MAGIC, StateRefused, load_state_blob, state_blob
from distronet.node.catchup.statesync import NoQuorum, choose_root
from distronet.node.daemon.trainer import ModelSpec, param_digest
from distronet.node.models.build import build_model
from distronet.protocol.state import StateManifest

SPEC = {"depth": 1, "width": 32, "heads": 2, "context": 16, "seq_len": 16}
HONEST, FAKE = hashlib.sha256(b"honest").digest(), hashlib.sha256(b"fake").digest()


def offer(peer: int, step: int, sha: bytes) -> StateManifest:
    return StateManifest("r", step, 10, sha, 10, (sha,), bytes([peer]) * 38, b"")


# ---------------------------------------------------------------- quorum adoption


def test_a_liar_claiming_a_huge_step_loses_to_five_honest_donors() -> None:
    offers = [offer(9, 10**15, FAKE), *(offer(p, 40, HONEST) for p in range(5))]
    chosen = choose_root(offers, quorum=2)
    assert chosen.root == (40, HONEST)  # the old rule (newest step wins) took step 1e15


def test_a_minority_state_is_never_adopted_without_a_quorum() -> None:
    with pytest.raises(NoQuorum):  # one honest and one liar: no state has two backers
        choose_root([offer(9, 41, FAKE), offer(1, 40, HONEST)], quorum=2)
    with pytest.raises(NoQuorum):
        choose_root([offer(9, 41, FAKE)], quorum=2)


def test_one_vote_per_peer_id() -> None:
    liar = [offer(9, 41, FAKE) for _ in range(4)]  # one donor's offer, repeated
    assert choose_root([*liar, offer(1, 40, HONEST), offer(2, 40, HONEST)], quorum=2).root == (40, HONEST)
    with pytest.raises(NoQuorum):
        choose_root(liar, quorum=2)


def test_offers_past_max_step_do_not_count() -> None:
    offers = [offer(7, 50, FAKE), offer(8, 50, FAKE), offer(1, 40, HONEST), offer(2, 40, HONEST)]
    assert choose_root(offers, quorum=2, max_step=45).root == (40, HONEST)
    with pytest.raises(NoQuorum):
        choose_root(offers, quorum=2, max_step=30)


def test_equal_backing_prefers_the_newer_step_then_the_smaller_sha() -> None:
    offers = [offer(1, 40, HONEST), offer(2, 40, HONEST), offer(3, 41, FAKE), offer(4, 41, FAKE)]
    assert choose_root(offers, quorum=2).root == (41, FAKE)
    same = [offer(1, 40, HONEST), offer(2, 40, HONEST), offer(3, 40, FAKE), offer(4, 40, FAKE)]
    assert choose_root(same, quorum=2).root == (40, min(HONEST, FAKE))


def test_the_swarm_step_bound_ignores_one_peer_claiming_a_far_step() -> None:
    assert kth_newest([40, 10**15, 39], 2) == 40  # the liar's step needs a second voucher
    assert kth_newest([10**15], 2) == 10**15  # one answer: it is all we know (the root quorum still holds)
    assert kth_newest([], 2) is None


# ---------------------------------------------------------------- the drift vote

A, B = b"A" * 32, b"B" * 32


def test_four_fresh_identities_cannot_outvote_three_admitted_honest_nodes() -> None:
    honest = {"h1", "h2"}  # we are the third honest node
    voters: dict[str, bytes | None] = {"h1": A, "h2": A, **{f"sybil{i}": B for i in range(4)}}
    assert state_to_adopt(A, voters, quorum=2) == [f"sybil{i}" for i in range(4)]  # unguarded: outvoted
    assert state_to_adopt(A, voters, quorum=2, admitted=lambda p: p in honest) is None


def test_a_lone_voter_cannot_move_a_replica_when_others_answered() -> None:
    # three distinct digests, B smallest: the tie-break alone would adopt the single B voter
    assert state_to_adopt(b"C" * 32, {"x": B, "y": b"D" * 32}) == ["x"]
    assert state_to_adopt(b"C" * 32, {"x": B, "y": b"D" * 32}, quorum=2) is None
    assert state_to_adopt(b"C" * 32, {"x": B, "y": B}, quorum=2) == ["x", "y"]
    assert state_to_adopt(B, {"x": A}, quorum=2) == ["x"]  # only one voter: the tie-break decides


# ---------------------------------------------------------------- a loaded state is checked


def model(seed: int) -> torch.nn.Module:
    return build_model(ModelSpec.from_run({**SPEC, "seed": seed}), torch.device("cpu"))


def parts(blob: bytes) -> tuple[dict[str, object], bytes]:
    (n,) = struct.unpack(">I", blob[4:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def pack(head: dict[str, object], body: bytes) -> bytes:
    h = json.dumps(head, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", len(h)) + h + body


def donor_blob() -> tuple[torch.nn.Module, torch.optim.Optimizer, bytes]:
    a = model(1)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    first = next(a.parameters())
    opt.state[first]["v"] = torch.full_like(first, 0.5)
    opt.state[first]["n"] = 3
    return a, opt, state_blob(5, a, opt)


def refused(blob: bytes, optimizer_state: dict[str, object] | None = None) -> None:
    b = model(2)
    opt = torch.optim.SGD(b.parameters(), lr=0.1)
    if optimizer_state:
        opt.state[next(b.parameters())].update(optimizer_state)
    before = param_digest(b)
    with pytest.raises(StateRefused):
        load_state_blob(blob, b, opt)
    assert param_digest(b) == before  # nothing copied


def test_a_nan_state_is_refused() -> None:
    _, _, blob = donor_blob()
    head, body = parts(blob)
    arr = np.frombuffer(body, dtype="<f4").copy()
    arr[: arr.size] = np.nan
    refused(pack(head, arr.tobytes()))
    arr = np.frombuffer(body, dtype="<f4").copy()
    arr[-1] = np.inf  # one value in the optimizer state
    refused(pack(head, arr.tobytes()))


def test_an_integer_where_a_tensor_belongs_is_refused() -> None:
    _, _, blob = donor_blob()
    head, body = parts(blob)
    name = head["tensors"][0][0]  # type: ignore[index]
    refused(pack({**head, "ints": {f"{name}#v": 5, f"{name}#n": 3}}, body))  # v is a tensor
    refused(pack({**head, "ints": {f"{name}#n": 1.5}}, body))  # not an integer
    refused(pack({**head, "ints": {f"{name}#n": True}}, body))
    refused(pack({**head, "ints": {f"{name}#n": -1}}, body))


def test_unknown_duplicate_or_missing_entries_are_refused() -> None:
    _, _, blob = donor_blob()
    head, body = parts(blob)
    tensors: list[list[object]] = head["tensors"]  # type: ignore[assignment]
    name = tensors[0][0]
    renamed = [list(t) for t in tensors]
    renamed[-1][0] = f"{name}#evil"
    refused(pack({**head, "tensors": renamed}, body))  # an optimizer key nobody keeps
    refused(pack({**head, "ints": {f"{name}#extra": 1}}, body))
    dup = [*tensors[:-1], tensors[-2]]  # the last entry replaced by a copy of the one before
    refused(pack({**head, "tensors": dup}, body))
    refused(pack({**head, "step": "5"}, body))
    refused(pack({**head, "extra": 1}, body))
    refused(blob, {"consensus": torch.zeros(1)})  # the fresh optimizer holds it; the blob lacks it


def test_a_good_state_still_loads() -> None:
    a, _, blob = donor_blob()
    b = model(2)
    opt = torch.optim.SGD(b.parameters(), lr=0.1)
    assert load_state_blob(pack(*parts(blob)), b, opt) == 5 and param_digest(a) == param_digest(b)
