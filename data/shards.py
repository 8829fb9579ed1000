"""The one shard writer (and reader) shared by every data script, plus atomic-write helpers.

Shard format (the challenge's): 256 little-endian int32 header [20240520, 1, num_tokens, 0, ...],
then num_tokens little-endian uint16 tokens. Files are fineweb_{split}_{index:06d}.bin.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_TOKEN_ID = 65535  # tokens are stored as uint16
SHARD_TOKENS = 100_000_000  # the challenge's shard size


def shard_name(split: str, index: int) -> str:
    return f"fineweb_{split}_{index:06d}.bin"


# -------------------------------------------------------------------------------------------------
# Atomic writes: a temp file in the destination folder, then os.replace, so a reader never sees a
# half-written file and an interrupted run leaves the previous version intact.

def atomic_write_bytes(path: str | os.PathLike, chunks) -> str:
    """Write `chunks` (bytes, or an iterable of bytes-like objects) to `path` atomically.
    Returns the sha256 hex digest of what was written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(chunks, (bytes, bytearray, memoryview)):
        chunks = [chunks]
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def atomic_write_json(path: str | os.PathLike, obj) -> str:
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


# -------------------------------------------------------------------------------------------------
# Shard files

def write_datafile(path: str | os.PathLike, tokens) -> str:
    """Write one shard in the exact challenge format, atomically. `tokens` is any 1-D integer
    sequence (list, numpy array, torch tensor). Returns the file's sha256 hex digest."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"write_datafile({path}): tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"write_datafile({path}): tokens must be integers, got dtype {tokens.dtype}")
    if tokens.size >= 2**31:
        raise ValueError(f"write_datafile({path}): {tokens.size} tokens do not fit the int32 header; "
                         f"write at most {2**31 - 1} tokens per shard")
    if tokens.size:
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi > MAX_TOKEN_ID:
            bad = hi if hi > MAX_TOKEN_ID else lo
            raise ValueError(f"write_datafile({path}): token id {bad} does not fit uint16 (0..{MAX_TOKEN_ID}); "
                             f"shards need a vocabulary of at most {MAX_TOKEN_ID + 1} ids")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, tokens.size)
    body = tokens.astype("<u2", copy=False)
    return atomic_write_bytes(path, [header.tobytes(), body.tobytes()])


def read_datafile_header(path: str | os.PathLike) -> int:
    """Check a shard's header and size; return its token count."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ValueError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte shard header")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: magic {header[0]} != {SHARD_MAGIC}; not a shard in the challenge format")
    if header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: version {header[1]} != {SHARD_VERSION}")
    num_tokens = int(header[2])
    if size != HEADER_BYTES + 2 * num_tokens:
        raise ValueError(f"{path}: size {size} != {HEADER_BYTES} + 2*{num_tokens} from its header; "
                         "the file is truncated or corrupt, delete it and rebuild or re-download")
    return num_tokens


def read_datafile(path: str | os.PathLike) -> np.ndarray:
    num_tokens = read_datafile_header(path)
    return np.fromfile(path, dtype="<u2", count=num_tokens, offset=HEADER_BYTES)


@dataclass
class ShardInfo:
    file: str
    tokens: int
    sha256: str


class ShardWriter:
    """Concatenates documents into fixed-size shards of one split. Documents may straddle shards,
    as in the challenge's data; only the last shard is short."""

    def __init__(self, out_dir: str | os.PathLike, split: str, shard_tokens: int = SHARD_TOKENS):
        if shard_tokens < 1:
            raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
        self.out_dir, self.split, self.shard_tokens = Path(out_dir), split, shard_tokens
        self.buffer = np.empty(shard_tokens, dtype=np.uint16)  # untouched pages cost no memory
        self.fill = 0
        self.shards: list[ShardInfo] = []

    def add(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens)
        while tokens.size:
            take = min(tokens.size, self.shard_tokens - self.fill)
            self.buffer[self.fill:self.fill + take] = tokens[:take]
            self.fill += take
            tokens = tokens[take:]
            if self.fill == self.shard_tokens:
                self._flush()

    def _flush(self) -> None:
        name = shard_name(self.split, len(self.shards))
        sha256 = write_datafile(self.out_dir / name, self.buffer[:self.fill])
        self.shards.append(ShardInfo(name, self.fill, sha256))
        self.fill = 0

    def close(self) -> list[ShardInfo]:
        if self.fill or not self.shards:
            self._flush()
        return self.shards
