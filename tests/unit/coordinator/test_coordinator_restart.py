"""A whole coordinator over each store backend: serve, stop, start again, carry on."""

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


async def test_state_survives_a_restart_on_either_backend(
    store_url: str, tmp_path: Path, spec_factory: Callable[..., dict[str, Any]]
) -> None:
    cfg = CoordinatorConfig(db=store_url, operator_token="t", data_dir=str(tmp_path))
    a, b = Identity.generate(), Identity.generate()
    app = CoordinatorApp(cfg, open_store(store_url))
    async with local_coordinator(cfg, app) as lc:
        app.svc.create_run(CREATE_RUN.validate(spec_factory(shards=5)))
        async with CoordinatorClient(lc.url, "r1", a) as ca, CoordinatorClient(lc.url, "r1", b) as cb:
            await ca.join()
            await cb.join()
            (done,) = await ca.lease()
            assert (await ca.complete(done) or {})["credited"]
            (open_lease,) = await ca.lease()
            await cb.submit_receipts([sign_receipt(b, "r1", 1, a.peer_id_b58, "11" * 32)])

    app = CoordinatorApp(cfg, open_store(store_url))
    async with local_coordinator(cfg, app) as lc:
        async with CoordinatorClient(lc.url, "r1", a) as ca:
            await ca.renew(open_lease)  # the lease continues with its token
            assert (await ca.complete(done) or {})["credited"] is False  # never credited twice
            assert (await ca.complete(open_lease) or {})["credited"] is True
            run = await ca.get_run()
        node = app.svc.runs["r1"].nodes[a.peer_id_b58]
        assert (node.tokens, node.shards, node.steps) == (200, 2, 1)
        assert run["progress"]["done"] == 2 and run["progress"]["peers_total"] == 2
