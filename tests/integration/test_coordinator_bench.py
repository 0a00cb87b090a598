"""`distro-node bench coordinator` end to end, tiny: a real coordinator process, sessions and
signatures, every figure the benchmark doc quotes present and no request failing."""

from __future__ import annotations

import argparse

import pytest

from distronet.node.bench.coordinator import TOKEN, run_bench

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("auth", ["session", "signature"])
async def test_the_bench_runs_clean(auth: str) -> None:
    args = argparse.Namespace(
        url=None, operator_token=TOKEN, db=None, sqlite_sync="NORMAL", duration=1.0, warmup=0.2,
        rate=100.0, concurrency=4, peers=5, shards=50, auth=auth, json=True,
    )  # fmt: skip
    out = await run_bench(args)
    assert out["errors"] == 0 and out["requests"] >= 90, out
    assert out["auth"] == auth and out["mix"]["heartbeat"] > 0 and out["mix"]["lease"] > 0
    assert out["server_cpu_us_per_request"] > 0 and out["commits"] > 0
    for key in ("requests_per_second", "p99_ms", "generator_cpu_us_per_request", "commit_ms_mean"):
        assert out[key] is not None, key
