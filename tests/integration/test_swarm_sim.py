"""In-process swarms: bit-identical replicas under faults, peer death, overlapped mode."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from distronet.node.bench.swarm_sim import SwarmFaults, SwarmResult, param_digest, run_swarm
from distronet.node.daemon.trainer import replica_digest
from distronet.node.exchange.faulty import FaultPlan
from distronet.node.optim.config import preset
from distronet.protocol.errors import ConfigError

torch.manual_seed(0)
_X = torch.randn(512, 48)
_Y = torch.tanh(_X @ torch.randn(48, 4) / 7)


def _factory() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(48, 64), nn.Tanh(), nn.Linear(64, 4))


def _batches(peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * peer + step)
    ix = torch.randint(0, len(_X), (32,), generator=g)
    return _X[ix], _Y[ix]


def _mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def _tail(res: object, steps: int) -> float:
    vals = [res.mean_loss(s) for s in range(steps - 5, steps)]  # type: ignore[attr-defined]
    return sum(vals) / len(vals)


@pytest.mark.parametrize("overlap", [False, True])
def test_replicas_bit_identical_under_faults(overlap: bool) -> None:
    plan = FaultPlan(seed=5, p_drop=0.15, p_late=0.1, p_duplicate=0.3, max_delay=0.9)
    cfg = preset("ours_k4_1bit", lr=3e-3, overlap=overlap, warmup_steps=0)
    res = run_swarm(_factory, _batches, cfg, 4, 14, SwarmFaults(plan=plan), loss_fn=_mse)
    assert len({param_digest(m) for m in res.models}) == 1
    reports = [r for opt in res.optimizers for r in opt.reports]
    assert any(len(r.accepted) < 4 for r in reports)  # the faults did cut some rounds
    assert sum(opt.exchange.stats.duplicates_dropped for opt in res.optimizers) > 0
    assert sum(opt.exchange.stats.repulled for opt in res.optimizers) > 0
    assert _tail(res, 14) < 0.9 * res.mean_loss(0)


def test_peer_death_others_continue_identically() -> None:
    cfg = preset("ours_k4_1bit", lr=3e-3, warmup_steps=0)
    res = run_swarm(_factory, _batches, cfg, 4, 14, SwarmFaults(deaths={2: 6}), loss_fn=_mse)
    assert res.alive == [True, True, False, True]
    assert math.isnan(res.losses[2][6]) and res.upload_bytes[2][8] == 0
    live = [m for i, m in enumerate(res.models) if res.alive[i]]
    assert len({param_digest(m) for m in live}) == 1
    assert all(len(res.optimizers[0].reports[s].accepted) == (4 if s < 6 else 3) for s in range(14))
    assert _tail(res, 14) < 0.9 * res.mean_loss(0)


@pytest.mark.slow
def test_overlap_close_to_plain() -> None:
    plain = run_swarm(_factory, _batches, preset("ours_k32", lr=3e-3, warmup_steps=0), 2, 30, loss_fn=_mse)
    lapped = run_swarm(
        _factory, _batches, preset("ours_k32", lr=3e-3, overlap=True, warmup_steps=0), 2, 30, loss_fn=_mse
    )
    assert abs(_tail(lapped, 30) / _tail(plain, 30) - 1) < 0.15
    assert len({param_digest(m) for m in lapped.models}) == 1


def test_upload_bytes_recorded_and_bad_arguments() -> None:
    res = run_swarm(_factory, _batches, preset("psyche", lr=1e-3), 2, 2, loss_fn=_mse)
    assert all(b > 0 for row in res.upload_bytes for b in row)
    with pytest.raises(ConfigError):
        run_swarm(_factory, _batches, preset("psyche"), 0, 2, loss_fn=_mse)
    with pytest.raises(ConfigError):
        run_swarm(_factory, _batches, preset("psyche"), 2, 2, SwarmFaults(deaths={5: 1}), loss_fn=_mse)


@pytest.mark.parametrize("predict", ["last", "own", "ema"])
def test_shared_round_cache_changes_no_bit(predict: str) -> None:
    # replicas in one process share each round's aggregate and stateless direction: the result
    # must equal every replica computing its own
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0, overlap=True, overlap_predict=predict)
    shared = run_swarm(_factory, _batches, cfg, 3, 6, loss_fn=_mse)
    alone = run_swarm(_factory, _batches, cfg, 3, 6, loss_fn=_mse, share_rounds=False)
    digests = {param_digest(m) for m in shared.models + alone.models}
    assert len(digests) == 1
    assert shared.losses == alone.losses
    with pytest.raises(ConfigError):
        preset("ours_k32", overlap_predict="next")


def _linear() -> nn.Module:
    torch.manual_seed(2)
    return nn.Linear(48, 4)


@pytest.mark.slow
def test_600_steps_bit_identical_under_shuffled_duplicated_delayed_delivery() -> None:
    # issue 3; every replica aggregates and computes its update on its own, as separate processes do
    plan = FaultPlan(seed=11, p_drop=0.05, p_late=0.05, p_duplicate=0.3, max_delay=0.9)
    cfg = preset("ours_k4_1bit", lr=3e-3, warmup_steps=10, total_steps=600)
    res = run_swarm(_linear, _batches, cfg, 4, 600, SwarmFaults(plan=plan), loss_fn=_mse, share_rounds=False)
    assert len({param_digest(m) for m in res.models}) == 1
    assert sum(opt.exchange.stats.duplicates_dropped for opt in res.optimizers) > 100
    assert sum(opt.exchange.stats.repulled for opt in res.optimizers) > 10
    assert sum(len(r.accepted) < 4 for r in res.optimizers[0].reports) > 10
    assert _tail(res, 600) < 0.7 * res.mean_loss(0)


def test_own_guess_replicas_agree_on_the_replica_digest_not_on_parameters() -> None:
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0, overlap=True, overlap_predict="own", overlap_scale=0.7)
    seen: list[tuple[int, int]] = []  # per step: distinct replica digests, distinct parameter digests

    def look(step: int, res: SwarmResult) -> None:
        pairs = list(zip(res.models, res.optimizers, strict=True))
        seen.append((len({replica_digest(m, o) for m, o in pairs}), len({param_digest(m) for m, _ in pairs})))

    run_swarm(_factory, _batches, cfg, 3, 6, loss_fn=_mse, share_rounds=False, on_step=look)
    assert all(r == 1 for r, _ in seen)  # the consensus is bit-identical after every step
    assert any(p == 3 for _, p in seen)  # while each replica's parameters carry its own guess


def test_without_overlap_the_replica_digest_is_the_parameter_digest() -> None:
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0)
    res = run_swarm(_factory, _batches, cfg, 2, 3, loss_fn=_mse)
    for m, o in zip(res.models, res.optimizers, strict=True):
        assert replica_digest(m, o) == param_digest(m)
    assert replica_digest(res.models[0], object()) == param_digest(res.models[0])  # a plain optimizer


def _unique_batches(peer: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * peer + step)
    x = torch.randn(4, 48, generator=g)  # every window distinct (with probability 1)
    return x, torch.tanh(x @ _X[:48, :4] / 7)


def test_keep_global_batch_deals_the_dead_peers_windows_once() -> None:
    # issue 3, peer death: the survivors take over the dead peer's stream, the step still trains
    # on the run's global batch of 4 x 4 windows, no window twice, replicas bit-identical
    calls: list[list[bytes]] = []  # the windows of each loss_fn call, in call order

    def record(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append([row.numpy().tobytes() for row in x])
        return _mse(model, x, y)

    cfg = preset("ours_k4_1bit", lr=3e-3, warmup_steps=0)
    res = run_swarm(
        _factory, _unique_batches, cfg, 4, 10, SwarmFaults(deaths={1: 4}), loss_fn=record,
        share_rounds=False, keep_global_batch=True,
    )  # fmt: skip
    assert res.alive == [True, False, True, True]
    assert len({param_digest(m) for i, m in enumerate(res.models) if res.alive[i]}) == 1
    totals = [sum(w[t] for w in res.windows) for t in range(10)]
    assert totals == [16] * 4 + [12] + [16] * 5  # step 4: peer 1 trained, then died unsent
    assert all(res.windows[1][t] == 0 for t in range(4, 10))
    assert {tuple(res.windows[i][t] for i in (0, 2, 3)) for t in range(5, 10)} == {
        (6, 5, 5),
        (5, 6, 5),
        (5, 5, 6),
    }
    assert len(calls) == 4 * 4 + 4 + 3 * 5  # steps 0-4: 4 calls (peer 1 dies after its step-4 call), then 3
    for t in range(5, 10):
        rows = [r for c in calls[20 + 3 * (t - 5) : 20 + 3 * (t - 4)] for r in c]
        want = [r.numpy().tobytes() for p in range(4) for r in _unique_batches(p, t)[0]]
        assert len(rows) == len(set(rows)) == 16  # no window twice in a step
        assert set(rows) == set(want)  # and every window of all four streams, the dead one's too


def test_keep_global_batch_changes_nothing_without_deaths_and_helps_after_one() -> None:
    cfg = preset("ours_k32", lr=3e-3, warmup_steps=0)
    plain = run_swarm(_factory, _batches, cfg, 3, 5, loss_fn=_mse)
    kept = run_swarm(_factory, _batches, cfg, 3, 5, loss_fn=_mse, keep_global_batch=True)
    assert {param_digest(m) for m in plain.models} == {param_digest(m) for m in kept.models}
    assert plain.losses == kept.losses
    dies = SwarmFaults(deaths={2: 2})
    lost = run_swarm(_factory, _batches, cfg, 3, 5, dies, loss_fn=_mse)
    taken = run_swarm(_factory, _batches, cfg, 3, 5, dies, loss_fn=_mse, keep_global_batch=True)
    assert [w[4] for w in lost.windows] == [32, 32, 0]
    assert sorted(w[4] for w in taken.windows) == [0, 48, 48]
    assert param_digest(lost.models[0]) != param_digest(taken.models[0])
