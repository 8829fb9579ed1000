"""One pipeline for every text source: split documents, train or reuse the tokenizer, encode, write shards through
data/shards.py, and record everything in a manifest.

Output layout, relative to the data directory:
  tokenizers/<source>_<vocab>_bpe.model (+ .vocab), tokenizers/<source>_<vocab>_bpe_caseops.model, tokenizers/byte260.json
  datasets/<source>_<variant>/fineweb_{train,val}_XXXXXX.bin + manifest.json
  (a CaseOps variant adds fineweb_val_bytes_XXXXXX.bin: the byte sidecar of each val shard)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Protocol

import numpy as np
from tqdm import tqdm

from data.shards import SHARD_TOKENS, ShardWriter, atomic_write_json, read_datafile_header, sha256_file
from data.text_tokenizers import (BYTE260, TEXT_TRANSFORMS, TokenizerSpec, TrainingProfile, load_tokenizer,
                                  tokenizer_filename, train_sentencepiece, write_byte260)

MANIFEST_VERSION = 1
VAL_FRACTION = 0.1
ENCODE_BATCH_DOCS = 64
SPLITS = ("train", "val")


@dataclass
class Document:
    doc_id: str
    text: str
    split: str  # "train" or "val"


class Source(Protocol):
    name: str  # prefix of dataset and tokenizer names: sotu -> datasets/sotu_sp1024
    num_documents: int

    def info(self) -> dict: ...  # JSON-able description with the source hashes; a change forces a rebuild

    def documents(self) -> Iterable[Document]: ...  # same order on every call


# -------------------------------------------------------------------------------------------------
# Splitting

def doc_hash(doc_id: str) -> int:
    """64-bit position of a document id in [0, 2**64): the split key and the sotu shuffle order."""
    return int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "big")


def hash_split(doc_id: str, val_fraction: float = VAL_FRACTION) -> str:
    # A document's split depends on its id alone, so it never moves when documents are added,
    # removed or reordered, and a slice of a corpus splits exactly like the full corpus.
    return "val" if doc_hash(doc_id) < val_fraction * 2**64 else "train"


def hash_split_info(val_fraction: float) -> dict:
    return {"rule": "val iff int(sha256(doc_id)[:8 bytes], big-endian) < val_fraction * 2**64",
            "val_fraction": val_fraction}


def training_sentences(documents: Iterable[Document], profile: TrainingProfile, stats: dict,
                       max_docs: int | None = None, transform=None) -> Iterator[str]:
    """The tokenizer's training sentences, as the profile cuts them: the non-empty lines (paragraphs) of train
    documents, or each of the first documents whole (the challenge's way: NUL as space, stripped; validation
    documents included). Text goes through the variant's transform first. Sentences longer than the trainer's
    max_sentence_length are skipped here and counted in `stats` (the trainer would skip them silently)."""
    stats.update(documents=0, sentences=0, bytes=0, too_long=0)
    limit = profile.max_sentence_bytes
    for doc in documents:
        if profile.documents == "train" and doc.split != "train":
            continue
        if max_docs is not None and stats["documents"] >= max_docs:
            return
        stats["documents"] += 1
        text = transform.encode(doc.text) if transform else doc.text
        if profile.sentences == "documents":
            candidates = [text.replace("\x00", " ").strip()]
        else:
            candidates = [line.strip() for line in text.split("\n")]
        for sentence in candidates:
            if not sentence:
                continue
            size = len(sentence.encode("utf-8"))
            if size > limit:
                stats["too_long"] += 1
                continue
            stats["sentences"] += 1
            stats["bytes"] += size
            yield sentence


# -------------------------------------------------------------------------------------------------
# Reuse checks

def load_manifest(path: Path) -> dict | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("manifest_version") == MANIFEST_VERSION else None


def manifest_shards(manifest: dict) -> list[dict]:
    """Every file a dataset's manifest lists: the shards of both splits and a CaseOps variant's byte sidecar."""
    return [shard for split in SPLITS for key in ("shards", "byte_sidecar")
            for shard in manifest["splits"][split].get(key, [])]


def shards_intact(out_dir: Path, manifest: dict) -> bool:
    for shard in manifest_shards(manifest):
        path = out_dir / shard["file"]
        try:
            if read_datafile_header(path) != shard["tokens"] or sha256_file(path) != shard["sha256"]:
                return False
        except (OSError, ValueError):
            return False
    return True


def batched(items: Iterable, n: int) -> Iterator[list]:
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


# -------------------------------------------------------------------------------------------------
# The build

def summary_line(manifest: dict, seconds: float | None) -> str:
    s = manifest["splits"]
    docs = s["train"]["documents"] + s["val"]["documents"]
    tokens = s["train"]["tokens"] + s["val"]["tokens"]
    text_bytes = s["train"]["bytes"] + s["val"]["bytes"]
    line = (f"{manifest['name']}: {docs:,} documents ({s['train']['documents']:,} train, {s['val']['documents']:,} val), "
            f"{tokens:,} tokens ({s['train']['tokens']:,} train, {s['val']['tokens']:,} val), "
            f"{text_bytes:,} bytes, {text_bytes / tokens:.3f} bytes/token")
    if seconds is None:
        return line + ", reused (verified)"
    return line + f", {seconds:.1f} s, {tokens / seconds:,.0f} tokens/s"


def build_dataset(source: Source, spec: TokenizerSpec, data_dir: str | os.PathLike, profile: TrainingProfile,
                  shard_tokens: int = SHARD_TOKENS, tokenizer_docs: int | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Build (or verify and reuse) datasets/<source>_<variant>/ and its tokenizer, trained under `profile`.
    Returns the manifest."""
    t0 = time.perf_counter()
    data_dir = Path(data_dir)
    name = f"{source.name}_{spec.name}"
    out_dir = data_dir / "datasets" / name
    manifest_path = out_dir / "manifest.json"
    tok_rel = f"tokenizers/{tokenizer_filename(source.name, spec)}"
    tok_path = data_dir / tok_rel
    source_info = source.info()
    old = load_manifest(manifest_path)

    # ---- tokenizer: reused while its inputs are unchanged
    if spec.kind == "byte":
        write_byte260(tok_path)
        training = {"settings": BYTE260}
    else:
        settings = profile.settings(spec)
        training = {"profile": profile.name, "settings": settings, "sentences": profile.sentences,
                    "documents": profile.documents, "max_documents": tokenizer_docs}
        old_training = dict(old["tokenizer"]["training"]) if old is not None else {}
        trained_on = old_training.pop("trained_on", None)
        reuse = (old is not None and old["source"] == source_info and old_training == training
                 and tok_path.is_file() and sha256_file(tok_path) == old["tokenizer"]["sha256"])
        if not reuse:
            manifest_path.unlink(missing_ok=True)  # it would describe shards of the old tokenizer
            stats: dict = {}
            which = "the train split" if profile.documents == "train" else "the first documents"
            log(f"{name}: training {spec.name} on {profile.sentences} of {which} of {source.name} ({profile.name} settings)")
            t = time.perf_counter()
            sentences = training_sentences(source.documents(), profile, stats, tokenizer_docs,
                                           TEXT_TRANSFORMS.get(spec.text_transform))
            try:
                train_sentencepiece(spec, settings, sentences, tok_path)
            except RuntimeError as e:
                if stats.get("sentences"):
                    raise
                raise ValueError(f"{name}: no training sentences: the {stats.get('too_long', 0)} {profile.sentences} "
                                 f"of {stats.get('documents', 0)} documents are all longer than the trainer's "
                                 f"max_sentence_length of {profile.max_sentence_bytes} bytes ({profile.name} settings); "
                                 "use shorter documents or another profile") from e
            log(f"{name}: trained {tok_rel} on {stats['sentences']:,} {profile.sentences} ({stats['bytes']:,} bytes) "
                f"of {stats['documents']:,} documents in {time.perf_counter() - t:.1f} s"
                + (f"; skipped {stats['too_long']:,} over {profile.max_sentence_bytes} bytes" if stats["too_long"] else ""))
            trained_on = stats
        training["trained_on"] = trained_on
    tok_sha256 = sha256_file(tok_path)
    tokenizer = load_tokenizer(tok_path, spec.text_transform)
    if tokenizer.vocab_size != spec.vocab_size:
        raise ValueError(f"{tok_path}: vocab size {tokenizer.vocab_size} != {spec.vocab_size} of variant {spec.name} "
                         "(with hard_vocab_limit off, training on too little text gives fewer pieces); "
                         "use more documents, or delete the file and rebuild")

    # ---- shards: reused when the manifest matches the inputs and every shard verifies
    if (old is not None and old["source"] == source_info and old["tokenizer"]["sha256"] == tok_sha256
            and old["shard_tokens"] == shard_tokens and shards_intact(out_dir, old)):
        # A retrained tokenizer can come out identical (training is deterministic): the shards stand, and the
        # manifest, removed when training started, is written again with the training it records now.
        manifest = {**old, "tokenizer": {**old["tokenizer"], "training": training}}
        if manifest != old or not manifest_path.is_file():
            atomic_write_json(manifest_path, manifest)
        log(summary_line(manifest, None))
        return manifest
    manifest_path.unlink(missing_ok=True)  # the manifest is written last: it marks a finished build

    writers = {split: ShardWriter(out_dir, split, shard_tokens) for split in SPLITS}
    # A transform's val shards get a byte sidecar (fineweb_val_bytes_*.bin, same format and boundaries): the bytes
    # of original text behind each token, which val_bpb divides by; token lengths no longer give them.
    sidecar = ShardWriter(out_dir, "val_bytes", shard_tokens) if spec.text_transform else None
    counts = {split: dict(documents=0, tokens=0, bytes=0, source_bytes=0) for split in SPLITS}
    bos = np.array([tokenizer.bos_id], dtype=np.uint16)
    t_encode = time.perf_counter()
    with tqdm(total=source.num_documents, desc=f"{name} encode", unit="doc", leave=False) as bar:
        for batch in batched(source.documents(), ENCODE_BATCH_DOCS):
            for doc in batch:
                if not doc.text.strip():
                    raise ValueError(f"{source.name}: document {doc.doc_id!r} has empty text; "
                                     "remove it from the source or fix its text")
            ids_list = tokenizer.encode_batch([doc.text for doc in batch])
            for doc, ids, n_bytes in zip(batch, ids_list, tokenizer.decoded_bytes_batch(ids_list)):
                if ids.size == 0:
                    raise ValueError(f"{source.name}: document {doc.doc_id!r} encodes to no tokens with "
                                     f"{tok_rel} (only characters that normalization removes)")
                writers[doc.split].add(bos)  # BOS before every document, no EOS: the challenge's layout
                writers[doc.split].add(ids)
                if sidecar is not None and doc.split == "val":
                    token_bytes = tokenizer.original_bytes(ids)
                    if int(token_bytes.sum()) != n_bytes:
                        raise ValueError(f"{name}: document {doc.doc_id!r}: its tokens count {int(token_bytes.sum())} "
                                         f"bytes but its decoded, case-restored text has {n_bytes}; the byte sidecar "
                                         f"cannot be exact with {tok_rel}")
                    sidecar.add(np.zeros(1, dtype=np.uint16))  # BOS stands for no text
                    sidecar.add(token_bytes)
                c = counts[doc.split]
                c["documents"] += 1
                c["tokens"] += 1 + ids.size
                c["bytes"] += n_bytes
                c["source_bytes"] += len(doc.text.encode("utf-8"))
            bar.update(len(batch))
    for split in SPLITS:
        if counts[split]["documents"] == 0:
            raise ValueError(f"{source.name}: the {split} split is empty ({counts['train']['documents']} train, "
                             f"{counts['val']['documents']} val documents); use more documents or change the split")
    shards = {split: writers[split].close() for split in SPLITS}
    splits = {split: {**counts[split], "shards": [dataclasses.asdict(s) for s in shards[split]]} for split in SPLITS}
    if sidecar is not None:
        splits["val"]["byte_sidecar"] = [dataclasses.asdict(s) for s in sidecar.close()]
    keep = {s["file"] for s in manifest_shards({"splits": splits})}
    for stale in out_dir.glob("fineweb_*.bin"):  # shards of an earlier, larger build
        if stale.name not in keep:
            stale.unlink()
    encode_seconds = time.perf_counter() - t_encode

    file_format = {"header": "256 x int32 little-endian: 20240520, 1, num_tokens, 0...",
                   "tokens": "uint16 little-endian", "documents": "BOS, then the document's tokens; no EOS",
                   "train_glob": "fineweb_train_*.bin", "val_glob": "fineweb_val_*.bin"}
    if sidecar is not None:
        file_format.update(val_glob="fineweb_val_[0-9]*.bin", val_bytes_glob="fineweb_val_bytes_*.bin",
                           val_bytes="per val token, the UTF-8 bytes of the decoded, case-restored text it stands "
                                     "for (BOS and operators 0); same header and uint16 layout as a shard")
    tokenizer_info = {"variant": spec.name, "kind": spec.kind, "vocab_size": spec.vocab_size, "path": tok_rel,
                      "sha256": tok_sha256, "bos_id": tokenizer.bos_id, "training": training}
    if spec.text_transform:
        tokenizer_info["text_transform"] = spec.text_transform
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "name": name,
        "format": file_format,
        "source": source_info,
        "tokenizer": tokenizer_info,
        "shard_tokens": shard_tokens,
        "splits": splits,
        "encode_seconds": round(encode_seconds, 3),
    }
    atomic_write_json(manifest_path, manifest)
    log(summary_line(manifest, time.perf_counter() - t0))
    return manifest
