"""Turn a documents file into tokenizers and shards, through the same pipeline as data/build_sotu.py.

The input is JSONL with one document per line and its text in a `text` field, as the challenge's
documents export. An `id` field, when present, names the document (else its line number).

    python data/build_jsonl.py docs_selected.jsonl --name fineweb --variant sp8192 --val-docs 50000 \
        --tokenizer-docs 5000000

--val-docs N puts the first N documents in validation, the challenge's rule (its val split is the
first 50,000 documents of its export); without it a document's split is a hash of its id (about
10% to validation). Tokenizers are trained with the `challenge` profile of tokenizer_specs.json by
default, the challenge's own settings and sentences: each of the first --tokenizer-docs documents of
the file is one training sentence, validation documents included, as in the challenge's exporter.
--profile sotu trains as data/build_sotu.py does (paragraphs of train documents only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python data/build_jsonl.py`: import through the `data` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from data.pipeline import VAL_FRACTION, Document, build_dataset, hash_split, hash_split_info
from data.shards import SHARD_TOKENS
from data.text_tokenizers import DATA_DIR, load_profiles, load_specs, resolve_variants

DEFAULT_PROFILE = "challenge"  # rebuilding the challenge's tokenizers from its documents


class JsonlSource:
    def __init__(self, path: str | Path, name: str, val_docs: int | None = None,
                 val_fraction: float = VAL_FRACTION, text_field: str = "text", id_field: str = "id"):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"documents file {self.path} does not exist")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ValueError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it prefixes dataset and tokenizer names)")
        self.name, self.val_docs, self.val_fraction = name, val_docs, val_fraction
        self.text_field, self.id_field = text_field, id_field
        digest, self.num_documents = hashlib.sha256(), 0
        with open(self.path, "rb") as f:  # one pass: the file's hash and its document count
            for line in f:
                digest.update(line)
                self.num_documents += bool(line.strip())
        self.sha256 = digest.hexdigest()
        if self.num_documents == 0:
            raise ValueError(f"{self.path} holds no documents")

    def info(self) -> dict:
        split = ({"rule": "the first val_docs documents of the file", "val_docs": self.val_docs}
                 if self.val_docs is not None else hash_split_info(self.val_fraction))
        return {"name": self.name, "file": self.path.name, "sha256": self.sha256, "bytes": self.path.stat().st_size,
                "documents": self.num_documents, "order": "file order", "split": split,
                "text_field": self.text_field, "id_field": self.id_field}

    def documents(self):
        index = 0
        with open(self.path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{self.path}:{line_number}: not valid JSON ({e})") from e
                text = record.get(self.text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise ValueError(f"{self.path}:{line_number}: no string field {self.text_field!r}; "
                                     "each line must be an object like {\"text\": \"...\"}")
                if not text.strip():
                    raise ValueError(f"{self.path}:{line_number}: empty {self.text_field!r}; remove the line")
                doc_id = str(record.get(self.id_field, line_number))
                if self.val_docs is not None:
                    split = "val" if index < self.val_docs else "train"
                else:
                    split = hash_split(doc_id, self.val_fraction)
                index += 1
                yield Document(doc_id, text, split)


def main(argv: list[str] | None = None) -> list[dict]:
    specs, default = load_specs()
    profiles = load_profiles()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", type=Path, help="JSONL documents file")
    parser.add_argument("--name", required=True, help="source name: datasets/<name>_<variant>, tokenizers/<name>_<vocab>_bpe.model")
    parser.add_argument("--variant", nargs="+", default=[default],
                        help=f"tokenizer variants from tokenizer_specs.json: {' '.join(specs)}, or 'all' (default {default})")
    parser.add_argument("--val-docs", type=int, default=None, help="the first N documents are validation (default: hash split)")
    parser.add_argument("--tokenizer-docs", type=int, default=None,
                        help="train the tokenizer on at most N documents (the profile says which: the file's first, or train)")
    parser.add_argument("--profile", choices=sorted(profiles), default=DEFAULT_PROFILE,
                        help="tokenizer settings from tokenizer_specs.json (default %(default)s: the challenge's own)")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--id-field", default="id")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where datasets/ and tokenizers/ go (default: this folder)")
    parser.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS, help="tokens per shard (default %(default)s)")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    variants = resolve_variants(args.variant, specs)
    source = JsonlSource(args.input, args.name, args.val_docs, text_field=args.text_field, id_field=args.id_field)
    print(f"{args.name}: {source.num_documents:,} documents in {args.input}")
    manifests = [build_dataset(source, spec, args.data_dir, profiles[args.profile], args.shard_tokens, args.tokenizer_docs)
                 for spec in variants]
    print(f"{args.name}: done in {time.perf_counter() - t0:.1f} s")
    return manifests


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
