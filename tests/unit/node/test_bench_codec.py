"""`distro-node bench codec`: the measurement rows on a tiny tensor set, and the table."""

from __future__ import annotations

import argparse
import dataclasses

import torch

from distronet.kernels.coding import IndexCoding, ValueCoding
from distronet.node.bench import codec
from distronet.node.bench.codec_run import measure
from distronet.node.bench.codec_tensors import big_matrix

REQUIRED = {
    "config",
    "bits_per_coefficient",
    "bits_per_param",
    "encode_ms",
    "decode_ms",
    "ref_encode_ms",
    "ref_decode_ms",
    "decode_16_over_1",
}


def test_measure_rows_on_a_small_matrix() -> None:
    torch.set_num_threads(1)
    ts = big_matrix(128)
    codings = [(ValueCoding.FP32, IndexCoding.FIXED), (ValueCoding.SIGN1, IndexCoding.ENTROPY)]
    rows = [dataclasses.asdict(r) for r in measure(ts, 4, codings, repeats=1)]
    assert len(rows) == 2 and set(rows[0]) >= REQUIRED
    fp32, sign1 = rows
    assert fp32["coefficients"] == 4 * 4  # 4 chunks of 64 x 64, k = 4
    assert fp32["ref_bits_per_coefficient"] == 96.0  # int64 index + fp32 value
    # fp32 values decode exactly (as the reference does); 1-bit values are far smaller on the wire.
    assert fp32["rel_err_vs_ref"] < 1e-5
    assert sign1["bits_per_coefficient"] < fp32["bits_per_coefficient"] - 20
    assert all(r[k] > 0 for r in rows for k in ("encode_ms", "decode_ms", "ref_encode_ms", "ref_decode_ms"))
    table = codec._table(rows)
    assert "sign1/entropy" in table and "bits/coef" in table


def test_parser_registers_flags() -> None:
    parser = argparse.ArgumentParser()
    codec.add_parser(parser.add_subparsers())
    args = parser.parse_args(["codec", "--quick", "--json", "--threads", "1"])
    assert args.quick and args.json and args.threads == 1 and args.func is codec.run
