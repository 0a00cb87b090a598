"""Verified credit across a restart: receipts received before it still back a lease after it,
and the run's receipt-backed step (what bounds heartbeat steps) is rebuilt from the store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from distronet.coordinator.app import CoordinatorApp
from distronet.coordinator.config import CoordinatorConfig
from distronet.coordinator.local import local_coordinator
from distronet.coordinator.store import open_store
from distronet.node.daemon.coordinator_client import CoordinatorClient, sign_receipt
from distronet.protocol.coordinator_api import CREATE_RUN
from distronet.protocol.identity import Identity


async def test_receipts_back_a_lease_across_a_restart(
    store_url: str, tmp_path: Path, spec_factory: Callable[..., dict[str, Any]]
) -> None:
    cfg = CoordinatorConfig(db=store_url, operator_token="t", data_dir=str(tmp_path))
    a, b = Identity.generate(), Identity.generate()
    spec = spec_factory(shards=3)
    spec["credit"] = {"min_steps": 1, "step_slack": 4, "max_step_rate": 0}
    app = CoordinatorApp(cfg, open_store(store_url))
    async with local_coordinator(cfg, app) as lc:
        app.svc.create_run(CREATE_RUN.validate(spec))
        async with CoordinatorClient(lc.url, "r1", a) as ca, CoordinatorClient(lc.url, "r1", b) as cb:
            await ca.join()
            await cb.join()
            (lease,) = await ca.lease()
            await cb.submit_receipts([sign_receipt(b, "r1", 30, a.peer_id_b58, "11" * 32)])

    app = CoordinatorApp(cfg, open_store(store_url))
    async with local_coordinator(cfg, app) as lc:
        async with CoordinatorClient(lc.url, "r1", a) as ca:
            hb = await ca.heartbeat(2**40)
            assert hb is not None and hb["step"] == 34  # receipt step 30 + slack 4, not the claim
            assert (await ca.complete(lease) or {})["credited"] is True
            (again,) = await ca.lease()
            assert (await ca.complete(again) or {})["credited"] is False  # step 30 is spent
        assert app.svc.runs["r1"].nodes[a.peer_id_b58].tokens == 100
