"""Bounded influence: the plan check, the non-finite guard, clipping, determinism (optim/robust.py,
optim/verify.py, packets.check_plan)."""

from __future__ import annotations

import numpy as np
import torch

from distronet.kernels.coding import ValueCoding, decode_payload, encode_payload, encode_tensor
from distronet.node.optim import packets, robust
from distronet.node.optim.aggregate import round_sums
from distronet.node.optim.config import UpdateRule, preset
from distronet.node.optim.update import apply_rule
from distronet.node.optim.verify import Guard
from distronet.protocol.errors import RejectCode
from distronet.protocol.identity import Identity
from distronet.protocol.packet import open_packet, seal_packet

CPU = torch.device("cpu")
CFG = preset("ours_k32")
PLANS = packets.make_plans([("h.w", (64, 64)), ("h.b", (64,)), ("head.w", (32, 64))], CFG)
DIGEST = packets.run_digest(PLANS)
SHAPES = [(p.layout.n_chunks, p.layout.chunk_numel) for p in PLANS]
IDENTS = [Identity.from_seed(bytes([i + 1]) * 32) for i in range(6)]


def _honest(i: int, step: int = 3, cfg: object = CFG) -> bytes:
    g = torch.Generator().manual_seed(100 + i)
    shared = torch.Generator().manual_seed(7)
    momenta = [
        torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=shared)
        + 0.5 * torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g)
        for p in PLANS
    ]
    return packets.build_packet(PLANS, momenta, cfg, step, IDENTS[i], DIGEST)[0]  # type: ignore[arg-type]


def _recode(
    frame: bytes, ident: Identity, f, coding: ValueCoding | None = None, drop_last: bool = False
) -> bytes:  # type: ignore[no-untyped-def]
    pkt = open_packet(frame, run_id=CFG.run_id, layout_digest=DIGEST)
    ex = CFG.extraction
    out = []
    tensors = decode_payload(pkt.payload, SHAPES).tensors()
    for t in tensors[:-1] if drop_last else tensors:
        plan = PLANS[t.tensor_id]
        vc = coding or (ex.dense_value_coding if plan.dense else ex.value_coding)
        out.append(
            encode_tensor(t.tensor_id, t.idx, f(t.val), plan.layout.chunk_numel, vc, ex.index_coding)[0]
        )
    return seal_packet(ident, CFG.run_id, pkt.step, DIGEST, encode_payload(out))


def _round(frames: dict[bytes, bytes], admitted: frozenset[bytes] | None = None) -> packets.DecodedRound:
    return packets.open_round(frames, PLANS, CFG, 3, DIGEST, CPU, admitted=admitted)


def test_off_plan_packets_are_rejected_with_their_own_code() -> None:
    frames = {IDENTS[i].peer_id: _honest(i) for i in range(3)}
    frames[IDENTS[3].peer_id] = _recode(_honest(3), IDENTS[3], lambda v: v, ValueCoding.FP32)
    frames[IDENTS[4].peer_id] = _recode(_honest(4), IDENTS[4], lambda v: v, drop_last=True)
    frames[IDENTS[5].peer_id] = _honest(5, cfg=preset("ours_k32", k=16))
    dec = _round(frames)
    assert dec.peers == tuple(sorted(IDENTS[i].peer_id for i in range(3)))
    assert dec.rejected == {IDENTS[i].peer_id: RejectCode.OFF_PLAN for i in (3, 4, 5)}


def test_unadmitted_signer_is_unknown_peer() -> None:
    frames = {IDENTS[i].peer_id: _honest(i) for i in range(4)}
    dec = _round(frames, admitted=frozenset(IDENTS[i].peer_id for i in range(3)))
    assert dec.rejected == {IDENTS[3].peer_id: RejectCode.UNKNOWN_PEER}


def _max_float_round() -> packets.DecodedRound:
    frames = {IDENTS[i].peer_id: _honest(i) for i in range(4)}
    bad = lambda v: np.where(v < 0, -3.4e38, 3.4e38).astype(np.float32)  # noqa: E731
    frames[IDENTS[4].peer_id] = _recode(_honest(4), IDENTS[4], bad)
    return _round(frames)


def test_max_float_packet_overflows_the_old_path_but_never_the_guarded_one() -> None:
    dec = _max_float_round()
    assert len(dec.peers) == 5  # finite values: the decoder accepts it
    old = [d / 5 for d in round_sums(dec, PLANS, CPU)]  # the old path: plain mean
    assert not robust.finite_sums(old)
    v = torch.zeros_like(old[2])  # the head's Adam second moment: poisoned, for good
    apply_rule(UpdateRule.ADAM, old[2], v=v, n=1)
    assert not bool(torch.isfinite(v).all())
    for combine in ("clip", "none", "trimmed_mean"):
        verdict, _ = Guard(preset("ours_k32", robust=combine).robust, PLANS).judge(dec)
        kept = robust.scaled_round(dec, verdict.keep, verdict.scales, b"")
        sums = round_sums(kept, PLANS, CPU)
        if combine != "none":
            assert IDENTS[4].peer_id in verdict.dropped
            assert robust.finite_sums(sums)


