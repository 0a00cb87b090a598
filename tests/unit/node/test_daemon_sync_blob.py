"""State blobs: parameters + replicated optimizer state round trip; bad blobs are refused untouched."""

from __future__ import annotations

import struct

import pytest
import torch

from distronet.node.sync import load_state_blob, state_blob
from distronet.node.trainer import ModelSpec, param_digest
from distronet.protocol.errors import ConfigError

SPEC = {"depth": 1, "width": 32, "heads": 2, "context": 16, "seq_len": 16}


def model(seed: int) -> torch.nn.Module:
    return ModelSpec.from_run({**SPEC, "seed": seed}).build(torch.device("cpu"))


def test_round_trip_with_optimizer_state_and_determinism() -> None:
    a, b = model(1), model(2)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    first = next(a.parameters())
    opt_a.state[first]["v"] = torch.full_like(first, 0.5)
    opt_a.state[first]["n"] = 7
    opt_a.state[first]["momentum"] = torch.ones(3)  # local: never shared
    blob = state_blob(11, a, opt_a)
    assert blob == state_blob(11, a, opt_a)  # deterministic: equal state, equal root hash
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
    assert load_state_blob(blob, b, opt_b) == 11
    assert param_digest(a) == param_digest(b)
    first_b = next(b.parameters())
    assert torch.equal(opt_b.state[first_b]["v"], opt_a.state[first]["v"]) and opt_b.state[first_b]["n"] == 7
    assert "momentum" not in opt_b.state[first_b]


@pytest.mark.parametrize("cut", ["magic", "truncated", "trailing", "header", "other_model"])
def test_bad_blobs_are_refused_and_nothing_is_copied(cut: str) -> None:
    a, b = model(1), model(2)
    blob = state_blob(3, a)
    bad = {
        "magic": b"XXXX" + blob[4:],
        "truncated": blob[:-4],
        "trailing": blob + b"\0\0\0\0",
        "header": blob[:4] + struct.pack(">I", 10**9) + blob[8:],
        "other_model": state_blob(3, ModelSpec.from_run({**SPEC, "width": 16}).build(torch.device("cpu"))),
    }[cut]
    before = param_digest(b)
    with pytest.raises(ConfigError):
        load_state_blob(bad, b)
    assert param_digest(b) == before


def test_snapshot_builds_the_blob_of_its_moment_and_refuses_once_overwritten() -> None:
    from distronet.node.sync import StateSnapshot

    a = model(1)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    first = next(a.parameters())
    opt.state[first]["v"] = torch.full_like(first, 0.25)
    opt.state[first]["n"] = 3
    opt.state[first]["momentum"] = torch.ones(3)  # local: never shared
    snap = StateSnapshot()
    at_5 = snap.take(5, a, opt)
    want = state_blob(5, a, opt)
    with torch.no_grad():
        first.add_(1.0)  # the model moves on; the snapshot keeps step 5's values
    assert at_5() == want
    at_6 = snap.take(6, a, opt)
    assert at_6() == state_blob(6, a, opt) != want
    assert at_5() == want  # still valid: the buffers alternate
    snap.take(7, a, opt)
    with pytest.raises(RuntimeError, match="overwritten"):
        at_5()
    assert at_6() == state_blob(6, a, opt)


def test_snapshot_digest_is_the_parameter_digest_of_its_moment() -> None:
    from distronet.node.sync import StateSnapshot

    a = model(3)
    snap = StateSnapshot()
    with pytest.raises(RuntimeError):
        snap.param_digest()
    snap.take(1, a)
    want = param_digest(a)
    with torch.no_grad():
        next(a.parameters()).add_(1.0)
    assert snap.param_digest() == want != param_digest(a)
