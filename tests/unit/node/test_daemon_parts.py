"""Daemon parts without processes: state machine, run-table parsing, checkpoint round trip, status."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch

from distronet.node.config import NodeConfig
from distronet.node.daemon.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from distronet.node.daemon.node import Node, NodeState, NodeStateError
from distronet.node.daemon.parts import bootstrap_addrs, exchange_config, optimizer_config
from distronet.node.daemon.status import NodeStatus, StatusLine
from distronet.node.daemon.trainer import ModelSpec, param_digest
from distronet.node.models.build import build_model
from distronet.protocol.errors import ConfigError


async def test_bad_state_transitions_raise() -> None:
    node = Node(NodeConfig(run_id="r", coordinator="http://127.0.0.1:9"))
    with pytest.raises(NodeStateError, match="created to training"):
        node._to(NodeState.TRAINING)
    node._to(NodeState.STARTING)
    await node.close()
    assert node.state is NodeState.CLOSED
    with pytest.raises(NodeStateError):
        node._to(NodeState.STARTING)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
async def test_an_absent_device_fails_before_the_coordinator_is_called(tmp_path: Path) -> None:
    """An explicit device is checked (torch loaded first) before any network call; auto and cpu
    cannot fail and are picked after p2pd's start, while torch loads in the background."""
    from distronet.node.config import TrainConfig
    from distronet.node.daemon.node import NodeError
    from distronet.node.exitcodes import ExitCode

    cfg = NodeConfig(
        run_id="r", coordinator="http://127.0.0.1:9", data_dir=str(tmp_path), train=TrainConfig(device="cuda")
    )
    with pytest.raises(NodeError, match="no CUDA device") as err:
        await Node.create(cfg)  # port 9 would answer "unreachable" (exit 3) if it were called first
    assert err.value.exit_code is ExitCode.USAGE


def test_run_tables_parse_and_refuse_unknowns() -> None:
    spec = ModelSpec.from_run(
        {"arch": "gpt", "depth": 1, "width": 32, "heads": 2, "context": 16, "batch": 2, "seq_len": 16}
    )
    assert spec.gpt.depth == 1 and spec.seq_len == 16
    with pytest.raises(ConfigError, match="wdith"):
        ModelSpec.from_run({"wdith": 3})
    with pytest.raises(ConfigError, match="seq_len"):
        ModelSpec.from_run({"context": 8, "seq_len": 16})
    assert optimizer_config("r", {"name": "distro", "preset": "psyche", "lr": 0.01}).schedule.lr == 0.01
    nested = optimizer_config("r", {"lr": 0.01, "overlap": {"enabled": True, "predict": "own"}})
    assert (nested.overlap.enabled, nested.overlap.predict, nested.run_id) == (True, "own", "r")
    with pytest.raises(ConfigError):
        optimizer_config("r", {"name": "adam"})
    assert exchange_config({"strategy": "all-gather", "round_deadline_s": 2}).round_deadline_s == 2.0
    with pytest.raises(ConfigError, match="butterfly"):
        exchange_config({"strategy": "butterfly"})


def test_bootstrap_addrs_append_peer_id_and_skip_self() -> None:
    peers = [{"peer_id": "A", "multiaddrs": ["/ip4/1.2.3.4/tcp/1"]}, {"peer_id": "ME", "multiaddrs": ["/x"]}]
    assert bootstrap_addrs(peers, "ME") == ("/ip4/1.2.3.4/tcp/1/p2p/A",)