def test_optimizer_weights_stay_finite_under_a_max_float_packet() -> None:
    from distronet.node.exchange.base import Round
    from distronet.node.optim.distro import DistroOptimizer
    from distronet.node.optim.roles import Role

    for combine in ("none", "clip"):
        cfg = preset("ours_k32", robust=combine)
        dec_frames = {IDENTS[i].peer_id: _honest(i) for i in range(4)}
        bad = lambda v: np.where(v < 0, -3.4e38, 3.4e38).astype(np.float32)  # noqa: E731
        dec_frames[IDENTS[4].peer_id] = _recode(_honest(4), IDENTS[4], bad)
        torch.manual_seed(0)
        params = [
            torch.nn.Parameter(torch.randn(64, 64)),
            torch.nn.Parameter(torch.randn(64)),
            torch.nn.Parameter(torch.randn(32, 64)),
        ]
        named = list(zip(["h.w", "h.b", "head.w"], params, strict=True))

        class _Ex:
            peer_id = IDENTS[5].peer_id

        roles = {"h.w": Role.HIDDEN, "h.b": Role.VECTOR, "head.w": Role.HEAD}
        opt = DistroOptimizer(named, cfg, _Ex(), IDENTS[5], roles=roles)  # type: ignore[arg-type]
        opt._apply(Round(3, dec_frames), lookahead=False)
        assert all(bool(torch.isfinite(p).all()) for p in params), combine
        rep = opt.reports[-1]
        assert IDENTS[4].peer_id not in rep.combined and IDENTS[4].peer_id not in rep.credited


def test_clipping_bounds_a_scaled_packet() -> None:
    frames = {IDENTS[i].peer_id: _honest(i) for i in range(5)}
    frames[IDENTS[5].peer_id] = _recode(_honest(5), IDENTS[5], lambda v: -1e6 * v)
    dec = _round(frames)
    cfg = preset("ours_k32", robust_drop_multiple=1e12).robust  # only the clip bounds it
    verdict, _ = Guard(cfg, PLANS).judge(dec)
    norms = robust.packet_norms(dec.flats)
    med = robust.median(norms)
    j = dec.peers.index(IDENTS[5].peer_id)
    assert verdict.scales[verdict.keep.index(j)] * norms[j] <= cfg.clip_multiple * med * (1 + 1e-6)
    assert verdict.flagged[IDENTS[5].peer_id] == "norm"
    honest = torch.cat(
        [
            d.flatten()
            for d in round_sums(
                robust.scaled_round(dec, [i for i in range(6) if i != j], [1.0] * 5, b""), PLANS, CPU
            )
        ]
    )
    clipped = torch.cat(
        [
            d.flatten()
            for d in round_sums(robust.scaled_round(dec, verdict.keep, verdict.scales, b""), PLANS, CPU)
        ]
    )
    plain = torch.cat([d.flatten() for d in round_sums(dec, PLANS, CPU)])
    cos = torch.nn.functional.cosine_similarity
    assert float(cos(plain, honest, dim=0)) < 0  # one packet steers the plain mean
    assert float(cos(clipped, honest, dim=0)) > 0.5


def test_replicas_stay_bit_identical_under_attack_without_shared_rounds() -> None:
    from distronet.node.bench.hostile_run import HostileSetting, run_attack

    row = run_attack("sign_flip", HostileSetting(steps=8), share_rounds=False, keep_models=True)
    models = row.pop("_models")
    ref = [p.detach() for p in models[0].parameters()]
    for m in models[1:7]:
        for a, b in zip(ref, m.parameters(), strict=True):
            assert torch.equal(a, b.detach())


def _copy_rounds(victim_of: object, steps: int) -> Guard:  # type: ignore[no-untyped-def]
    """Peers 0-4 honest, peer 5 re-signs ``victim_of(step)``'s packet each round; the guard judges
    and settles every round as the optimizer does."""
    guard = Guard(CFG.robust, PLANS)
    for step in range(steps):
        frames = {IDENTS[i].peer_id: _honest(i, step) for i in range(5)}
        frames[IDENTS[5].peer_id] = _recode(frames[IDENTS[victim_of(step)].peer_id], IDENTS[5], lambda v: v)  # type: ignore[operator]
        dec = packets.open_round(frames, PLANS, CFG, step, DIGEST, CPU)
        verdict, _ = guard.judge(dec)
        combined = [dec.peers[i] for i in verdict.keep]
        guard.settle(verdict, step, [p for p in verdict.credited(dec.peers) if p in combined], combined)
    guard.flush()
    return guard


def _credits(guard: Guard) -> dict[bytes, int]:
    out = dict.fromkeys((i.peer_id for i in IDENTS), 0)
    for _, peers in guard.final_credit:
        for p in peers:
            out[p] += 1
    return out


def test_a_rotating_copier_is_neutralised_and_its_victims_keep_their_credit() -> None:
    steps = 12
    guard = _copy_rounds(lambda step: step % 5, steps)
    copier = IDENTS[5].peer_id
    w = CFG.robust.credit_delay
    assert guard.copiers == {copier: w // 2} and guard.neutralised[copier] == w // 2
    credit = _credits(guard)
    assert credit[copier] == 0
    assert all(credit[IDENTS[i].peer_id] == steps for i in range(5)), credit  # no copied round lost


def test_a_copier_bound_to_one_victim_is_not_told_apart() -> None:
    steps = 10
    guard = _copy_rounds(lambda step: 0, steps)
    credit = _credits(guard)
    assert not guard.copiers and not guard.neutralised  # symmetric pair: neither is evicted
    assert credit[IDENTS[5].peer_id] == 0 and credit[IDENTS[0].peer_id] == 0  # both forfeit
    assert all(credit[IDENTS[i].peer_id] == steps for i in range(1, 5))
