"""State blobs: parameters + replicated optimizer state round trip; bad blobs are refused untouched."""

from __future__ import annotations

import struct

import pytest
import torch

from distronet.node.catchup.state import load_state_blob, state_blob
from distronet.node.daemon.trainer import ModelSpec, param_digest
from distronet.node.models.build import build_model
from distronet.protocol.errors import ConfigError

SPEC = {"depth": 1, "width": 32, "heads": 2, "context": 16, "seq_len": 16}


def model(seed: int) -> torch.nn.Module:
    return build_model(ModelSpec.from_run({**SPEC, "seed": seed}), torch.device("cpu"))


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
        "other_model": state_blob(
            3, build_model(ModelSpec.from_run({**SPEC, "width": 16}), torch.device("cpu"))
        ),
    }[cut]
    before = param_digest(b)
    with pytest.raises(ConfigError):
        load_state_blob(bad, b)
    assert param_digest(b) == before


def test_param_digest_hashes_the_parameters_in_place_as_their_bytes() -> None:
    from blake3 import blake3

    a = model(3)
    h = blake3()
    for _, p in a.named_parameters():
        h.update(p.detach().numpy().tobytes())
    assert param_digest(a) == h.hexdigest()
    with torch.no_grad():
        next(a.parameters()).add_(1.0)
    assert param_digest(a) != h.hexdigest()
