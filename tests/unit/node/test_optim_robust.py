"""Bounded influence: the plan check, the non-finite guard, clipping, determinism (optim/robust.py,
optim/verify.py, packets.check_plan)."""

from __future__ import annotations

import numpy as np
import pytest
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
    held = [packets.to_momentum(p, m) for p, m in zip(PLANS, momenta, strict=True)]
    return packets.build_packet(PLANS, held, cfg, step, IDENTS[i], DIGEST)[0]  # type: ignore[arg-type]


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


def _momenta(i: int, step: int) -> list[torch.Tensor]:
    """Peer ``i``'s momentum at ``step`` (what ``_honest`` codes): a shared part plus its own."""
    g = torch.Generator().manual_seed(100 + i)
    shared = torch.Generator().manual_seed(7)
    return [
        torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=shared)
        + 0.5 * torch.randn(p.layout.n_chunks, p.layout.chunk_numel, generator=g)
        for p in PLANS
    ]


class _Auditor:
    """Peer i's leased-batch gradient: its own momentum back in parameter space, plus noise that
    changes every call (a batch is not its momentum). ``know``: the peers it can reproduce."""

    def __init__(self, know: set[int] | None = None, swap: bool = False) -> None:
        self.know, self.swap = know, swap
        self.index = {ident.peer_id: i for i, ident in enumerate(IDENTS)}
        self.noise = torch.Generator().manual_seed(99)
        self.calls = 0

    def gradients(self, peer: bytes, step: int) -> list[torch.Tensor] | None:
        from distronet.kernels.dct import idct_chunks

        self.calls += 1
        i = self.index[peer]
        if self.know is not None and i not in self.know:
            return None
        if self.swap and i in (0, 5):  # the copier trained on its victim's batch
            i = 5 - i
        out = []
        for plan, m in zip(PLANS, _momenta(i, step), strict=True):
            noisy = m + 2.0 * torch.randn(m.shape, generator=self.noise)
            out.append(idct_chunks(noisy, plan.layout).reshape(plan.layout.shape))
        return out


def _copy_rounds(victim_of: object, steps: int, auditor: _Auditor | None = None) -> Guard:  # type: ignore[no-untyped-def]
    """Peers 0-4 honest, peer 5 re-signs ``victim_of(step)``'s packet each round; the guard judges
    (audits, with ``auditor``) and settles every round as the optimizer does."""
    guard = Guard(CFG.robust, PLANS)
    for step in range(steps):
        frames = {IDENTS[i].peer_id: _honest(i, step) for i in range(5)}
        frames[IDENTS[5].peer_id] = _recode(frames[IDENTS[victim_of(step)].peer_id], IDENTS[5], lambda v: v)  # type: ignore[operator]
        dec = packets.open_round(frames, PLANS, CFG, step, DIGEST, CPU)
        verdict, gidx = guard.judge(dec)
        if auditor is not None and verdict.copies:
            guard.audit(dec, verdict, gidx, auditor)
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


def test_without_an_audit_a_copier_bound_to_one_victim_is_not_told_apart() -> None:
    steps = 10
    guard = _copy_rounds(lambda step: 0, steps)
    credit = _credits(guard)
    assert not guard.copiers and not guard.neutralised  # symmetric pair: neither is evicted
    assert credit[IDENTS[5].peer_id] == 0 and credit[IDENTS[0].peer_id] == 0  # both forfeit
    assert all(credit[IDENTS[i].peer_id] == steps for i in range(1, 5))


def test_the_data_audit_gives_a_bound_copiers_rounds_to_its_victim() -> None:
    steps, auditor = 16, _Auditor()
    guard = _copy_rounds(lambda step: 0, steps, auditor)
    victim, copier = IDENTS[0].peer_id, IDENTS[5].peer_id
    pv = guard.provenance
    assert list(pv.convicted) == [copier]
    decided = pv.convicted[copier]
    assert pv.cfg.min_rounds - 1 <= decided < pv.cfg.max_rounds
    assert pv.owner(frozenset({victim, copier})) == victim
    assert not guard.neutralised  # the sum never depended on it: credit only
    credit = _credits(guard)
    assert credit[copier] == 0
    assert all(credit[IDENTS[i].peer_id] == steps for i in range(5)), credit  # the victim lost nothing
    assert auditor.calls == 2 * (decided + 1)  # a decided pair is not audited again


def test_the_audit_follows_the_data_not_the_peer_id() -> None:
    """Had the 'copier' trained on the victim's batch (the auditor's answers swapped), the packet
    would be its own: the audit credits whoever's data made it, not whoever came first."""
    guard = _copy_rounds(lambda step: 0, 16, _Auditor(swap=True))
    assert list(guard.provenance.convicted) == [IDENTS[0].peer_id]


def test_an_audit_that_cannot_reproduce_a_batch_decides_nothing() -> None:
    auditor = _Auditor(know={1, 2, 3, 4, 5})  # peer 0's batch is out of reach
    guard = _copy_rounds(lambda step: 0, 30, auditor)
    assert not guard.provenance.convicted
    credit = _credits(guard)
    assert credit[IDENTS[5].peer_id] == 0 and credit[IDENTS[0].peer_id] == 0  # as without an audit


def test_an_undistinguishable_pair_is_given_up_not_decided() -> None:
    """Scores that are noise around each other (both gradients unrelated to the packet) never pass
    the t bound: after ``max_rounds`` audits the pair is given up, nobody convicted."""

    class Noise(_Auditor):
        def gradients(self, peer: bytes, step: int) -> list[torch.Tensor] | None:
            self.calls += 1
            return [torch.randn(p.layout.shape, generator=self.noise) for p in PLANS]

    auditor = Noise()
    guard = _copy_rounds(lambda step: 0, 40, auditor)
    pv = guard.provenance
    assert not pv.convicted
    assert [p.given_up for p in pv.pairs.values()] == [True]
    assert auditor.calls == 2 * pv.cfg.max_rounds


def test_audit_limits_are_checked() -> None:
    import pytest

    from distronet.node.optim.provenance import Audit
    from distronet.protocol.errors import ConfigError

    for bad in (dict(min_rounds=0), dict(min_rounds=5, max_rounds=4), dict(majority=0.5), dict(t_min=0.0)):
        with pytest.raises(ConfigError):
            Audit(**bad)  # type: ignore[arg-type]


def test_judging_a_round_never_calls_blas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Norms, copy checks and cosines sum in numpy's own pairwise order (``robust.fdot``), not
    through ``np.dot``: OpenBLAS would split long vectors over its threads (the sum's order then
    follows the core count, and replicas must agree) and leave them spinning on torch's cores."""
    frames = {IDENTS[i].peer_id: _honest(i) for i in range(5)}
    frames[IDENTS[5].peer_id] = _recode(frames[IDENTS[0].peer_id], IDENTS[5], lambda v: v)  # a copy
    dec = _round(frames)
    want = Guard(CFG.robust, PLANS).judge(dec)[0]

    def no_blas(*a: object, **k: object) -> None:
        raise AssertionError("np.dot called while judging a round")

    monkeypatch.setattr(np, "dot", no_blas)
    got = Guard(CFG.robust, PLANS).judge(dec)[0]
    assert got.keep == want.keep and got.scales == want.scales and got.flagged == want.flagged
    assert got.flagged  # the copy was seen
    norms = robust.packet_norms(dec.flats)
    v = dec.flats[0].val.astype(np.float64)
    assert abs(norms[0] - float(np.sqrt((v * v).sum()))) <= 1e-12 * norms[0]
