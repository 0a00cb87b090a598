"""``DistroOptimizer.apply_replayed``: a replica that computed nothing for some rounds and applies
the swarm's decided rounds in order holds, bit for bit, the consensus of the replicas that
trained them, and then trains in step with them (``node/catchup/replay.py``)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from tiny_net import tiny_grads, tiny_model
from torch import nn

from distronet.node.exchange.base import Round
from distronet.node.exchange.memory import MemoryExchange, MemoryHub
from distronet.node.optim.config import preset
from distronet.node.optim.distro import DistroOptimizer
from distronet.node.optim.roles import tensor_roles
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

_IDS = [Identity.from_seed(hashlib.sha256(b"replay-%d" % i).digest()) for i in range(3)]


class _Recording(MemoryExchange):
    """A hub exchange that keeps every round it collected."""

    def __init__(self, hub: MemoryHub, peer_id: bytes) -> None:
        super().__init__(hub, peer_id)
        self.rounds: dict[int, Round] = {}

    def collect(self, step: int) -> Round:
        rnd = super().collect(step)
        self.rounds[step] = rnd
        return rnd


def _digest(opt: DistroOptimizer) -> list[torch.Tensor]:
    return [t.detach().clone() for t in opt.replicated_params()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _step_all(opts: list[DistroOptimizer], models: list[nn.Module], peers: list[int], step: int) -> None:
    for opt, model, peer in zip(opts, models, peers, strict=True):
        tiny_grads(model, peer, step)
        opt.begin_step()
    for opt in opts:
        opt.finish_step()


@pytest.mark.parametrize(
    ("overlap", "start"), [(False, 0), (True, 0), (True, 3)], ids=["plain", "overlap", "overlap-from-3"]
)
def test_replayed_rounds_equal_the_trained_consensus_and_the_replica_trains_on_in_step(
    overlap: bool, start: int
) -> None:
    cfg = preset("ours_k32", lr=0.02, warmup_steps=2, total_steps=20, overlap=overlap, overlap_start=start)
    hub = MemoryHub(retention=64)
    models = [tiny_model(), tiny_model()]
    a_ex = _Recording(hub, _IDS[0].peer_id)
    opts = [
        DistroOptimizer(models[0].named_parameters(), cfg, a_ex, _IDS[0], roles=tensor_roles(models[0])),
        DistroOptimizer(
            models[1].named_parameters(),
            cfg,
            hub.join(_IDS[1].peer_id),
            _IDS[1],
            roles=tensor_roles(models[1]),
        ),
    ]
    seen: dict[int, list[torch.Tensor]] = {}  # A's next step -> its consensus then
    for t in range(8):
        _step_all(opts, models, [0, 1], t)
        seen[opts[0].step_index] = _digest(opts[0])

    late_model = tiny_model()  # the run's seeded weights: step 0 of the swarm
    late = DistroOptimizer(
        late_model.named_parameters(),
        cfg,
        MemoryHub().join(_IDS[2].peer_id),
        _IDS[2],
        roles=tensor_roles(late_model),
    )
    assert late.rounds_due() == 0
    with pytest.raises(ConfigError, match="round 0 is due"):
        late.apply_replayed(a_ex.rounds[1])
    while late.rounds_due() in a_ex.rounds and late.step_index < opts[0].step_index:
        late.apply_replayed(a_ex.rounds[late.rounds_due()])
        if late.step_index in seen:
            assert _same(_digest(late), seen[late.step_index]), late.step_index
    assert late.step_index == opts[0].step_index == 8
    assert _same(list(late_model.parameters()), _digest(late))  # no lookahead after a replay

    late.exchange = hub.join(_IDS[2].peer_id)  # it now trains with the others
    all_opts, all_models = [*opts, late], [*models, late_model]
    for t in range(8, 12):
        _step_all(all_opts, all_models, [0, 1, 2], t)
        assert _same(_digest(late), _digest(opts[0])) and _same(_digest(opts[1]), _digest(opts[0])), t
    assert _IDS[2].peer_id in a_ex.rounds[10].frames  # its packets count at once: no warm-up
