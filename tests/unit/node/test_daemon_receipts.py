"""The daemon signs a receipt for each other producer a round credited, and sends them in batches."""

from __future__ import annotations

import asyncio
import hashlib
import types
from typing import Any

from distronet.node.daemon import loops
from distronet.node.optim.distro import StepReport
from distronet.protocol import identity as ident
from distronet.protocol.coordinator_api import b64decode_sig, receipt_message
from distronet.protocol.identity import Identity


def parts_for(me: Identity) -> Any:
    sent: list[list[dict[str, Any]]] = []

    async def submit(batch: list[dict[str, Any]]) -> None:
        sent.append(batch)

    client = types.SimpleNamespace(submit_receipts=submit)
    return types.SimpleNamespace(
        identity=me, cfg=types.SimpleNamespace(run_id="r1"), receipts=[], client=client, sent=sent
    )


def report(step: int, credited: list[Identity], accepted: list[Identity]) -> StepReport:
    return StepReport(
        step, 0.1, tuple(a.peer_id for a in accepted), {}, True,
        credited=tuple(c.peer_id for c in credited),
        frame_sha256={c.peer_id: hashlib.sha256(c.peer_id).digest() for c in credited},
    )  # fmt: skip


def test_receipts_only_for_other_credited_producers_and_they_verify() -> None:
    me, a, b, flagged = (Identity.generate() for _ in range(4))
    parts = parts_for(me)
    loops._queue_receipts(parts, report(7, [a, me, b], [a, me, b, flagged]))
    assert [r["producer"] for r in parts.receipts] == [a.peer_id_b58, b.peer_id_b58]
    for r, who in zip(parts.receipts, (a, b), strict=True):
        assert r["acceptor"] == me.peer_id_b58 and r["step"] == 7
        assert r["payload_sha256"] == hashlib.sha256(who.peer_id).hexdigest()
        msg = receipt_message("r1", 7, r["producer"], r["payload_sha256"])
        assert ident.verify(me.peer_id, msg, b64decode_sig(r["signature"]))


def test_receipts_are_capped_and_sent_in_batches() -> None:
    me, a = Identity.generate(), Identity.generate()
    parts = parts_for(me)
    for step in range(loops.MAX_RECEIPTS + 10):
        parts.receipts.append({"step": step})
    loops._queue_receipts(parts, report(99_999, [a], [a]))
    assert len(parts.receipts) == loops.MAX_RECEIPTS
    assert parts.receipts[0]["step"] == 11 and parts.receipts[-1]["step"] == 99_999
    asyncio.run(loops.send_receipts(parts))
    assert len(parts.sent) == 1 and len(parts.sent[0]) == loops.RECEIPT_BATCH
    assert len(parts.receipts) == loops.MAX_RECEIPTS - loops.RECEIPT_BATCH
