"""The daemon's admission switch (daemon.parts.admission): enforced only when the run publishes a
coordinator key and the node's require_admission is on; never silently."""

from __future__ import annotations

import logging

import pytest

from distronet.node.config import NodeConfig
from distronet.node.daemon.parts import admission
from distronet.protocol.errors import ConfigError
from distronet.protocol.identity import Identity

KEY = Identity.from_seed(b"\x07" * 32)
PEER = Identity.from_seed(b"\x01" * 32).peer_id


def cfg(**kw: object) -> NodeConfig:
    return NodeConfig(run_id="r1", coordinator="http://127.0.0.1:1", **kw)  # type: ignore[arg-type]


def test_enforced_with_a_key_and_the_default_config() -> None:
    adm = admission(cfg(), {"coordinator_key": KEY.peer_id_b58})
    assert adm.enforced and not adm.admits(PEER) and adm.coordinator_key == KEY.peer_id


def test_open_without_a_key_or_when_turned_off_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert admission(cfg(), {"coordinator_key": None}).admits(PEER)
        assert admission(cfg(require_admission=False), {"coordinator_key": KEY.peer_id_b58}).admits(PEER)
    assert caplog.text.count("admits any peer") == 2


def test_a_bad_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        admission(cfg(), {"coordinator_key": "not-a-peer-id"})
