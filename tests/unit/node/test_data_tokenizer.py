"""data prepare with real tokenizers: training, given files, inputs, dtypes, bad inputs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distronet.node.data.documents import InputFormat
from distronet.node.data.english import english_documents, load_english_corpus
from distronet.node.data.errors import CorpusError, DataError, ShardIntegrityError
from distronet.node.data.manifest import load_shard, read_manifest
from distronet.node.data.prepare import TokenizerChoice, prepare_builtin_tokenized, prepare_files
from distronet.node.data.shards import shard_tokens
from distronet.node.data.tokenizer import load_tokenizer, token_dtype

DOCS = [
    "The quick brown fox jumps over the lazy dog.\nIt was not amused.",
    "A journey of a thousand miles begins with a single step.",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
    "All happy families are alike; each unhappy family is unhappy in its own way.",
] * 5


def _corpus(tmp: Path) -> Path:
    folder = tmp / "corpus"
    (folder / "sub").mkdir(parents=True)
    for i, d in enumerate(DOCS):
        (folder / ("sub" if i % 2 else "") / f"doc{i:02d}.txt").write_text(d, encoding="utf-8")
    return folder


def _documents_in(folder: Path) -> list[str]:
    return [f.read_text(encoding="utf-8") for f in sorted(p for p in folder.rglob("*") if p.is_file())]


def _all_tokens(out: Path) -> np.ndarray:
    m = read_manifest(out / "manifest.json")
    return np.concatenate([load_shard(m, e, out) for e in m.shards])


def _split(tokens: np.ndarray, eos: int) -> list[list[int]]:
    docs, cur = [], []
    for t in tokens.tolist():
        if t == eos:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    assert cur == []  # every document ends with EOS
    return docs


def test_training_twice_gives_identical_tokenizer_and_shards(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path)
    a = prepare_files([corpus], tmp_path / "a", shard_tokens=64, tokenizer=TokenizerChoice(train_vocab=400))
    b = prepare_files([corpus], tmp_path / "b", shard_tokens=64, tokenizer=TokenizerChoice(train_vocab=400))
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_bytes()
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
    assert len(a.shards) > 1 and a.vocab_size is not None and a.vocab_size > 300


def test_training_is_deterministic_across_processes(tmp_path: Path) -> None:
    """A new interpreter (new hash seeds in Python and in the tokenizers library) trains the same file."""
    corpus = _corpus(tmp_path)
    code = (
        "import sys; from pathlib import Path;"
        "from distronet.node.data.prepare import TokenizerChoice, prepare_files;"
        "prepare_files([Path(sys.argv[1])], Path(sys.argv[2]), tokenizer=TokenizerChoice(train_vocab=400))"
    )
    for name, seed in (("p1", "1"), ("p2", "2")):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
        subprocess.run([sys.executable, "-c", code, str(corpus), str(tmp_path / name)], check=True, env=env)
    assert (tmp_path / "p1" / "tokenizer.json").read_bytes() == (
        tmp_path / "p2" / "tokenizer.json"
    ).read_bytes()
    assert (tmp_path / "p1" / "shard-00000.bin").read_bytes() == (
        tmp_path / "p2" / "shard-00000.bin"
    ).read_bytes()


def test_given_tokenizer_round_trips_documents(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path)
    prepare_files([corpus], tmp_path / "train", tokenizer=TokenizerChoice(train_vocab=400))
    given = tmp_path / "given.json"
    given.write_bytes((tmp_path / "train" / "tokenizer.json").read_bytes())
    m = prepare_files([corpus], tmp_path / "out", shard_tokens=50, tokenizer=TokenizerChoice(path=given))
    assert m.version == 2 and m.tokenizer == "hf" and m.dtype == "uint16" and m.eos_id == 0
    assert m.tokenizer_sha256 == hashlib.sha256(given.read_bytes()).hexdigest()
    assert (
        m.tokenizer_sha256 == hashlib.sha256((tmp_path / "out" / "tokenizer.json").read_bytes()).hexdigest()
    )
    tok = load_tokenizer(tmp_path / "out" / "tokenizer.json")
    docs = _split(_all_tokens(tmp_path / "out"), m.eos_id)
    assert [tok.tokenizer.decode(d) for d in docs] == _documents_in(corpus)
    assert (tmp_path / "out" / "shard-00000.bin").stat().st_size == 2 * m.shards[0].tokens


def _wordlevel(path: Path, n: int) -> Path:
    """A word-level tokenizers file of ``n`` ids with ``</s>`` as a special token."""
    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i for i in range(2, n)}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 1,
                "content": "</s>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            },
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize(("n", "dtype", "itemsize"), [(1000, "uint16", 2), (70_000, "uint32", 4)])
def test_dtype_follows_vocabulary(tmp_path: Path, n: int, dtype: str, itemsize: int) -> None:
    text = tmp_path / "t.txt"
    text.write_text("w5 w999 w7", encoding="utf-8")
    m = prepare_files(
        [text], tmp_path / "o", tokenizer=TokenizerChoice(path=_wordlevel(tmp_path / "tk.json", n))
    )
    assert m.dtype == dtype and m.vocab_size == n and m.eos_id == 1
    raw = (tmp_path / "o" / "shard-00000.bin").read_bytes()
    assert np.frombuffer(raw, dtype=f"<u{itemsize}").tolist() == [5, 999, 7, 1]
    assert _all_tokens(tmp_path / "o").tolist() == [5, 999, 7, 1]
    assert shard_tokens(tmp_path / "o" / "shard-00000.bin", dtype, n).tolist() == [5, 999, 7, 1]


def test_token_dtype_boundary() -> None:
    assert token_dtype(65_536) == "uint16" and token_dtype(65_537) == "uint32"


def test_jsonl_and_parquet_inputs(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    jl = tmp_path / "a.jsonl"
    jl.write_text("\n".join(json.dumps({"body": d, "n": i}) for i, d in enumerate(DOCS[:3])) + "\n\n")
    pq.write_table(pa.table({"content": DOCS[3:6]}), tmp_path / "b.parquet")
    tk = tmp_path / "tk"
    prepare_files([_corpus(tmp_path)], tk, tokenizer=TokenizerChoice(train_vocab=400))
    fmt = InputFormat(jsonl_field="body", parquet_column="content")
    choice = TokenizerChoice(path=tk / "tokenizer.json")
    m = prepare_files([jl, tmp_path / "b.parquet"], tmp_path / "o", tokenizer=choice, fmt=fmt)
    assert m.eos_id is not None
    tok = load_tokenizer(tk / "tokenizer.json")
    assert [tok.tokenizer.decode(d) for d in _split(_all_tokens(tmp_path / "o"), m.eos_id)] == DOCS[:6]


def _bad(tmp_path: Path, name: str, content: bytes, fmt: InputFormat = InputFormat()) -> str:
    f = tmp_path / name
    f.write_bytes(content)
    tk = tmp_path / "tk.json"
    _wordlevel(tk, 50)
    with pytest.raises(DataError) as info:
        prepare_files([f], tmp_path / "o", tokenizer=TokenizerChoice(path=tk), fmt=fmt)
    return str(info.value)


def test_bad_inputs_are_data_errors(tmp_path: Path) -> None:
    assert "line 2: no 'text' field" in _bad(tmp_path, "a.jsonl", b'{"text": "ok"}\n{"body": "x"}\n')
    assert "line 1: not valid JSON" in _bad(tmp_path, "b.jsonl", b'{"text": "ok"\n')
    assert "not a string" in _bad(tmp_path, "c.jsonl", b'{"text": 5}\n')
    long = b'{"text": "' + b"a" * 200 + b'"}\n'
    assert "line 1: over the 100 byte record limit" in _bad(
        tmp_path, "d.jsonl", long, InputFormat(max_record_bytes=100)
    )
    assert "over the 100 byte document limit" in _bad(
        tmp_path, "e.txt", b"w" * 101, InputFormat(max_record_bytes=100)
    )
    assert "binary data" in _bad(tmp_path, "f.txt", b"w1 \x00\x01\x02")
    assert "not UTF-8 text" in _bad(tmp_path, "g.txt", b"w1 \xff\xfe")
    assert "not a readable Parquet file" in _bad(tmp_path, "h.parquet", b"PAR1 junk")


def test_bad_tokenizer_files(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("w2", encoding="utf-8")
    not_json = tmp_path / "tokenizer.json"
    not_json.write_bytes(b"\x89PNG not json")
    with pytest.raises(DataError, match="not a tokenizer file"):
        prepare_files([text], tmp_path / "o", tokenizer=TokenizerChoice(path=not_json))
    not_tok = tmp_path / "other.json"
    not_tok.write_text('{"hello": 1}')
    with pytest.raises(DataError, match="not a tokenizers JSON file"):
        prepare_files([text], tmp_path / "o", tokenizer=TokenizerChoice(path=not_tok))
    no_eos = tmp_path / "noeos.json"
    doc = json.loads(_wordlevel(no_eos, 10).read_text())
    doc["added_tokens"] = []
    no_eos.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"no EOS token.*--eos-id"):
        prepare_files([text], tmp_path / "o", tokenizer=TokenizerChoice(path=no_eos))
    m = prepare_files([text], tmp_path / "o", tokenizer=TokenizerChoice(path=no_eos, eos_id=0))
    assert m.eos_id == 0 and _all_tokens(tmp_path / "o").tolist() == [2, 0]


def test_token_over_vocabulary_is_refused_when_read(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("w2 w3", encoding="utf-8")
    out = tmp_path / "o"
    prepare_files([text], out, tokenizer=TokenizerChoice(path=_wordlevel(tmp_path / "tk.json", 10)))
    manifest_path = out / "manifest.json"
    doc = json.loads(manifest_path.read_text())
    shard = out / "shard-00000.bin"
    shard.write_bytes(np.array([2, 10, 1], dtype="<u2").tobytes())  # 10 >= vocab_size 10
    doc["shards"][0]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(doc))
    m = read_manifest(manifest_path)
    with pytest.raises(
        ShardIntegrityError, match="token 10 at position 1 is not below the vocabulary size 10"
    ):
        load_shard(m, m.shards[0], out)
    with pytest.raises(ShardIntegrityError, match="vocabulary size 10"):
        shard_tokens(shard, "uint16", 10)
    shard.write_bytes(b"\x01\x00\x02")  # not a whole number of uint16 tokens
    with pytest.raises(ShardIntegrityError, match="whole number"):
        shard_tokens(shard, "uint16", 10)


def test_byte_manifests_stay_version_1(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_bytes(b"abc")
    m = prepare_files([text], tmp_path / "o")
    doc = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert doc["version"] == 1 and "vocab_size" not in doc and m.vocab_bound == 256
    with pytest.raises(DataError, match=r"need|real tokenizer"):
        (tmp_path / "x.jsonl").write_text('{"text": "a"}\n')
        prepare_files([tmp_path / "x.jsonl"], tmp_path / "o2")


def test_english_corpus_from_a_fortunes_folder(tmp_path: Path) -> None:
    (tmp_path / "one").write_text("First fortune.\n%\nSecond\nfortune.\n%\nThird.\n")
    (tmp_path / "two").write_text("Alpha.\n%\nBeta.\n")
    train, val = english_documents(tmp_path, ("one", "two"))
    assert train == ["First fortune.", "Second\nfortune.", "Alpha."] and val == ["Third.", "Beta."]
    corpus = load_english_corpus(tmp_path, ("one", "two"))
    assert corpus.val.tobytes() == b"Third.\n\nBeta.\n\n"
    with pytest.raises(CorpusError, match="apt-get install fortunes"):
        english_documents(tmp_path, ("missing",))
    t, v = prepare_builtin_tokenized(train * 10, val * 10, tmp_path / "o", TokenizerChoice(train_vocab=300))
    assert (
        t.tokenizer_sha256
        == v.tokenizer_sha256
        == hashlib.sha256((tmp_path / "o" / "tokenizer.json").read_bytes()).hexdigest()
    )


def test_coordinator_schema_takes_version_2_and_keeps_version_1_as_it_was() -> None:
    from distronet.protocol.coordinator_api import MANIFEST, ApiError

    shards = [{"id": "s0", "path": "s0.bin", "sha256": "a" * 64, "tokens": 2, "bytes": 4}]
    v1 = {"version": 1, "tokenizer": "byte", "dtype": "uint8", "shards": shards}
    assert set(MANIFEST.validate(v1)) == {"version", "tokenizer", "dtype", "shards"}
    v2 = v1 | {"version": 2, "tokenizer": "hf", "dtype": "uint32", "vocab_size": 70_000, "eos_id": 0}
    v2 |= {"tokenizer_file": "tokenizer.json", "tokenizer_sha256": "b" * 64}
    assert MANIFEST.validate(v2)["vocab_size"] == 70_000
    for bad in ({"eos_id": None}, {"eos_id": 70_000}, {"dtype": "uint16"}):
        with pytest.raises(ApiError):
            MANIFEST.validate({k: v for k, v in (v2 | bad).items() if v is not None})
