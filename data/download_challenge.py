"""Download the challenge's published shards and tokenizer of one variant from the Hugging Face hub.

    python data/download_challenge.py                                   # sp1024, every train shard
    python data/download_challenge.py --variant sp1024 --train-shards 8  # 8 of 80 train shards + val

Files land where train_gpt.py looks by default: datasets/fineweb10B_<variant>/fineweb_*.bin and
tokenizers/fineweb_<vocab>_bpe.model. Each file goes through huggingface_hub's cache (which resumes
a transfer cut mid-file with an HTTP Range request) and is hard-linked out of it, so it costs no
extra disk (a copy when the cache is on another filesystem). A rerun reuses every file whose size
matches the hub's and whose shard header is consistent, so an interrupted run picks up where it
stopped. The repo's `<remote-root>/manifest.json` lists the variants; see data/README.md for the
fields read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python data/download_challenge.py`: import through the `data` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from tqdm import tqdm

from data.shards import read_datafile_header, shard_name
from data.text_tokenizers import DATA_DIR

DEFAULT_REPO_ID = "willdepueoai/parameter-golf"  # the challenge's dataset repo; not verifiable offline
DEFAULT_REMOTE_ROOT = "datasets"


@dataclass
class RemoteFile:
    remote_path: str  # in the repo, below the remote root
    local_path: Path
    listed_size: int | None  # from the manifest, when it lists sizes


def dataset_dir_name(variant: str) -> str:
    return f"fineweb10B_{variant}"


def plan_files(manifest: dict, variant: str, train_shards: int | None, data_dir: Path) -> list[RemoteFile]:
    """The files of one variant: the first `train_shards` train shards (all when None), every val
    shard, and the tokenizer's files."""
    entries = {d["name"]: d for d in manifest.get("datasets", [])}
    name = dataset_dir_name(variant)
    if name not in entries:
        known = sorted(n.removeprefix("fineweb10B_") for n in entries)
        raise ValueError(f"unknown variant {variant!r}: the manifest lists {known}; pass --variant one of them")
    entry = entries[name]
    # Shards: an explicit `files` list ({"name", "size"}) or the counts in `stats`.
    if "files" in entry:
        listed = {f["name"]: int(f["size"]) for f in entry["files"]}
    else:
        stats = entry["stats"]
        listed = {shard_name(split, i): None
                  for split, key in (("train", "files_train"), ("val", "files_val")) for i in range(int(stats[key]))}
    train = sorted(n for n in listed if n.startswith("fineweb_train_"))
    val = sorted(n for n in listed if n.startswith("fineweb_val_"))
    if not val:
        raise ValueError(f"the manifest lists no val shards for {name}; check --repo-id and --remote-root")
    if train_shards is not None:
        if not 0 <= train_shards <= len(train):
            raise ValueError(f"--train-shards {train_shards}: {name} has {len(train)} train shards; "
                             f"pass 0..{len(train)}")
        train = train[:train_shards]
    files = [RemoteFile(f"datasets/{name}/{n}", data_dir / "datasets" / name / n, listed[n]) for n in val + train]
    tokenizers = {t["name"]: t for t in manifest.get("tokenizers", [])}
    if entry.get("tokenizer_name") not in tokenizers:
        raise ValueError(f"the manifest's {name} names tokenizer {entry.get('tokenizer_name')!r}, "
                         f"which is not among its tokenizers {sorted(tokenizers)}")
    tok = tokenizers[entry["tokenizer_name"]]
    for key in ("model_path", "vocab_path"):
        if key in tok:
            files.append(RemoteFile(tok[key], data_dir / "tokenizers" / Path(tok[key]).name, None))
    return files


def file_ok(path: Path, size: int) -> bool:
    if not path.is_file() or path.stat().st_size != size:
        return False
    if path.suffix == ".bin":
        try:
            read_datafile_header(path)
        except ValueError:
            return False
    return True


def link_or_copy(src: Path, dst: Path) -> str:
    """Put `src` at `dst` atomically: a hard link when both are on one filesystem, else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        how = "linked"
    except OSError:
        shutil.copyfile(src, tmp)
        how = "copied"
    os.replace(tmp, dst)
    return how


def download(variant: str, train_shards: int | None, data_dir: Path, repo_id: str = DEFAULT_REPO_ID,
             remote_root: str = DEFAULT_REMOTE_ROOT, revision: str = "main", endpoint: str | None = None,
             cache_dir: str | None = None) -> dict:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    t0 = time.perf_counter()
    hub = dict(repo_id=repo_id, repo_type="dataset", revision=revision)

    def remote(path: str) -> str:
        return f"{remote_root}/{path}" if remote_root else path

    manifest_path = hf_hub_download(filename=remote("manifest.json"), cache_dir=cache_dir, endpoint=endpoint, **hub)
    manifest = json.loads(Path(manifest_path).read_text())
    files = plan_files(manifest, variant, train_shards, data_dir)
    counts = {"linked": 0, "copied": 0, "reused": 0}
    total_bytes = 0
    for f in tqdm(files, desc=f"{dataset_dir_name(variant)} files", unit="file"):
        size = get_hf_file_metadata(hf_hub_url(filename=remote(f.remote_path), endpoint=endpoint, **hub)).size
        if f.listed_size is not None and size != f.listed_size:
            raise ValueError(f"{remote(f.remote_path)}: the manifest lists {f.listed_size} bytes but the hub serves "
                             f"{size}; the repo is inconsistent, check --repo-id/--revision")
        total_bytes += size
        if file_ok(f.local_path, size):
            counts["reused"] += 1
            continue
        cached = Path(os.path.realpath(hf_hub_download(filename=remote(f.remote_path), cache_dir=cache_dir,
                                                       endpoint=endpoint, **hub)))
        if not file_ok(cached, size):
            raise ValueError(f"{remote(f.remote_path)}: downloaded {cached.stat().st_size} bytes, expected {size} "
                             f"(or its shard header is inconsistent); delete {cached} and rerun")
        counts[link_or_copy(cached, f.local_path)] += 1
    tokens = sum(read_datafile_header(f.local_path) for f in files if f.local_path.suffix == ".bin")
    seconds = time.perf_counter() - t0
    shards = sum(f.local_path.suffix == ".bin" for f in files)
    print(f"{dataset_dir_name(variant)}: {len(files)} files ({shards} shards, {tokens:,} tokens, {total_bytes:,} bytes): "
          f"{counts['linked']} linked and {counts['copied']} copied from the hub cache, {counts['reused']} reused, "
          f"{seconds:.1f} s, {tokens / seconds:,.0f} tokens/s")
    return {"files": files, "tokens": tokens, "bytes": total_bytes, **counts}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="sp1024", help="sp1024 (default), or another variant the manifest lists")
    parser.add_argument("--train-shards", type=int, default=None, help="first N train shards (default: all)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where datasets/ and tokenizers/ go (default: this folder)")
    parser.add_argument("--repo-id", default=DEFAULT_REPO_ID, help="hub dataset repo (default %(default)s)")
    parser.add_argument("--remote-root", default=DEFAULT_REMOTE_ROOT, help="folder of manifest.json in the repo (default %(default)s)")
    parser.add_argument("--revision", default="main")
    parser.add_argument("--endpoint", default=None, help="hub URL (default: $HF_ENDPOINT or huggingface.co)")
    parser.add_argument("--cache-dir", default=None, help="huggingface_hub cache (default: $HF_HUB_CACHE)")
    args = parser.parse_args(argv)
    return download(args.variant, args.train_shards, args.data_dir, args.repo_id, args.remote_root,
                    args.revision, args.endpoint, args.cache_dir)


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")
