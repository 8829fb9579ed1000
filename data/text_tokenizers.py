"""Tokenizers: the variants in tokenizer_specs.json, SentencePiece BPE training with the
challenge's settings, and the 260-id byte tokenizer. Both kinds share one small interface
(encode_batch, decode, vocab_size, bos_id) so the shard pipeline does not care which it has."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from data.shards import MAX_TOKEN_ID, atomic_write_bytes, atomic_write_json

DATA_DIR = Path(__file__).resolve().parent
SPECS_PATH = DATA_DIR / "tokenizer_specs.json"

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

# The challenge's tokenizer settings, plus choices for what it leaves open. remove_extra_whitespaces stays at SentencePiece's default (on):
# with it a normalized document never starts with a space, so the byte accounting's rule "no space
# byte right after BOS" is exact (with it off, a leading space survives decode and the rule undercounts).
# nmt_nfkc maps newlines to spaces, so paragraphs are joined by one space in the decoded text.
MAX_SENTENCE_BYTES = 65536  # SentencePiece drops longer training sentences silently (default 4192)
SENTENCEPIECE_SETTINGS = dict(
    model_type="bpe",
    byte_fallback=True,
    split_digits=True,
    normalization_rule_name="nmt_nfkc",
    add_dummy_prefix=False,
    remove_extra_whitespaces=True,
    pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
    max_sentence_length=MAX_SENTENCE_BYTES,
    character_coverage=0.9995,  # rarer characters go to byte-fallback pieces
    hard_vocab_limit=True,  # exactly vocab_size pieces, or a clear error when the text is too small
    input_sentence_size=0,  # train on every paragraph given; callers cap the input themselves
)

BYTE260 = {"kind": "byte", "vocab_size": 260, "byte_offset": 4,
           "pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID}


@dataclass(frozen=True)
class TokenizerSpec:
    name: str  # the variant: sp1024, byte260, ...
    kind: str  # "sentencepiece_bpe" or "byte"
    vocab_size: int


def load_specs(path: str | os.PathLike = SPECS_PATH) -> tuple[dict[str, TokenizerSpec], str]:
    """Read the variant list; return ({name: spec}, default name). Validates every entry."""
    raw = json.loads(Path(path).read_text())
    specs = {}
    for entry in raw["tokenizers"]:
        spec = TokenizerSpec(entry["name"], entry["kind"], int(entry["vocab_size"]))
        if spec.kind not in ("sentencepiece_bpe", "byte"):
            raise ValueError(f"{path}: {spec.name} has kind {spec.kind!r}; use 'sentencepiece_bpe' or 'byte'")
        if spec.vocab_size > MAX_TOKEN_ID + 1:
            raise ValueError(f"{path}: {spec.name} has vocab_size {spec.vocab_size} > {MAX_TOKEN_ID + 1}; "
                             "shard tokens are uint16, so choose a vocab_size of at most 65536")
        if spec.kind == "byte" and spec.vocab_size != BYTE260["vocab_size"]:
            raise ValueError(f"{path}: {spec.name} is a byte tokenizer with vocab_size {spec.vocab_size}; "
                             "the byte tokenizer has exactly 260 ids (4 specials + 256 bytes)")
        if spec.kind == "sentencepiece_bpe" and spec.vocab_size < 260 + 4:
            raise ValueError(f"{path}: {spec.name} has vocab_size {spec.vocab_size}; byte fallback alone "
                             "needs 4 specials + 256 byte pieces, so use at least 264")
        specs[spec.name] = spec
    default = raw.get("default", next(iter(specs)))
    if default not in specs:
        raise ValueError(f"{path}: default variant {default!r} is not among {sorted(specs)}")
    return specs, default


def resolve_variants(names: Iterable[str], specs: dict[str, TokenizerSpec]) -> list[TokenizerSpec]:
    names = list(names)
    if names == ["all"]:
        return list(specs.values())
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise ValueError(f"unknown variant {unknown[0]!r}; choose from {sorted(specs)} or 'all' "
                         f"(variants are listed in {SPECS_PATH})")
    return [specs[n] for n in names]


def tokenizer_filename(source: str, spec: TokenizerSpec) -> str:
    return "byte260.json" if spec.kind == "byte" else f"{source}_{spec.vocab_size}_bpe.model"


# -------------------------------------------------------------------------------------------------
# The two kinds

class ByteTokenizer:
    """Token id = byte value + 4; no normalization, so decode gives back the raw UTF-8 text."""

    kind = "byte"
    vocab_size = BYTE260["vocab_size"]
    bos_id = BOS_ID
    offset = BYTE260["byte_offset"]

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16) + self.offset for t in texts]

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        return (ids[ids >= self.offset] - self.offset).astype(np.uint8).tobytes().decode("utf-8")

    def decoded_bytes_batch(self, ids_list: list[np.ndarray]) -> list[int]:
        return [int((np.asarray(ids) >= self.offset).sum()) for ids in ids_list]


class SentencePieceTokenizer:
    kind = "sentencepiece_bpe"

    def __init__(self, model_path: str | os.PathLike):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.vocab_size = self.sp.vocab_size()
        self.bos_id = self.sp.bos_id()
        if self.bos_id < 0:
            raise ValueError(f"{model_path}: the SentencePiece model has no BOS piece; documents need BOS "
                             f"(train with bos_id={BOS_ID})")
        if self.vocab_size > MAX_TOKEN_ID + 1:
            raise ValueError(f"{model_path}: vocab size {self.vocab_size} does not fit uint16 shards (max 65536)")

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint16) for ids in self.sp.encode(texts)]

    def decode(self, ids) -> str:
        return self.sp.decode([int(i) for i in ids])

    def decoded_bytes_batch(self, ids_list: list[np.ndarray]) -> list[int]:
        texts = self.sp.decode([ids.tolist() for ids in ids_list])
        return [len(t.encode("utf-8")) for t in texts]


def load_tokenizer(path: str | os.PathLike):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer {path} does not exist; build it with data/build_sotu.py or "
                                "data/build_jsonl.py, or fetch it with data/download_challenge.py")
    if path.suffix == ".json":
        config = json.loads(path.read_text())
        if config != BYTE260:
            raise ValueError(f"{path}: unsupported tokenizer config {config}; expected {BYTE260}")
        return ByteTokenizer()
    return SentencePieceTokenizer(path)


# -------------------------------------------------------------------------------------------------
# Writing tokenizers

def write_byte260(path: str | os.PathLike) -> None:
    path = Path(path)
    if not (path.is_file() and json.loads(path.read_text()) == BYTE260):
        atomic_write_json(path, BYTE260)


def train_sentencepiece(spec: TokenizerSpec, sentences: Iterable[str], model_path: str | os.PathLike) -> None:
    """Train a BPE model on `sentences` (paragraphs of the train split) and write `<name>.model` and
    `<name>.vocab` atomically."""
    import sentencepiece as spm

    model_path = Path(model_path)
    proto = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=proto, vocab_size=spec.vocab_size,
            num_threads=os.cpu_count() or 1, minloglevel=2, **SENTENCEPIECE_SETTINGS)
    except RuntimeError as e:
        raise RuntimeError(f"training {spec.name} (vocab_size {spec.vocab_size}) failed: {str(e).rstrip('.')}; if "
                           "the vocab is too high for the training text, use more documents or a smaller vocab") from e
    atomic_write_bytes(model_path, proto.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.vocab_size()))
    atomic_write_bytes(model_path.with_suffix(".vocab"), vocab.encode("utf-8"))
