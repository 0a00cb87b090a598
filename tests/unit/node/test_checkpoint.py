"""Checkpoints as safetensors plus a JSON document (``daemon/checkpoint.py``, format 2): what goes
in comes out (tied weights once, int keys, tuples, tensors anywhere in the optimizer's state), and
files that lie are refused with a ``CheckpointError`` before anything is loaded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from distronet.node.daemon.checkpoint import (
    FORMAT,
    MAX_DEPTH,
    META_KEY,
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 4)
        self.body = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 11, bias=False)
        self.out.weight = self.embed.weight  # tied: one tensor, two names
        self.register_buffer("counts", torch.arange(3, dtype=torch.int64))


def _trained() -> tuple[_Tied, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _Tied()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    for _ in range(3):
        loss = model.out(model.body(model.embed(torch.tensor([1, 2, 3])))).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def _save(path: Path, guard: dict[str, Any] | None = None) -> tuple[_Tied, torch.optim.Optimizer]:
    model, opt = _trained()
    save_checkpoint(path, Checkpoint("r", 7, "abc", model.state_dict(), opt.state_dict(), guard))
    return model, opt


def test_a_checkpoint_round_trips_and_resumes_the_same_training(tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    model, opt = _save(path, {"flags": [[1, "x"]], "held": 0.5})
    ck = load_checkpoint(path, run_id="r")
    assert ck is not None and (ck.step, ck.digest, ck.guard) == (7, "abc", {"flags": [[1, "x"]], "held": 0.5})
    assert list(ck.model) == list(model.state_dict())
    for name, t in model.state_dict().items():
        assert torch.equal(ck.model[name], t) and ck.model[name].dtype == t.dtype, name
    with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
        assert "model/out.weight" not in set(f.keys())  # the tied weight is stored once
    saved = opt.state_dict()
    assert ck.optimizer["param_groups"][0]["betas"] == (0.8, 0.95)  # a tuple stays a tuple
    assert set(ck.optimizer["state"]) == set(saved["state"])  # int keys stay ints
    again, opt2 = _Tied(), None
    again.load_state_dict(ck.model)
    opt2 = torch.optim.AdamW(again.parameters(), lr=1e-2, betas=(0.8, 0.95))
    opt2.load_state_dict(ck.optimizer)
    x = torch.tensor([4, 5])
    for m, o in ((model, opt), (again, opt2)):  # one more step from each: bit-identical
        o.zero_grad()
        m.out(m.body(m.embed(x))).square().mean().backward()
        o.step()
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    assert load_checkpoint(tmp_path / "none.safetensors", run_id="r") is None


def test_wrong_run_garbage_and_an_older_nodes_torch_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "ck.safetensors"
    _save(path)
    with pytest.raises(CheckpointError, match="belongs to run"):
        load_checkpoint(path, run_id="other")
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, run_id="r")
    torch.save({"format": 1, "run_id": "r", "step": 3}, path)  # what format 1 was (never read)
    with pytest.raises(CheckpointError, match="older node's torch format"):
        load_checkpoint(path, run_id="r")


def test_what_cannot_be_kept_is_refused_at_save(tmp_path: Path) -> None:
    model, _ = _trained()
    for bad in ({"state": {0: {"fn": print}}}, {"state": {(1, 2): 3}}, {"x": b"raw"}):
        with pytest.raises(CheckpointError, match="optimizer state"):
            save_checkpoint(tmp_path / "ck.safetensors", Checkpoint("r", 1, "", model.state_dict(), bad))
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(MAX_DEPTH + 2):
        node["d"] = {}
        node = node["d"]
    with pytest.raises(CheckpointError, match="deeper"):
        save_checkpoint(tmp_path / "ck.safetensors", Checkpoint("r", 1, "", {}, deep))
    assert not (tmp_path / "ck.safetensors").exists()  # nothing half-written was left
    inf = {"state": {}, "param_groups": [{"max": math.inf, "min": -math.inf}]}
    save_checkpoint(tmp_path / "ck.safetensors", Checkpoint("r", 1, "", {}, inf))
    ck = load_checkpoint(tmp_path / "ck.safetensors", run_id="r")
    assert ck is not None and ck.optimizer == inf


def _doc(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    with safe_open(str(path), framework="pt") as f:  # type: ignore[no-untyped-call]
        return json.loads(f.metadata()[META_KEY]), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def _set(d: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {**d, **kw}


LIES = {
    "another format": lambda d, t: (_set(d, format=FORMAT + 1), t),
    "a negative step": lambda d, t: (_set(d, step=-1), t),
    "a step that is a bool": lambda d, t: (_set(d, step=True), t),
    "a guard that is a list": lambda d, t: (_set(d, guard=[1]), t),
    "a model tensor missing": lambda d, t: (d, {k: v for k, v in t.items() if k != "model/body.weight"}),
    "a stored tensor nobody names": lambda d, t: (d, {**t, "model/extra": torch.zeros(2)}),
    "an alias to nothing": lambda d, t: (_set(d, aliases={"out.weight": "gone"}), t),
    "an alias chain": lambda d, t: (_set(d, aliases={"out.weight": "out.weight"}), t),
    "an optimizer tensor missing": lambda d, t: (
        d,
        {k: v for k, v in t.items() if not k.startswith("optim/")},
    ),
    "a model tensor as optimizer state": lambda d, t: (
        _set(d, optimizer={"$dict": [["x", {"$t": "model/body.bias"}]]}),
        t,
    ),
    "one tensor named twice": lambda d, t: (
        _set(d, optimizer={"$dict": [["a", {"$t": "optim/a"}], ["b", {"$t": "optim/a"}]]}),
        {**{k: v for k, v in t.items() if k.startswith("model/")}, "optim/a": torch.zeros(1)},
    ),
    "an unknown tag": lambda d, t: (_set(d, optimizer={"$code": "print(1)"}), t),
    "a duplicate key": lambda d, t: (_set(d, optimizer={"$dict": [["a", 1], ["a", 2]]}), t),
    "a deep tree": lambda d, t: (
        _set(d, optimizer=json.loads("[" * (MAX_DEPTH + 3) + "]" * (MAX_DEPTH + 3))),
        t,
    ),
    "no document": lambda d, t: (None, t),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_file_that_lies_is_refused_whole(tmp_path: Path, lie: str) -> None:
    path = tmp_path / "ck.safetensors"
    _save(path)
    doc, tensors = LIES[lie](*_doc(path))
    meta = {} if doc is None else {META_KEY: json.dumps(doc)}
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match="delete it"):
        load_checkpoint(path, run_id="r")
