"""`distro-node bench hostile`: the JSON rows carry the required keys and meet the issue's bounds
(a short run: every honest peer's credit within 5 % of the clean run's, the hostile's 0)."""

from __future__ import annotations

import math

from distronet.node.bench.hostile_run import QUICK, run_all

KEYS = {
    "attack",
    "val_loss",
    "clean_val_loss",
    "nonfinite_applied",
    "neutralised_at_step",
    "hostile_credit",
    "honest_credit",
    "verify_cost_share",
}


def test_quick_rows_have_the_keys_and_meet_the_bounds() -> None:
    attacks = (
        "none",
        "max_float",
        "off_plan",
        "ground_leader_key",
        "copy",
        "stale_replay",
        "copy_one_victim",
    )
    rows = run_all(QUICK, attacks=attacks)
    assert [r["attack"] for r in rows] == list(attacks)
    assert "plain_mean_val_loss" in rows[0]
    for r in rows:
        assert set(r) >= KEYS, r["attack"]
        assert not r["nonfinite_applied"]
        assert math.isfinite(r["val_loss"]) and r["val_loss"] <= 1.02 * r["clean_val_loss"], r
        assert r["honest_credit"] >= 0.95 * rows[0]["honest_credit"]
        if r["attack"] != "none":
            assert r["hostile_credit"] == 0
            assert r["detected_at_step"] is not None and r["detected_at_step"] <= 50
    assert rows[2]["rejected_as"] == ["OFF_PLAN"] and rows[3]["rejected_as"] == ["UNKNOWN_PEER"]
    assert rows[4]["neutralised_at_step"] is not None  # the rotating copier; its victims keep credit
    assert rows[6]["neutralised_at_step"] is None  # a bound copier: found by the data audit, credit only
    assert rows[5]["rejected_as"] == ["STALE_STEP"]  # its genuine step-0 packet earns nothing either
    assert abs(rows[0]["plain_mean_val_loss"] - rows[0]["val_loss"]) <= 0.005 * rows[0]["plain_mean_val_loss"]
