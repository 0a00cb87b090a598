"""`bench codec` of two source trees side by side, on one fixed tensor set, alternating.

    python tools/codec_ab.py WORK_DIR OLD_TREE [RUNS]

Makes the tensors once (the default GPT's momentum after 30 DeMo-style steps, computed on one
thread so the bits are reproducible, and the 4096 x 4096 matrix) and saves them as one ``.npz``
(read back with ``allow_pickle=False``) in ``WORK_DIR``. Then runs ``RUNS`` (default 5) rounds:
each measures ``OLD_TREE`` and this tree (old first in even rounds, new first in odd ones), each
in a fresh process with that tree first on ``PYTHONPATH``, with that tree's own
``codec_run.measure`` (3 repeats; 9 decode samples as ``bench codec`` takes, 25 on the GPT set)
over the same tensors.
Both trees get the same ``GOMP_SPINCOUNT``.

Prints, per row (tensor set, k, value/index coding): the median over rounds of encode, decode
and 16-packet decode ms for old and new, the median over rounds of each round's new/old, and
the bits per coefficient of each (equal tensors and, in each child, the same seeded signing
keys: equal bits when the encoder is unchanged). ``--json`` on the end prints the rows as JSON.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SPIN = "2000"  # a node's default train.omp_spincount; the same for both trees
MOMENTUM_STEPS, MATRIX_SIDE, CHUNK = 30, 4096, 64


def make_tensors(work: Path) -> Path:
    """The two tensor sets, saved once (skipped when the file is there)."""
    path = work / "codec-tensors.npz"
    if path.exists():
        return path
    import numpy as np
    import torch

    from distronet.node.bench.codec_tensors import big_matrix, gpt_momentum

    torch.set_num_threads(1)  # one thread: the same momentum on every run of this tool
    out = {}
    for prefix, ts in (("m.", gpt_momentum(MOMENTUM_STEPS, chunk=CHUNK)), ("w.", big_matrix(MATRIX_SIDE))):
        out.update({prefix + n: t.numpy() for n, t in zip(ts.names, ts.tensors, strict=True)})
    np.savez(path, **out)
    return path


def _seeded_identities() -> None:
    """Make ``Identity.generate`` deterministic (seeds 0, 1, 2, ... in call order) in this child:
    a packet's signature and peer id are part of what zstd compresses, so fresh random keys move a
    frame by a few bytes from run to run; with the same keys in both trees, an unchanged encoder
    gives byte-identical frames and exactly equal bits."""
    import hashlib
    import itertools

    from distronet.protocol.identity import Identity

    counter = itertools.count()

    def generate(cls: type[Identity]) -> Identity:
        return cls.from_seed(hashlib.sha256(b"codec_ab %d" % next(counter)).digest())

    Identity.generate = classmethod(generate)  # type: ignore[method-assign,assignment]


def child(path: str) -> None:
    """Measure the tree first on ``sys.path`` over the saved tensors; JSON rows to stdout."""
    import dataclasses

    import numpy as np
    import torch

    from distronet.kernels.coding import IndexCoding, ValueCoding
    from distronet.node.bench.codec import KS
    from distronet.node.bench.codec_run import measure
    from distronet.node.bench.codec_tensors import _make_set

    torch.set_num_threads(2)
    _seeded_identities()
    with np.load(path, allow_pickle=False) as z:
        saved = {n: torch.from_numpy(z[n].copy()) for n in z.files}
    sets = [
        _make_set(name, [(n[2:], t) for n, t in saved.items() if n.startswith(prefix)], CHUNK)
        for prefix, name in (("m.", f"gpt-momentum({MOMENTUM_STEPS} steps)"), ("w.", "randn"))
    ]
    codings = [(vc, ic) for vc in ValueCoding for ic in IndexCoding]
    # 9 decode samples as `bench codec` takes; 25 for the GPT set, whose 4-ms decodes a busy
    # second core moves by more than the 5 % this tool is asked to resolve (cost: ~4 s a child)
    samples = {sets[0].name: 25}
    rows = [
        dataclasses.asdict(r)
        for ts in sets
        for k in KS
        for r in measure(ts, k, codings, 3, samples.get(ts.name, 9))
    ]
    print(json.dumps(rows))


def measure_tree(tree: Path, tensors: Path) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "GOMP_SPINCOUNT": SPIN}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(tensors)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 0
    as_json = argv[-1:] == ["--json"]
    argv = argv[:-1] if as_json else argv
    work, old = Path(argv[0]), Path(argv[1]).resolve()
    runs = int(argv[2]) if len(argv) > 2 else 5
    work.mkdir(parents=True, exist_ok=True)
    tensors = make_tensors(work)
    got: dict[str, list[list[dict[str, object]]]] = {"old": [], "new": []}
    for i in range(runs):
        order = [("old", old), ("new", HERE)] if i % 2 == 0 else [("new", HERE), ("old", old)]
        for label, tree in order:
            got[label].append(measure_tree(tree, tensors))
            print(f"round {i + 1}/{runs}: {label} done", file=sys.stderr)
    table = []
    for j, row in enumerate(got["new"][0]):

        def med(label: str, key: str, j: int = j) -> float:
            return statistics.median(float(run[j][key]) for run in got[label])  # type: ignore[arg-type]

        def med16(label: str, j: int = j) -> float:
            return statistics.median(
                float(r[j]["decode_ms"]) * float(r[j]["decode_16_over_1"])  # type: ignore[arg-type]
                for r in got[label]
            )

        def paired(key: str, j: int = j) -> float:
            """Median over rounds of that round's new / old (the two children ran back to back,
            so drift of the machine between rounds cancels)."""

            def ms(r: list[dict[str, object]]) -> float:
                if key == "decode16_ms":
                    return float(r[j]["decode_ms"]) * float(r[j]["decode_16_over_1"])  # type: ignore[arg-type]
                return float(r[j][key])  # type: ignore[arg-type]

            return statistics.median(ms(n) / ms(o) for n, o in zip(got["new"], got["old"], strict=True))

        assert got["old"][0][j]["config"] == row["config"], "the two trees' rows differ"
        entry: dict[str, object] = {"config": row["config"]}
        for key in ("encode_ms", "decode_ms"):
            entry[f"old_{key}"], entry[f"new_{key}"] = med("old", key), med("new", key)
        entry["old_decode16_ms"], entry["new_decode16_ms"] = med16("old"), med16("new")
        for key in ("encode_ms", "decode_ms", "decode16_ms"):
            entry[f"ratio_{key}"] = paired(key)
        for key in ("bits_per_coefficient", "wire_bytes"):
            entry[f"old_{key}"], entry[f"new_{key}"] = med("old", key), med("new", key)
        table.append(entry)
    if as_json:
        print(json.dumps(table, indent=1))
        return 0
    print(
        f"{runs} rounds, old = {old}, new = {HERE}; new's median over rounds, ms; "
        "ratio = median over rounds of new / old in that round"
    )
    head = f"{'row':<46} {'enc':>15} {'dec':>15} {'dec 16':>15} {'bits/coef':>15}"
    print(head + "\n" + "-" * len(head))
    for e in table:
        cells = []
        for key in ("encode_ms", "decode_ms", "decode16_ms"):
            n, ratio = float(e[f"new_{key}"]), float(e[f"ratio_{key}"])  # type: ignore[arg-type]
            cells.append(f"{n:7.2f} {ratio:6.3f}x")
        ob, nb = float(e["old_bits_per_coefficient"]), float(e["new_bits_per_coefficient"])  # type: ignore[arg-type]
        cells.append(f"{nb:8.3f} {'=' if ob == nb else f'{nb / ob:.4f}x'}")
        print(f"{e['config']:<46} " + " ".join(f"{c:>15}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
