"""One pipeline for every text source: split documents, train or reuse the tokenizer on the train
split, encode, write shards through data/shards.py, and record everything in a manifest.

Output layout, relative to the data directory:
  tokenizers/<source>_<vocab>_bpe.model (+ .vocab), tokenizers/byte260.json
  datasets/<source>_<variant>/fineweb_{train,val}_XXXXXX.bin + manifest.json
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
from data.text_tokenizers import (BYTE260, MAX_SENTENCE_BYTES, SENTENCEPIECE_SETTINGS, TokenizerSpec,
                                  load_tokenizer, tokenizer_filename, train_sentencepiece, write_byte260)

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


def training_paragraphs(documents: Iterable[Document], stats: dict, max_docs: int | None = None) -> Iterator[str]:
    """Non-empty lines of train documents: the tokenizer's training sentences. Lines longer than
    SentencePiece's max_sentence_length are counted in `stats` instead of being dropped silently."""
    stats.update(documents=0, paragraphs=0, bytes=0, too_long=0)
    for doc in documents:
        if doc.split != "train":
            continue
        if max_docs is not None and stats["documents"] >= max_docs:
            return
        stats["documents"] += 1
        for line in doc.text.split("\n"):
            line = line.strip()
            if not line:
                continue
            size = len(line.encode("utf-8"))
            if size > MAX_SENTENCE_BYTES:
                stats["too_long"] += 1
                continue
            stats["paragraphs"] += 1
            stats["bytes"] += size
            yield line


# -------------------------------------------------------------------------------------------------
# Reuse checks

def load_manifest(path: Path) -> dict | None:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("manifest_version") == MANIFEST_VERSION else None


def shards_intact(out_dir: Path, manifest: dict) -> bool:
    for split in SPLITS:
        for shard in manifest["splits"][split]["shards"]:
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


def build_dataset(source: Source, spec: TokenizerSpec, data_dir: str | os.PathLike,
                  shard_tokens: int = SHARD_TOKENS, tokenizer_docs: int | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Build (or verify and reuse) datasets/<source>_<variant>/ and its tokenizer. Returns the manifest."""
    t0 = time.perf_counter()
    data_dir = Path(data_dir)
    name = f"{source.name}_{spec.name}"
    out_dir = data_dir / "datasets" / name
    manifest_path = out_dir / "manifest.json"
    tok_rel = f"tokenizers/{tokenizer_filename(source.name, spec)}"
    tok_path = data_dir / tok_rel
    source_info = source.info()
    old = load_manifest(manifest_path)

    # ---- tokenizer: trained on the train split only, reused while its inputs are unchanged
    if spec.kind == "byte":
        write_byte260(tok_path)
        training = {"settings": BYTE260}
    else:
        training = {"settings": {**SENTENCEPIECE_SETTINGS, "vocab_size": spec.vocab_size},
                    "split": "train", "max_documents": tokenizer_docs}
        old_training = dict(old["tokenizer"]["training"]) if old is not None else {}
        paragraphs = old_training.pop("paragraphs", None)
        reuse = (old is not None and old["source"] == source_info and old_training == training
                 and tok_path.is_file() and sha256_file(tok_path) == old["tokenizer"]["sha256"])
        if not reuse:
            manifest_path.unlink(missing_ok=True)  # it would describe shards of the old tokenizer
            stats: dict = {}
            log(f"{name}: training {spec.name} on the train split of {source.name}")
            t = time.perf_counter()
            train_sentencepiece(spec, training_paragraphs(source.documents(), stats, tokenizer_docs), tok_path)
            log(f"{name}: trained {tok_rel} on {stats['paragraphs']:,} paragraphs ({stats['bytes']:,} bytes) "
                f"of {stats['documents']:,} documents in {time.perf_counter() - t:.1f} s"
                + (f"; skipped {stats['too_long']} paragraphs over {MAX_SENTENCE_BYTES} bytes" if stats["too_long"] else ""))
            paragraphs = stats["paragraphs"]
        training["paragraphs"] = paragraphs
    tok_sha256 = sha256_file(tok_path)
    tokenizer = load_tokenizer(tok_path)
    if tokenizer.vocab_size != spec.vocab_size:
        raise ValueError(f"{tok_path}: vocab size {tokenizer.vocab_size} != {spec.vocab_size} of variant {spec.name}; "
                         "delete the file and rebuild")

    # ---- shards: reused when the manifest matches the inputs and every shard verifies
    if (old is not None and old["source"] == source_info and old["tokenizer"]["sha256"] == tok_sha256
            and old["shard_tokens"] == shard_tokens and shards_intact(out_dir, old)):
        log(summary_line(old, None))
        return old
    manifest_path.unlink(missing_ok=True)  # the manifest is written last: it marks a finished build

    writers = {split: ShardWriter(out_dir, split, shard_tokens) for split in SPLITS}
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
    keep = {s.file for split in SPLITS for s in shards[split]}
    for stale in out_dir.glob("fineweb_*.bin"):  # shards of an earlier, larger build
        if stale.name not in keep:
            stale.unlink()
    encode_seconds = time.perf_counter() - t_encode

    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "name": name,
        "format": {"header": "256 x int32 little-endian: 20240520, 1, num_tokens, 0...",
                   "tokens": "uint16 little-endian", "documents": "BOS, then the document's tokens; no EOS",
                   "train_glob": "fineweb_train_*.bin", "val_glob": "fineweb_val_*.bin"},
        "source": source_info,
        "tokenizer": {"variant": spec.name, "kind": spec.kind, "vocab_size": spec.vocab_size, "path": tok_rel,
                      "sha256": tok_sha256, "bos_id": tokenizer.bos_id, "training": training},
        "shard_tokens": shard_tokens,
        "splits": {split: {**counts[split], "shards": [dataclasses.asdict(s) for s in shards[split]]}
                   for split in SPLITS},
        "encode_seconds": round(encode_seconds, 3),
    }
    atomic_write_json(manifest_path, manifest)
    log(summary_line(manifest, time.perf_counter() - t0))
    return manifest
