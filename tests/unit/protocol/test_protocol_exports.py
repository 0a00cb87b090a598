"""The public surface of distronet.protocol is explicit: every __all__ name exists, and the
names other packages rely on (notes/kernel_api.md) stay exported."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "identity", "limits", "layout", "framing", "packet", "announce", "errors", "manifest", "pull",
    "manifest_ask", "digest", "state", "membership",
]  # fmt: skip
REQUIRED = {
    "identity": {"Identity", "IdentityError", "verify", "peer_id_from_b58", "peer_id_to_b58"},
    "limits": {"Limits", "DEFAULT_LIMITS"},
    "layout": {"layout_digest"},
    "packet": {"StepPacket", "seal_packet", "open_packet"},
    "announce": {"Announcement", "seal_announcement", "open_announcement"},
    "framing": {"EncodeError", "MessageKind"},
}


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name: str) -> None:
    mod = importlib.import_module(f"distronet.protocol.{name}")
    assert all(hasattr(mod, n) for n in mod.__all__)
    assert REQUIRED.get(name, set()) <= set(mod.__all__)
