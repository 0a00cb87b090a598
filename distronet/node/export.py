"""`distro-node export RUN_FILE CHECKPOINT OUT`: a node's checkpoint as a Hugging Face folder.

Reads the run file's ``id`` and ``[model]`` table (``model.hf`` a table or a ``config.json`` in the
run's folder, as the coordinator reads it), the node's checkpoint (``daemon/checkpoint.py``:
safetensors, checked, refused when it belongs to another run), builds the run's model, loads the
checkpoint's parameters into it and writes ``OUT`` with transformers' own ``save_pretrained``:
``config.json``, ``generation_config.json``, ``model.safetensors`` (sharded with an index past
5 GB). With ``--tokenizer tokenizer.json`` (the file ``data prepare`` wrote beside the shards) the
tokenizer files too, with the EOS token the data put between documents (``--eos-token``, default
the first of ``data.tokenizer.EOS_NAMES`` the tokenizer has, as ``data prepare`` picks it).
What it writes loads with ``AutoModelForCausalLM.from_pretrained(OUT)`` and
``AutoTokenizer.from_pretrained(OUT)``.

Only ``arch = "hf"`` models export; the built-in GPT (``arch = "gpt"``) is refused with a message
saying so (its layout is not mapped onto GPT-2's yet). Exit codes: 0 written; 2 (usage) for a run
file, model or tokenizer this cannot export; 1 for a checkpoint that is missing or refused.
Exporting the swarm's current state from a live node is not built: export the node's checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import tomllib

from distronet.node.data.tokenizer import EOS_NAMES
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
    p.add_argument("--tokenizer", type=Path, help="tokenizer.json (from data prepare) to include")
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
