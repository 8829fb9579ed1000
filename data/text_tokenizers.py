"""Tokenizers: the variants in tokenizer_specs.json, SentencePiece BPE training under a settings profile, and the
260-id byte tokenizer. Both kinds share one small interface (encode_batch, decode, decoded_bytes_batch,
vocab_size, bos_id) so the shard pipeline does not care which it has. A variant may carry a text transform
(CaseOps): its tokenizer encodes transformed text and decodes back to the original.

Profiles (tokenizer_specs.json, `sentencepiece_profiles`) hold the trainer's settings and how training sentences
are cut from the documents: `challenge` reproduces the challenge's FineWeb tokenizers, `sotu` is what the sotu
datasets were built with. data/README.md gives the reasons for each setting.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from data import caseops
from data.shards import MAX_TOKEN_ID, atomic_write_bytes

DATA_DIR = Path(__file__).resolve().parent
SPECS_PATH = DATA_DIR / "tokenizer_specs.json"

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPACE = "\u2581"  # SentencePiece's space symbol
TRAINER_MAX_SENTENCE_BYTES = 4192  # SentencePiece's default max_sentence_length; it skips longer sentences

# The challenge's byte tokenizer file (fineweb_pure_byte_260.json), written the way its exporter writes it.
BYTE260 = {"tokenizer_type": "pure_byte", "vocab_size": 260,
           "config": {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID,
                      "byte_offset": 4, "byte_count": 256}}
BYTE260_FILE = (json.dumps(BYTE260, indent=2, sort_keys=True) + "\n").encode("utf-8")

TEXT_TRANSFORMS = {caseops.NAME: caseops}  # text_transform name in the specs -> module with encode/decode
TRANSFORM_TAGS = {caseops.NAME: "caseops"}  # -> the suffix of its tokenizer's file name
PROFILE_SENTENCES = ("paragraphs", "documents")  # a training sentence: one non-empty line, or one whole document
PROFILE_DOCUMENTS = ("train", "first")  # which documents: the train split, or the first ones of the source


@dataclass(frozen=True)
class TokenizerSpec:
    name: str  # the variant: sp1024, byte260, sp1024_caseops, ...
    kind: str  # "sentencepiece_bpe" or "byte"
    vocab_size: int
    text_transform: str | None = None  # "lossless_caps_caseops_v1": the tokenizer sees CaseOps text


@dataclass(frozen=True)
class TrainingProfile:
    name: str
    sentences: str  # PROFILE_SENTENCES
    documents: str  # PROFILE_DOCUMENTS
    trainer: dict = field(hash=False)  # SentencePieceTrainer arguments, all but vocab_size and the data

    @property
    def max_sentence_bytes(self) -> int:
        return int(self.trainer.get("max_sentence_length", TRAINER_MAX_SENTENCE_BYTES))

    def settings(self, spec: TokenizerSpec) -> dict:
        """The trainer arguments for one variant: a transform's operators become user_defined_symbols, so that
        each is always one piece of its own."""
        settings = {**self.trainer, "vocab_size": spec.vocab_size}
        if spec.text_transform:
            settings["user_defined_symbols"] = list(TEXT_TRANSFORMS[spec.text_transform].OPERATORS)
        return settings


def _raw_specs(path) -> dict:
    return json.loads(Path(path).read_text())


def load_specs(path: str | os.PathLike = SPECS_PATH) -> tuple[dict[str, TokenizerSpec], str]:
    """Read the variant list; return ({name: spec}, default name). Validates every entry."""
    raw = _raw_specs(path)
    specs = {}
    for entry in raw["tokenizers"]:
        spec = TokenizerSpec(entry["name"], entry["kind"], int(entry["vocab_size"]), entry.get("text_transform"))
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
        if spec.text_transform is not None and (spec.kind != "sentencepiece_bpe" or spec.text_transform not in TEXT_TRANSFORMS):
            raise ValueError(f"{path}: {spec.name} has text_transform {spec.text_transform!r}; a sentencepiece_bpe "
                             f"variant may have one of {sorted(TEXT_TRANSFORMS)}")
        specs[spec.name] = spec
    default = raw.get("default", next(iter(specs)))
    if default not in specs:
        raise ValueError(f"{path}: default variant {default!r} is not among {sorted(specs)}")
    return specs, default


def load_profiles(path: str | os.PathLike = SPECS_PATH) -> dict[str, TrainingProfile]:
    profiles = {}
    for name, entry in _raw_specs(path)["sentencepiece_profiles"].items():
        profile = TrainingProfile(name, entry["sentences"], entry["documents"], dict(entry["trainer"]))
        if profile.sentences not in PROFILE_SENTENCES or profile.documents not in PROFILE_DOCUMENTS:
            raise ValueError(f"{path}: profile {name!r} has sentences={profile.sentences!r}, documents="
                             f"{profile.documents!r}; use one of {PROFILE_SENTENCES} and one of {PROFILE_DOCUMENTS}")
        fixed = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "unk_id": UNK_ID, "model_type": "bpe"}
        wrong = {k: profile.trainer.get(k) for k, v in fixed.items() if profile.trainer.get(k) != v}
        if wrong:
            raise ValueError(f"{path}: profile {name!r} sets {wrong}; shards and train_gpt.py need {fixed}")
        if "vocab_size" in profile.trainer:
            raise ValueError(f"{path}: profile {name!r} sets vocab_size; each variant sets its own")
        profiles[name] = profile
    return profiles


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
    if spec.kind == "byte":
        return "byte260.json"
    tag = f"_{TRANSFORM_TAGS[spec.text_transform]}" if spec.text_transform else ""
    return f"{source}_{spec.vocab_size}_bpe{tag}.model"


# -------------------------------------------------------------------------------------------------
# The two kinds

class ByteTokenizer:
    """Token id = byte value + 4; no normalization, so decode gives back the raw UTF-8 text."""

    kind = "byte"
    vocab_size = BYTE260["vocab_size"]
    bos_id = BOS_ID
    offset = BYTE260["config"]["byte_offset"]
    transform = None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16) + self.offset for t in texts]

    def decode(self, ids) -> str:
        ids = np.asarray(ids, dtype=np.int64)
        return (ids[ids >= self.offset] - self.offset).astype(np.uint8).tobytes().decode("utf-8")

    def decoded_bytes_batch(self, ids_list: list[np.ndarray]) -> list[int]:
        return [int((np.asarray(ids) >= self.offset).sum()) for ids in ids_list]


class SentencePieceTokenizer:
    kind = "sentencepiece_bpe"

    def __init__(self, model_path: str | os.PathLike, text_transform: str | None = None):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(model_path))
        self.vocab_size = self.sp.vocab_size()
        self.bos_id = self.sp.bos_id()
        self.transform = TEXT_TRANSFORMS[text_transform] if text_transform else None
        if self.bos_id < 0:
            raise ValueError(f"{model_path}: the SentencePiece model has no BOS piece; documents need BOS "
                             f"(train with bos_id={BOS_ID})")
        if self.vocab_size > MAX_TOKEN_ID + 1:
            raise ValueError(f"{model_path}: vocab size {self.vocab_size} does not fit uint16 shards (max 65536)")
        self.operator_ids = []
        if self.transform:
            self.operator_ids = [self.sp.piece_to_id(op) for op in self.transform.OPERATORS]
            if any(self.sp.id_to_piece(i) != op for i, op in zip(self.operator_ids, self.transform.OPERATORS)):
                raise ValueError(f"{model_path}: the model has no piece of its own for each {text_transform} operator "
                                 "U+E001..U+E004; train it with them as user_defined_symbols (a *_caseops variant)")
        self._piece_bytes = None

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.transform:
            texts = [self.transform.encode(t) for t in texts]
        return [np.asarray(ids, dtype=np.uint16) for ids in self.sp.encode(texts)]

    def decode(self, ids) -> str:
        text = self.sp.decode([int(i) for i in ids])
        return self.transform.decode(text) if self.transform else text

    def decoded_bytes_batch(self, ids_list: list[np.ndarray]) -> list[int]:
        texts = self.sp.decode([ids.tolist() for ids in ids_list])
        if self.transform:  # the bytes of the case-restored text, as train_gpt.py checks a byte sidecar
            texts = [self.transform.decode(t).replace(SPACE, " ") for t in texts]
        return [len(t.encode("utf-8")) for t in texts]

    def original_bytes(self, ids: np.ndarray) -> np.ndarray:
        """The byte sidecar's values for one document's tokens (BOS excluded): the UTF-8 bytes of decoded,
        case-restored text each token stands for. A text piece counts its UTF-8 bytes with each space symbol as 1,
        a byte piece 1, a control piece 0, an operator 0; but an operator that an ESC before it makes literal is
        that character (3 bytes)."""
        if self._piece_bytes is None:
            sp = self.sp
            table = np.zeros(self.vocab_size, dtype=np.int32)
            for i in range(self.vocab_size):
                if sp.is_byte(i):
                    table[i] = 1
                elif not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
                    piece = sp.id_to_piece(i)
                    table[i] = len(piece.encode("utf-8")) - 2 * piece.count(SPACE)
            table[self.operator_ids] = 0
            self._piece_bytes = table
        ids = np.asarray(ids, dtype=np.int64)
        counts = self._piece_bytes[ids]
        if self.operator_ids:
            esc_id, escaped_at = self.sp.piece_to_id(self.transform.ESC), -2
            for p in np.flatnonzero(np.isin(ids, self.operator_ids)).tolist():  # in order; an ESC's literal may be an ESC
                if p == escaped_at + 1:
                    counts[p] = len(self.sp.id_to_piece(int(ids[p])).encode("utf-8"))
                    escaped_at = -2
                elif ids[p] == esc_id:
                    escaped_at = p
        return counts


def load_tokenizer(path: str | os.PathLike, text_transform: str | None = None):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer {path} does not exist; build it with data/build_sotu.py or "
                                "data/build_jsonl.py, or fetch it with data/download_challenge.py")
    if path.suffix == ".json":
        config = json.loads(path.read_text())
        if config != BYTE260:
            raise ValueError(f"{path}: unsupported tokenizer config {config}; expected the challenge's pure_byte "
                             f"tokenizer {BYTE260} (data/build_sotu.py --variant byte260 rewrites an older byte260.json)")
        if text_transform:
            raise ValueError(f"{path}: the byte tokenizer takes no text transform ({text_transform!r})")
        return ByteTokenizer()
    return SentencePieceTokenizer(path, text_transform)


# -------------------------------------------------------------------------------------------------
# Writing tokenizers

def write_byte260(path: str | os.PathLike) -> None:
    path = Path(path)
    if not (path.is_file() and path.read_bytes() == BYTE260_FILE):
        atomic_write_bytes(path, BYTE260_FILE)


def train_sentencepiece(spec: TokenizerSpec, settings: dict, sentences: Iterable[str],
                        model_path: str | os.PathLike) -> None:
    """Train a BPE model with the trainer arguments `settings` on `sentences`, and write `<name>.model` and
    `<name>.vocab` atomically."""
    import sentencepiece as spm

    model_path = Path(model_path)
    proto = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=proto, minloglevel=2, **settings)
    except RuntimeError as e:
        raise RuntimeError(f"training {spec.name} (vocab_size {spec.vocab_size}) failed: {str(e).rstrip('.')}; if "
                           "the vocab is too high for the training text, use more documents or a smaller vocab") from e
    atomic_write_bytes(model_path, proto.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.vocab_size()))
    atomic_write_bytes(model_path.with_suffix(".vocab"), vocab.encode("utf-8"))
