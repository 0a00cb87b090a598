"""`distro-node export`: a node's checkpoint of an ``arch = "hf"`` run becomes a folder that
transformers loads (``AutoModelForCausalLM``, ``AutoTokenizer``), with the node's loss; what it
cannot export is refused with a message and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distronet.node.cli import main
from distronet.node.daemon.checkpoint import Checkpoint, save_checkpoint
from distronet.node.daemon.trainer import param_digest
from distronet.node.data.tokenizer import train_bpe
from distronet.node.models.build import build_model, model_loss
from distronet.node.models.spec import ModelSpec

transformers = pytest.importorskip("transformers")

HF = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 300,
      "max_position_embeddings": 64, "tie_word_embeddings": False}  # fmt: skip
TEXT = ["the quick brown fox jumps over the lazy dog", "a volunteer donates a laptop to train one model"]


def _run(tmp_path: Path, model: dict[str, object]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(HF))
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in model.items())
    run = tmp_path / "run.toml"
    run.write_text(f'id = "r"\n[model]\n{lines}\n')
    return run


def _trained(spec: ModelSpec) -> torch.nn.Module:
    model = build_model(spec, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 300, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(3):  # a state unlike a fresh build's
        opt.zero_grad()
        model_loss(model, x[:, :-1], x[:, 1:]).backward()
        opt.step()
    return model


def test_an_hf_checkpoint_exports_to_a_folder_transformers_loads_with_the_same_loss(tmp_path: Path) -> None:
    run = _run(tmp_path, {"arch": "hf", "seed": 3, "seq_len": 16, "hf": "config.json"})
    spec = ModelSpec.from_run({"arch": "hf", "seed": 3, "seq_len": 16, "hf": HF})
    model = _trained(spec)
    ckpt = tmp_path / "checkpoint.safetensors"
    save_checkpoint(ckpt, Checkpoint("r", 3, param_digest(model), model.state_dict(), {}))
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(train_bpe(TEXT * 50, 280).data)  # as data prepare --train-tokenizer writes it
    out = tmp_path / "hf"
    assert main(["export", str(run), str(ckpt), str(out), "--tokenizer", str(tokenizer)]) == 0
    assert {"config.json", "generation_config.json", "model.safetensors"} <= {p.name for p in out.iterdir()}
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    x = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        ours, theirs = model_loss(model, x[:, :-1], x[:, 1:]), model_loss(loaded, x[:, :-1], x[:, 1:])
    assert abs(float(ours) - float(theirs)) <= 1e-4, (float(ours), float(theirs))
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in TEXT:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.eos_token == "<|endoftext|>"


def test_what_cannot_be_exported_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpt = _run(tmp_path, {"depth": 1, "width": 32, "heads": 2, "context": 16, "seq_len": 16})
    ckpt = tmp_path / "checkpoint.safetensors"
    assert main(["export", str(gpt), str(ckpt), str(tmp_path / "o")]) == 2
    assert "built-in GPT" in capsys.readouterr().err
    hf = _run(tmp_path, {"arch": "hf", "seq_len": 16, "hf": "config.json"})
    assert main(["export", str(hf), str(ckpt), str(tmp_path / "o")]) == 1  # no checkpoint there
    assert "no checkpoint" in capsys.readouterr().err
    save_checkpoint(ckpt, Checkpoint("other-run", 1, "", {}, {}))
    assert main(["export", str(hf), str(ckpt), str(tmp_path / "o")]) == 1
    assert "belongs to run" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_node_s_verified_tokenizer_is_exported_and_another_one_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose manifest names a tokenizer exports the node's verified copy
    (``<data-dir>/tokenizers/<sha256>.json``, the data dir being the checkpoint's folder) with no
    ``--tokenizer``; a ``--tokenizer`` that is not the run's, or none to be found, exit 2."""
    import hashlib

    from distronet.node.data.tokenizer_fetch import TOKENIZER_DIR

    run = _run(tmp_path, {"arch": "hf", "seed": 3, "seq_len": 16, "hf": "config.json"})
    theirs = train_bpe(TEXT * 50, 280).data
    sha = hashlib.sha256(theirs).hexdigest()
    (tmp_path / "data").mkdir()
    manifest = {"version": 2, "tokenizer": "hf", "dtype": "uint16", "vocab_size": 280, "eos_id": 0,
                "tokenizer_file": "tokenizer.json", "tokenizer_sha256": sha, "shards": []}  # fmt: skip
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    run.write_text(run.read_text() + '[data]\nmanifest = "data/manifest.json"\n')
    node_dir = tmp_path / "node"
    (node_dir / TOKENIZER_DIR).mkdir(parents=True)
    spec = ModelSpec.from_run({"arch": "hf", "seed": 3, "seq_len": 16, "hf": HF})
    model = build_model(spec, torch.device("cpu"))
    ckpt = node_dir / "checkpoint.safetensors"
    save_checkpoint(ckpt, Checkpoint("r", 3, param_digest(model), model.state_dict(), {}))
    out = tmp_path / "hf"
    # the run names a tokenizer the node has not (yet) and the manifest's folder lacks: said so
    assert main(["export", str(run), str(ckpt), str(out)]) == 2
    assert f"sha256 {sha}) is not in {node_dir / TOKENIZER_DIR}" in capsys.readouterr().err
    # the node's copy (as it fetched it at join) is what is exported
    (node_dir / TOKENIZER_DIR / f"{sha}.json").write_bytes(theirs)
    assert main(["export", str(run), str(ckpt), str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok.decode(tok.encode(TEXT[0], add_special_tokens=False)) == TEXT[0]
    assert tok.eos_token == "<|endoftext|>"
    # another tokenizer given by hand is not the run's
    other = tmp_path / "other.json"
    other.write_bytes(train_bpe(TEXT * 50, 270).data)
    assert main(["export", str(run), str(ckpt), str(tmp_path / "o"), "--tokenizer", str(other)]) == 2
    assert "is not the run's tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # a copy in the cache that no longer hashes right is not used (nor one beside the manifest)
    (node_dir / TOKENIZER_DIR / f"{sha}.json").write_bytes(theirs + b" ")
    (tmp_path / "data" / "tokenizer.json").write_bytes(theirs + b" ")
    assert main(["export", str(run), str(ckpt), str(tmp_path / "o")]) == 2
    # with no copy in the data dir, the file data prepare wrote beside the manifest serves
    (tmp_path / "data" / "tokenizer.json").write_bytes(theirs)
    assert main(["export", str(run), str(ckpt), str(tmp_path / "o2")]) == 0
    # no manifest on this machine: the sha256 the node recorded at join names the copy
    (tmp_path / "data" / "manifest.json").unlink()
    (node_dir / TOKENIZER_DIR / f"{sha}.json").write_bytes(theirs)
    (node_dir / TOKENIZER_DIR / "run-r.sha256").write_text(sha + "\n")
    assert main(["export", str(run), str(ckpt), str(tmp_path / "o3"), "--tokenizer", str(other)]) == 2
    assert main(["export", str(run), str(ckpt), str(tmp_path / "o3")]) == 0
    assert (tmp_path / "o3" / "tokenizer.json").exists()


def test_the_command_is_on_the_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "distronet.node.cli", "export", "-h"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "checkpoint" in out.stdout
