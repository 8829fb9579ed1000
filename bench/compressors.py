"""Bytes of real artifacts under each compressor and byte layout: which compressor and layout should the export use?

    pip install zstandard brotli pyppmd zpaq; apt-get install lrzip   # a compressor that is missing is skipped
    python bench/compressors.py logs/<run>_model.int6_brotli.ptz [more artifacts] [--compressors brotli lzma ...]

Each artifact is decompressed and unpickled as the export wrote it (train_gpt's COMPRESSORS, weights_only), so the
integers, scales and float tensors are exactly the artifact's. Layouts of those same numbers:
- `export`: torch.save of the quantized dict, what the artifact holds;
- `grouped`: the integer matrices one after another by kind (embedding, then each attention matrix across the
  layers, then each MLP matrix), then the scales and floats, so the compressor meets one kind of data at a time;
- `grouped+transposed`: each integer matrix column by column (the field's best entry does this before lrzip);
- `grouped+sorted`: the rows of the embedding, c_q and the MLP's fc in a greedy nearest-neighbour order (L1), the
  permutation stored beside them as uint16 (the field's "simsort"): similar rows side by side;
- `+shuffle` on each: the fp16/fp32 floats split into byte planes (high bytes together).
Every layout's bytes include everything the loader would need (the pickle framing is replaced by raw bytes, so the
layouts are a few KB smaller than a real file would be: compare them with each other, and `export` with the artifact).
"""

import argparse
import bz2
import importlib
import io
import lzma
import shutil
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

from run_files import tg


def lrzip(raw: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blob"
        path.write_bytes(raw)
        subprocess.run(["lrzip", "-z", "-L", "9", "-q", "-f", str(path)], check=True, capture_output=True)
        return (Path(folder) / "blob.lrz").read_bytes()


def optional(module: str, compress):
    try:
        importlib.import_module(module)
        return compress
    except ImportError:
        return None


COMPRESSORS = {
    "zlib-9": lambda b: zlib.compress(b, 9),
    "bz2-9": lambda b: bz2.compress(b, 9),
    "lzma-9e": lambda b: lzma.compress(b, preset=9 | lzma.PRESET_EXTREME),
    "zstd-22": optional("zstandard", lambda b: importlib.import_module("zstandard").ZstdCompressor(level=22).compress(b)),
    "brotli-11": optional("brotli", lambda b: importlib.import_module("brotli").compress(b, quality=11)),
    "ppmd-o8": optional("pyppmd", lambda b: importlib.import_module("pyppmd").compress(b, max_order=8, mem_size=1 << 28)),
    "zpaq-5": optional("zpaq", lambda b: importlib.import_module("zpaq").compress(b, level=5, threads=1)),
    "lrzip-zpaq": lrzip if shutil.which("lrzip") else None,
}
KINDS = ("tok_emb", "attn.c_q", "attn.c_k", "attn.c_v", "attn.proj", "attn.attn_gate", "mlp.fc", "mlp.proj")


def quantized(path: Path) -> dict:
    """The artifact's quantized dict, exactly as the export wrote it."""
    blob = path.read_bytes()
    decompress = next(d for _, d, lead in tg.COMPRESSORS.values() if blob.startswith(lead))
    return torch.load(io.BytesIO(decompress(blob)), map_location="cpu", weights_only=True)


def shuffled(t: torch.Tensor) -> bytes:
    """The tensor's bytes as planes: every element's first byte, then every second byte, ..."""
    raw = t.contiguous().view(torch.uint8).numpy().reshape(-1, t.element_size())
    return np.ascontiguousarray(raw.T).tobytes()


def similarity_order(rows: torch.Tensor) -> torch.Tensor:
    """A greedy chain through the rows, each followed by the nearest (L1) row not yet taken, from row 0."""
    x, n = rows.float(), rows.size(0)
    taken, order = torch.zeros(n, dtype=torch.bool), [0]
    taken[0] = True
    for _ in range(n - 1):
        distance = (x - x[order[-1]]).abs().sum(1)
        distance[taken] = float("inf")
        order.append(int(distance.argmin()))
        taken[order[-1]] = True
    return torch.tensor(order)


def layouts(obj: dict) -> dict[str, bytes]:
    ints = obj["ints"]
    names = sorted(ints, key=lambda n: (next((i for i, k in enumerate(KINDS) if k in n), len(KINDS)), n))
    floats = [t for t in obj["floats"].values() if t.is_floating_point()] + list(obj["scales"].values())
    plain, planes = (b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in floats),
                     b"".join(shuffled(t) for t in floats))
    sort_kinds = ("tok_emb", "attn.c_q", "mlp.fc")
    sorted_parts = []
    for name in names:
        q = ints[name]
        if any(k in name for k in sort_kinds):
            order = similarity_order(q)
            sorted_parts.append(q[order].numpy().tobytes() + order.to(torch.int16).numpy().tobytes())
        else:
            sorted_parts.append(q.numpy().tobytes())
    variants = {"grouped": b"".join(ints[n].numpy().tobytes() for n in names),
                "grouped+transposed": b"".join(ints[n].T.contiguous().numpy().tobytes() for n in names),
                "grouped+sorted": b"".join(sorted_parts)}
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    out = {"export": buffer.getvalue()}
    for name, blob in variants.items():
        out[name] = blob + plain
        out[name + "+shuffle"] = blob + planes
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--compressors", nargs="+", default=[n for n, c in COMPRESSORS.items() if c],
                        choices=[n for n, c in COMPRESSORS.items() if c])
    parser.add_argument("--layouts", nargs="+", help="only these layouts (default: all)")
    args = parser.parse_args()
    print(f"{'artifact':<30} {'layout':<27} {'raw':>11} " + " ".join(f"{c:>11}" for c in args.compressors))
    for path in args.artifacts:
        obj = quantized(path)
        for name, blob in layouts(obj).items():
            if args.layouts and name not in args.layouts:
                continue
            sizes, seconds = [], []
            for compressor in args.compressors:
                t0 = time.perf_counter()
                sizes.append(len(COMPRESSORS[compressor](blob)))
                seconds.append(time.perf_counter() - t0)
            print(f"{path.name[:30]:<30} {name:<27} {len(blob):>11,} " + " ".join(f"{s:>11,}" for s in sizes)
                  + f"   ({', '.join(f'{s:.0f}s' for s in seconds)})", flush=True)


if __name__ == "__main__":
    main()
