"""Bytes of real artifacts under each compressor and byte layout: which should the export use?

    pip install zstandard brotli pyppmd zpaq; apt-get install lrzip   # a missing compressor is skipped
    python bench/compressors.py logs/<run>_model.int6_brotli.ptz [more artifacts] \
        [--compressors brotli-11 lzma-9e ...] [--layouts export grouped ...]

Each artifact is decompressed and unpickled as the export wrote it (train_gpt's COMPRESSORS, weights_only),
so the integers, scales and float tensors are exactly the artifact's. Layouts of those same numbers:
- `export`: torch.save of the quantized dict, what the artifact holds;
- `grouped`: the integer matrices one after another by kind (embedding, then each attention matrix across
  the layers, then each MLP matrix), then the scales and floats: the compressor meets one kind at a time;
- `grouped+transposed`: each integer matrix column by column (the field's best entry does this before lrzip);
- `grouped+sorted`: the rows of the embedding, c_q and the MLP's fc in a greedy nearest-neighbour order (L1),
  the permutation stored beside them as uint16 (the field's "simsort"): similar rows side by side;
- `+shuffle` on each: the fp16/fp32 floats split into byte planes (high bytes together).
Every layout's bytes include everything the loader would need (the pickle framing is replaced by raw bytes,
so the layouts are a few KB smaller than a real file would be: compare them with each other, and `export`
with the artifact).
"""

import argparse
import bz2
import importlib
import importlib.util
import io
import lzma
import shutil
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from run_files import tg


def lrzip(raw: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blob"
        path.write_bytes(raw)
        command = ["lrzip", "-z", "-L", "9", "-q", "-f", str(path)]
        subprocess.run(command, check=True, capture_output=True)
        return (Path(folder) / "blob.lrz").read_bytes()


def zstd(raw: bytes) -> bytes:
    return importlib.import_module("zstandard").ZstdCompressor(level=22).compress(raw)


def brotli(raw: bytes) -> bytes:
    return importlib.import_module("brotli").compress(raw, quality=11)


def ppmd(raw: bytes) -> bytes:
    return importlib.import_module("pyppmd").compress(raw, max_order=8, mem_size=1 << 28)


def optional(module: str, compress):
    """compress if its package is installed, else None (the compressor is skipped)."""
    return compress if importlib.util.find_spec(module) else None


# zlib and zpaq: the export's own; brotli without the 6-byte tag the export puts before its bytes
COMPRESSORS = {
    "zlib-9": partial(tg.compress, name="zlib"),
    "bz2-9": partial(bz2.compress, compresslevel=9),
    "lzma-9e": partial(lzma.compress, preset=9 | lzma.PRESET_EXTREME),
    "zstd-22": optional("zstandard", zstd),
    "brotli-11": optional("brotli", brotli),
    "ppmd-o8": optional("pyppmd", ppmd),
    "zpaq-5": optional("zpaq", partial(tg.compress, name="zpaq")),
    "lrzip-zpaq": lrzip if shutil.which("lrzip") else None,
}
KINDS = ("tok_emb", "attn.c_q", "attn.c_k", "attn.c_v", "attn.proj", "attn.attn_gate", "mlp.fc", "mlp.proj")


def quantized(path: Path) -> dict:
    """The artifact's quantized dict, exactly as the export wrote it."""
    try:
        raw = tg.decompress(path.read_bytes(), path)
    except tg.ConfigError as e:
        raise SystemExit(f"{e} ({', '.join(tg.COMPRESSORS)}); pass an artifact, logs/<run>_model.<export>.ptz")
    return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)


def shuffled(t: torch.Tensor) -> bytes:
    """The tensor's bytes as planes: every element's first byte, then every second byte, ..."""
    raw = t.contiguous().view(torch.uint8).numpy().reshape(-1, t.element_size())
    return np.ascontiguousarray(raw.T).tobytes()


def similarity_order(rows: torch.Tensor) -> torch.Tensor:
    """A greedy chain through the rows, each followed by the nearest (L1) row not yet taken, from row 0."""
    x = rows.float()
    taken = torch.zeros(len(x), dtype=torch.bool)
    taken[0] = True
    order = [0]
    for _ in range(len(x) - 1):
        distance = (x - x[order[-1]]).abs().sum(1)
        distance[taken] = float("inf")
        order.append(int(distance.argmin()))
        taken[order[-1]] = True
    return torch.tensor(order)


def kind_order(name: str) -> tuple[int, str]:  # by KINDS, then by name (so by layer)
    kind = next((i for i, k in enumerate(KINDS) if k in name), len(KINDS))
    return kind, name


def layouts(obj: dict) -> dict[str, bytes]:
    ints = obj["ints"]
    names = sorted(ints, key=kind_order)
    floats = [t for t in obj["floats"].values() if t.is_floating_point()] + list(obj["scales"].values())
    plain = b"".join(t.contiguous().view(torch.uint8).numpy().tobytes() for t in floats)
    planes = b"".join(shuffled(t) for t in floats)
    sort_kinds = ("tok_emb", "attn.c_q", "mlp.fc")
    sorted_parts = []
    for name in names:
        q = ints[name]
        if any(k in name for k in sort_kinds):
            order = similarity_order(q)
            sorted_parts.append(q[order].numpy().tobytes() + order.to(torch.int16).numpy().tobytes())
        else:
            sorted_parts.append(q.numpy().tobytes())
    variants = {
        "grouped": b"".join(ints[n].numpy().tobytes() for n in names),
        "grouped+transposed": b"".join(ints[n].T.contiguous().numpy().tobytes() for n in names),
        "grouped+sorted": b"".join(sorted_parts),
    }
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    out = {"export": buffer.getvalue()}
    for name, blob in variants.items():
        out[name] = blob + plain
        out[name + "+shuffle"] = blob + planes
    return out


def main():
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    installed = [name for name, compress in COMPRESSORS.items() if compress]
    parser.add_argument("--compressors", nargs="+", default=installed, choices=installed)
    parser.add_argument("--layouts", nargs="+", help="only these layouts (default: all)")
    args = parser.parse_args()
    columns = " ".join(f"{c:>11}" for c in args.compressors)
    print(f"{'artifact':<30} {'layout':<27} {'raw':>11} {columns}")
    for path in args.artifacts:
        obj = quantized(path)
        for name, blob in layouts(obj).items():
            if args.layouts and name not in args.layouts:
                continue
            sizes = []
            seconds = []
            for compressor in args.compressors:
                t0 = time.perf_counter()
                sizes.append(f"{len(COMPRESSORS[compressor](blob)):>11,}")
                seconds.append(f"{time.perf_counter() - t0:.0f}s")
            print(f"{path.name[:30]:<30} {name:<27} {len(blob):>11,} {' '.join(sizes)}   "
                  f"({', '.join(seconds)})", flush=True)


if __name__ == "__main__":
    main()