def test_checkpoint_round_trip_and_wrong_run(tmp_path: Path) -> None:
    spec = ModelSpec.from_run({"depth": 1, "width": 32, "heads": 2, "context": 16, "seq_len": 16})
    model = build_model(spec, torch.device("cpu"))
    path = tmp_path / "ck.pt"
    save_checkpoint(
        path, Checkpoint("r", 5, param_digest(model), model.state_dict(), {"state": {}, "param_groups": []})
    )
    ck = load_checkpoint(path, run_id="r")
    assert ck is not None and ck.step == 5
    other = build_model(
        ModelSpec.from_run({"depth": 1, "width": 32, "heads": 2, "context": 16, "seq_len": 16, "seed": 9}),
        torch.device("cpu"),
    )
    other.load_state_dict(ck.model)
    assert param_digest(other) == ck.digest
    with pytest.raises(CheckpointError, match="belongs to run"):
        load_checkpoint(path, run_id="other")
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, run_id="r")
    assert load_checkpoint(tmp_path / "none.pt", run_id="r") is None


def test_status_line_shows_rates_against_budget() -> None:
    s = NodeStatus("r", "peer", step=3, loss=2.5, peers=2, up_bps=125_000, up_budget=1_250_000, shard="s1")
    out = io.StringIO()
    StatusLine(out, live=False).show(s)
    text = out.getvalue()
    assert "step 3" in text and "loss 2.500" in text and "(10%)" in text and "shard s1" in text
    assert s.to_json()["down_budget"] is None and math.isinf(s.down_budget)


def test_run_exchange_table_sets_the_warm_up_mask() -> None:
    assert exchange_config({}).warmup_mask_steps == 3
    assert exchange_config({"warmup_mask_steps": 5}).warmup_mask_steps == 5
    with pytest.raises(ConfigError):
        exchange_config({"warmup_mask_steps": -1})


def test_run_exchange_table_sets_the_rounds_of_one_before_asking() -> None:
    assert exchange_config({}).alone_rounds == 0
    assert exchange_config({"alone_rounds": 3}).alone_rounds == 3
    for bad in (-1, 1001):
        with pytest.raises(ConfigError, match="alone_rounds"):
            exchange_config({"alone_rounds": bad})


def test_run_exchange_table_sets_a_bounded_retention() -> None:
    assert exchange_config({}).retention == 32
    assert exchange_config({"retention": 256}).retention == 256
    for bad in (0, -3, 4097):
        with pytest.raises(ConfigError, match="retention"):
            exchange_config({"retention": bad})


def test_global_batch_parses_and_is_bounded() -> None:
    base = {"depth": 1, "width": 32, "heads": 2, "context": 16, "batch": 2, "seq_len": 16}
    assert ModelSpec.from_run(base).global_batch == 0  # off unless the run asks
    assert ModelSpec.from_run({**base, "global_batch": 8}).global_batch == 8
    for bad in (1, -3, 10**6):  # below one node's batch, negative, over the limit
        with pytest.raises(ConfigError, match="global_batch"):
            ModelSpec.from_run({**base, "global_batch": bad})


def test_shard_feed_draws_its_batch_then_reads_further() -> None:
    import numpy as np

    from distronet.node.daemon.coordinator_client import Lease
    from distronet.node.daemon.parts import ShardFeed

    feed = ShardFeed(seed=1, peer=7, batch=3, seq_len=8)
    with pytest.raises(ConfigError, match="no shard"):
        feed.draw(0, 5)
    tokens = np.arange(4000, dtype=np.uint8)
    lease = Lease(1, 0, "s0", "t", 0.0, tokens.size, tokens.size, "0" * 64, "u")
    feed.switch(lease, tokens, at_step=10)
    x, y = feed(12)
    x5, y5 = feed.draw(12, 5)
    assert x5.shape == (5, 8) and np.array_equal(x5[:3], x) and np.array_equal(y5[:3], y)


def test_a_run_whose_data_outgrows_its_models_vocabulary_is_refused_before_joining() -> None:
    from distronet.node.daemon.parts import check_vocab

    spec = ModelSpec.from_run({"vocab": 300})
    check_vocab(spec, {"dtype": "uint8"})  # a byte-level run: no vocab_size
    check_vocab(spec, {"dtype": "uint16", "vocab_size": 300})
    with pytest.raises(ConfigError, match="vocabulary of 4096 tokens but its model embeds 300"):
        check_vocab(spec, {"dtype": "uint16", "vocab_size": 4096})
