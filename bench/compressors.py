"""Bytes of real artifacts under each compressor and byte layout: which compressor should the export use?

    pip install zstandard brotli   # optional: rows for the compressors that are missing are skipped
    python bench/compressors.py logs/<run>_model.int6_lzma.ptz [--bits 8 6 5] [--reader records/.../train_gpt.py]

Each artifact is read back (train_gpt.load_artifact) and re-exported at every --bits width with
train_gpt.quantize_state_dict, so the int-N rows of one artifact are the same weights at N bits
(re-quantizing an int6 model at 8 bits keeps its int6 grid: a lower bound on a fresh int8 export's
entropy). Layouts: `pickle` is the export's format, torch.save of the quantized dict (one byte per
integer); `bit-packed` packs each integer into N bits (the export's format before 2026-11-23: 6-bit
values straddle byte boundaries, which hides their distribution from the compressor), then the fp16
scales and float tensors; `grouped` is the integers one byte each, then the scales and floats, so
each compressor sees one kind of data at a time; `grouped+shuffle` also splits the 2- and 4-byte
floats into byte planes (high bytes together), which helps when exponents repeat.
"""

import argparse
import io
import lzma
import zlib
from pathlib import Path

import numpy as np
import torch

from run_files import reader_module, tg

COMPRESSORS = {"zlib-9": lambda b: zlib.compress(b, 9), "lzma-9e": lambda b: lzma.compress(b, preset=9 | lzma.PRESET_EXTREME)}
# the same settings as train_gpt.py's COMPRESSOR options
try:
    import zstandard

    COMPRESSORS["zstd-22"] = lambda b: zstandard.ZstdCompressor(level=22).compress(b)
except ImportError:
    pass
try:
    import brotli

    COMPRESSORS["brotli-11"] = lambda b: brotli.compress(b, quality=11)
except ImportError:
    pass


def shuffled(t: torch.Tensor) -> bytes:
    """The tensor's bytes as planes: every element's first byte, then every second byte, ..."""
    raw = t.contiguous().view(torch.uint8).numpy().reshape(-1, t.element_size())
    return np.ascontiguousarray(raw.T).tobytes()


def pack_bits(q: torch.Tensor, bits: int) -> bytes:
    """Integers in [-(2^(b-1)-1), 2^(b-1)-1] as a dense little-endian bitstream of `bits` per value
    (the export's format before 2026-11-23)."""
    unsigned = (q.flatten().to(torch.int16) + 2 ** (bits - 1) - 1).to(torch.uint8).numpy()
    planes = np.unpackbits(unsigned[:, None], axis=1, bitorder="little")[:, :bits]  # (N, bits)
    return np.packbits(planes.reshape(-1), bitorder="little").tobytes()


def layouts(obj: dict, bits: dict) -> dict[str, bytes]:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    floats = [t for t in obj["floats"].values() if t.is_floating_point()]
    scales = list(obj["scales"].values())
    plain = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in scales + floats)
    shuffled_floats = b"".join(shuffled(t) for t in scales + floats)
    ints = b"".join(t.numpy().tobytes() for t in obj["ints"].values())
    packed = b"".join(pack_bits(t, bits[name]) for name, t in obj["ints"].items())
    return {"pickle": buffer.getvalue(), "bit-packed": packed + plain, "grouped": ints + plain,
            "grouped+shuffle": ints + shuffled_floats}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--bits", type=int, nargs="+", default=[8, 6, 5], choices=tg.QUANT_BITS_CHOICES)
    parser.add_argument("--embed-bits", type=int, default=8, choices=tg.QUANT_BITS_CHOICES)
    parser.add_argument("--reader", type=Path, help="the train_gpt.py whose load_artifact reads the artifacts (a "
                        "record's own copy, for artifacts in an earlier format); default: this repository's")
    args = parser.parse_args()
    reader = reader_module(args.reader)
    print(f"{'artifact':<28} {'bits':>4} {'layout':<16} {'raw':>10} " + " ".join(f"{c:>10}" for c in COMPRESSORS))
    for path in args.artifacts:
        state = reader.load_artifact(path)
        params = sum(t.numel() for t in state.values() if t.is_floating_point())
        for bits in args.bits:
            widths = {name: args.embed_bits if name == "tok_emb.weight" else bits for name in state}
            for name, blob in layouts(tg.quantize_state_dict(state, bits, args.embed_bits), widths).items():
                sizes = [len(compress(blob)) for compress in COMPRESSORS.values()]
                print(f"{path.name[:28]:<28} {bits:>4} {name:<16} {len(blob):>10,} " + " ".join(f"{s:>10,}" for s in sizes)
                      + f"   best {min(sizes) / params:.3f} B/param", flush=True)


if __name__ == "__main__":
    main()
