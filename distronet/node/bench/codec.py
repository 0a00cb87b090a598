"""`distro-node bench codec`: our codec against the DeMo reference, same tensors, one process.

For k in {4, 32}, every value coding (fp32, fp16, bf16, int8, sign1) and both index codings
(fixed, entropy), on (a) the real momentum of the built-in GPT after a few dozen DeMo-style
steps and (b) a big fp32 matrix (4096 x 4096; 1024 x 1024 with ``--quick``). Reports bits per
transmitted coefficient and per parameter on the wire (the whole signed, zstd-framed packet),
encode/decode milliseconds for ours and the reference, and decode 16 packets / decode 1.
What each timing covers is in :mod:`distronet.node.bench.codec_run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from distronet.node.exitcodes import ExitCode

__all__ = ["add_parser", "run"]

KS = (4, 32)
QUICK_CODINGS = {("fp32", "fixed"), ("int8", "entropy"), ("sign1", "entropy")}


def _table(rows: list[dict[str, object]]) -> str:
    cols = [
        ("config", "config", "{}"),
        ("bits/coef", "bits_per_coefficient", "{:.2f}"),
        ("bits/param", "bits_per_param", "{:.3f}"),
        ("enc ms", "encode_ms", "{:.1f}"),
        ("dec ms", "decode_ms", "{:.1f}"),
        ("ref enc", "ref_encode_ms", "{:.1f}"),
        ("ref dec", "ref_decode_ms", "{:.1f}"),
        ("speedup", "speedup", "{:.2f}x"),
        ("dec16/dec1", "decode_16_over_1", "{:.2f}"),
        ("kern dec16/1", "kernel_decode_16_over_1", "{:.2f}"),
        ("rel err", "rel_err_vs_ref", "{:.3f}"),
    ]
    cells = [[h for h, _, _ in cols]] + [[f.format(r[key]) for _, key, f in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``). Exit code per ExitCode.

    torch's OpenMP workers get a node's ``train.omp_spincount`` (unless the environment sets
    ``GOMP_SPINCOUNT``), so the figures are those of a node's decode."""
    from distronet.node.config import TrainConfig

    os.environ.setdefault("GOMP_SPINCOUNT", str(TrainConfig().omp_spincount))  # before torch loads
    import torch

    from distronet.kernels.coding import IndexCoding, ValueCoding
    from distronet.node.bench.codec_run import measure
    from distronet.node.bench.codec_step import step_share
    from distronet.node.bench.codec_tensors import big_matrix, gpt_momentum, llama_model, llama_momentum

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    steps = args.steps if args.steps is not None else (3 if args.quick else 30)
    size = args.size if args.size is not None else (512 if args.quick else 4096)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    dec_repeats = args.decode_repeats if args.decode_repeats is not None else (1 if args.quick else 9)
    codings = [(vc, ic) for vc in ValueCoding for ic in IndexCoding]
    if args.quick:  # the headline codings only
        codings = [c for c in codings if (c[0].name.lower(), c[1].name.lower()) in QUICK_CODINGS]
    load_before = os.getloadavg()[0]
    sets = []
    if args.model in ("gpt", "both"):
        sets.append(gpt_momentum(steps, chunk=args.chunk))
    if args.model in ("llama", "both"):
        sets.append(llama_momentum(steps, chunk=args.chunk))
    sets.append(big_matrix(size, chunk=args.chunk))
    rows = [
        dataclasses.asdict(r)
        for ts in sets
        for k in KS
        for r in measure(ts, k, codings, repeats, dec_repeats)
    ]
    step_rows = []
    if args.model in ("llama", "both") and not args.no_step:
        step_rows = [dataclasses.asdict(r) for r in step_share("llama", llama_model(), steps=max(repeats, 1))]
    if args.json:
        print(json.dumps(rows + step_rows, indent=1))
        return int(ExitCode.OK)
    print(
        f"distro-node bench codec: chunk {args.chunk}, {repeats} repeats (medians; decode 1 / 16: "
        f"{max(repeats, dec_repeats)}), "
        f"{args.threads} torch threads, {time.perf_counter() - t0:.0f} s, "
        f"load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after on {os.cpu_count()} CPUs"
    )
    for ts in sets:
        print(f"\n{ts.name}: {len(ts.tensors)} tensors, {ts.numel:,} parameters")
        print(_table([r for r in rows if r["tensors"] == ts.name]))
    for r in step_rows:
        print(
            f"\n{r['config']}: {r['params']:,} parameters, {r['tensors']} tensors, {r['tokens_per_step']} "
            f"tokens a step: step {r['step_ms']:.0f} ms (forward + backward {r['train_ms']:.0f} ms), codec "
            f"{r['codec_ms']:.1f} ms (encode {r['encode_ms']:.1f}, decode {r['decode_ms']:.1f}) = "
            f"{100 * r['codec_share']:.1f} % of the step (medians of {r['steps']})"
        )
    print(
        "\nwire = the whole signed step packet after zstd; ref = DeMo (einsum DCT, int64 + fp32, no "
        "signature, no zstd).\nspeedup = (ref enc + ref dec) / (enc + dec); rel err = |ours - ref| / |ref| "
        "of the decoded tensor (quantisation error)."
    )
    return int(ExitCode.OK)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `distro-node bench codec`."""
    p = sub.add_parser("codec", help="codec bits and speed against the DeMo reference")
    p.add_argument(
        "--quick", action="store_true", help="small tensors, one repeat, headline codings only (< 30 s)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of result objects")
    p.add_argument(
        "--model",
        choices=("gpt", "llama", "both"),
        default="both",
        help="whose real momentum: the built-in GPT, the ~5.3M-parameter Llama (arch = hf), or both",
    )
    p.add_argument("--no-step", action="store_true", help="skip the codec's share of a Llama training step")
    p.add_argument("--chunk", type=int, default=64, help="DCT chunk size s (default 64)")
    p.add_argument("--steps", type=int, default=None, help="GPT training steps before the snapshot")
    p.add_argument("--size", type=int, default=None, help="side of the square fp32 matrix")
    p.add_argument("--repeats", type=int, default=None, help="timing repeats (median reported)")
    p.add_argument(
        "--decode-repeats",
        type=int,
        default=None,
        help="samples of the 1- and 16-packet decodes behind decode_16_over_1 (default 9, >= --repeats)",
    )
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.set_defaults(func=run)


if __name__ == "__main__":  # pragma: no cover
    ns = argparse.ArgumentParser()
    add_parser(ns.add_subparsers())
    sys.exit(run(ns.parse_args(["codec", *sys.argv[1:]])))
