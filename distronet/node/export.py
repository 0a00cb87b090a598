"""`distro-node export RUN_FILE CHECKPOINT OUT`: a node's checkpoint as a Hugging Face folder.

Reads the run file's ``id`` and ``[model]`` table (``model.hf`` a table or a ``config.json`` in the
run's folder, as the coordinator reads it), the node's checkpoint (``daemon/checkpoint.py``:
safetensors, checked, refused when it belongs to another run), builds the run's model, loads the
checkpoint's parameters into it and writes ``OUT`` with transformers' own ``save_pretrained``:
``config.json``, ``generation_config.json``, ``model.safetensors`` (sharded with an index past
5 GB), and the tokenizer files with the EOS token the data put between documents
(``--eos-token``, default the first of ``data.tokenizer.EOS_NAMES`` the tokenizer has, as
``data prepare`` picks it). What it writes loads with ``AutoModelForCausalLM.from_pretrained(OUT)``
and ``AutoTokenizer.from_pretrained(OUT)``.

The tokenizer is the run's: its sha256 is the run file's manifest's ``tokenizer_sha256``
(``data.manifest``, a path beside the run file or the table), else the one the node recorded at
join (``<data-dir>/tokenizers/run-<id>.sha256``, ``data/tokenizer_fetch.py``), the data dir
being the checkpoint's folder. Without ``--tokenizer`` it is the node's verified copy
(``<data-dir>/tokenizers/<sha256>.json``), else the file beside the manifest, each used only
when it hashes to that sha256; ``--tokenizer FILE`` (the file ``data prepare`` wrote beside the
shards) is refused when it is not the run's. A run whose data names no tokenizer (byte-level)
exports without one unless ``--tokenizer`` is given.

Only ``arch = "hf"`` models export; the built-in GPT (``arch = "gpt"``) is refused with a message
saying so (its layout is not mapped onto GPT-2's yet). Exit codes: 0 written; 2 (usage) for a run
file, model or tokenizer this cannot export (the run's tokenizer not found, or another one
given); 1 for a checkpoint that is missing or refused.
Exporting the swarm's current state from a live node is not built: export the node's checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import tomllib

from distronet.node.data.errors import ManifestError
from distronet.node.data.manifest import Manifest, read_manifest
from distronet.node.data.tokenizer import EOS_NAMES
from distronet.node.data.tokenizer_fetch import bounded_sha256, cached_tokenizer, run_tokenizer_sha
from distronet.node.exitcodes import ExitCode
from distronet.protocol.errors import ConfigError

__all__ = ["ExportError", "add_parser", "export_checkpoint"]


class ExportError(ConfigError):
    """The run, its model or the tokenizer cannot be exported (the message says why)."""


def export_checkpoint(run_file: Path, checkpoint: Path, out: Path, tokenizer: Path | None = None,
                      eos_token: str | None = None) -> Path:  # fmt: skip
    """Write the Hugging Face folder ``out`` (module doc); returns it. Raises ``ExportError`` and
    ``CheckpointError`` (from ``daemon.checkpoint``)."""
    import torch

    from distronet.node.daemon.checkpoint import CheckpointError, load_checkpoint
    from distronet.node.models.build import build_model
    from distronet.node.models.spec import ModelSpec

    try:
        run = tomllib.loads(run_file.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ExportError(f"run file {run_file}: {e}") from e
    run_id, model = run.get("id"), run.get("model")
    if not isinstance(run_id, str) or not isinstance(model, dict):
        raise ExportError(f"run file {run_file}: needs an id and a [model] table")
    spec = ModelSpec.from_run(model, run_dir=run_file.parent)
    if spec.arch != "hf":
        raise ExportError(
            "the built-in GPT (arch = 'gpt') does not export to a Hugging Face folder yet: "
            "train an arch = 'hf' model to export it"
        )
    tokenizer = _run_tokenizer(run, run_file, checkpoint.parent, run_id, tokenizer)
    ckpt = load_checkpoint(checkpoint, run_id=run_id)
    if ckpt is None:
        raise CheckpointError(f"no checkpoint at {checkpoint}")
    net: Any = build_model(spec, torch.device("cpu"))
    try:
        net.load_state_dict(ckpt.model)
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(f"checkpoint {checkpoint} does not fit the run's model ({e})") from e
    net.eval()
    out.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(str(out), safe_serialization=True, max_shard_size="5GB")
    if tokenizer is not None:
        _save_tokenizer(tokenizer, out, eos_token, spec.vocab)
    return out


def _manifest_tokenizer(run: dict[str, Any], run_file: Path) -> tuple[str | None, Path | None]:
    """``(tokenizer_sha256, the tokenizer file beside the manifest)`` of the run file's manifest;
    ``(None, None)`` when it names none or its manifest file is not on this machine."""
    data = run.get("data")
    raw = data.get("manifest") if isinstance(data, dict) else None
    try:
        if isinstance(raw, str):
            path = run_file.parent / raw
            if not path.is_file():
                return None, None
            m = read_manifest(path)
            beside = path.parent / m.tokenizer_file if m.tokenizer_file is not None else None
            return m.tokenizer_sha256, beside
        if isinstance(raw, dict):
            return Manifest.from_json(raw).tokenizer_sha256, None
    except ManifestError as e:
        raise ExportError(f"run file {run_file}: {e}") from e
    return None, None


def _run_tokenizer(
    run: dict[str, Any], run_file: Path, data_dir: Path, run_id: str, given: Path | None
) -> Path | None:
    """The tokenizer file to export (module doc): ``given`` when it is the run's, else the
    node's verified copy or the file beside the manifest; None for a run without a tokenizer.
    Raises ``ExportError`` when the run names a tokenizer none of them is."""
    want, beside = _manifest_tokenizer(run, run_file)
    want = want or run_tokenizer_sha(data_dir, run_id)
    if given is not None:
        if want is not None and bounded_sha256(given) != want:
            raise ExportError(
                f"{given} is not the run's tokenizer (sha256 {want}); leave --tokenizer out to use "
                "the node's copy, or give the file data prepare wrote beside the shards"
            )
        return given
    if want is None:
        return None
    cached = cached_tokenizer(data_dir, want)
    if cached is not None:
        return cached
    if beside is not None and bounded_sha256(beside) == want:
        return beside
    raise ExportError(
        f"the run's tokenizer (sha256 {want}) is not in {data_dir / 'tokenizers'} (a node keeps it "
        "there once it has joined the run): give it with --tokenizer"
    )


def _save_tokenizer(path: Path, out: Path, eos_token: str | None, vocab: int) -> None:
    from transformers import PreTrainedTokenizerFast

    try:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
    except Exception as e:  # tokenizers raises a bare Exception for a file it cannot read
        raise ExportError(f"{path}: not a tokenizers JSON file ({e})") from e
    if len(tok) > vocab:
        raise ExportError(f"{path}: {len(tok)} tokens, more than the model's vocabulary ({vocab})")
    known = tok.get_vocab()
    eos = eos_token or next((n for n in EOS_NAMES if n in known), None)
    if eos is None or eos not in known:
        raise ExportError(f"{path}: no EOS token (give the one the data used with --eos-token)")
    tok.eos_token = eos
    tok.save_pretrained(str(out))


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "export", help="write a node's checkpoint as a Hugging Face folder (arch = 'hf' runs)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )  # fmt: skip
    p.add_argument("run_file", type=Path, help="the run's TOML file (its id and [model] table)")
    p.add_argument("checkpoint", type=Path, help="the node's <data-dir>/checkpoint.safetensors")
    p.add_argument("out", type=Path, help="the folder to write")
    p.add_argument(
        "--tokenizer", type=Path, help="tokenizer.json to include (default: the node's verified copy)"
    )
    p.add_argument("--eos-token", help="the EOS token the data put between documents")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from distronet.node.daemon.checkpoint import CheckpointError

    try:
        out = export_checkpoint(args.run_file, args.checkpoint, args.out, args.tokenizer, args.eos_token)
    except ConfigError as e:
        print(f"distro-node export: {e}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except CheckpointError as e:
        print(f"distro-node export: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
