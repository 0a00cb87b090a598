"""The built-in GPT: shapes, parameter count, causality, determinism from a seed."""

from __future__ import annotations

import pytest
import torch

from distronet.node.models.gpt import GPT, GPTConfig
from distronet.protocol.errors import ConfigError

TINY = GPTConfig(depth=2, width=32, heads=4, context=16)


def test_default_model_is_about_0_9m_parameters() -> None:
    n = GPT(GPTConfig()).num_parameters()
    assert 0.8e6 < n < 1.0e6


def test_logits_and_loss_shapes() -> None:
    model = GPT(TINY, seed=1)
    idx = torch.randint(0, 256, (3, 16))
    assert model(idx).shape == (3, 16, 256)
    loss = model.loss(idx, idx)
    assert loss.shape == ()
    # untrained: close to uniform over 256 bytes
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.5


def test_same_seed_same_weights_other_seed_differs() -> None:
    a, b, c = GPT(TINY, seed=7), GPT(TINY, seed=7), GPT(TINY, seed=8)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if name.endswith("weight") and pa.dim() == 2:
            assert not torch.equal(pa, pc), name


def test_init_does_not_touch_global_rng() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    GPT(TINY, seed=3)
    assert torch.equal(torch.rand(3), expected)


def test_causal_future_tokens_do_not_change_past_logits() -> None:
    model = GPT(TINY, seed=2).eval()
    idx = torch.randint(0, 256, (1, 16))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 256
    with torch.no_grad():
        assert torch.allclose(model(idx)[:, :10], model(changed)[:, :10], atol=1e-6)
        assert not torch.allclose(model(idx)[:, 10:], model(changed)[:, 10:])


def test_tied_weights_share_one_tensor() -> None:
    model = GPT(GPTConfig(depth=1, width=32, heads=2, context=8, tie_weights=True))
    assert model.lm_head.weight is model.wte.weight
    untied = GPT(GPTConfig(depth=1, width=32, heads=2, context=8))
    assert model.num_parameters() == untied.num_parameters() - 256 * 32


def test_bias_flag_removes_biases() -> None:
    model = GPT(GPTConfig(depth=1, width=32, heads=2, context=8, bias=False))
    assert not any(name.endswith(".bias") for name, _ in model.named_parameters())


def test_longer_than_context_is_refused() -> None:
    with pytest.raises(ConfigError, match="context"):
        GPT(TINY)(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("bad", [dict(width=30, heads=4), dict(depth=0), dict(dropout=1.0)])
def test_bad_config_is_a_config_error(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        GPTConfig(**bad)  # type: ignore[arg-type]


def test_a_few_steps_reduce_loss() -> None:
    torch.manual_seed(0)
    model = GPT(TINY, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, 8, (4, 16))
    first = model.loss(idx[:, :-1], idx[:, 1:]).item()
    for _ in range(20):
        loss = model.loss(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 1.0
