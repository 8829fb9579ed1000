"""Download the challenge's published shards and tokenizer of one variant from the Hugging Face hub.

    python data/download_challenge.py                            # sp1024: 80 train shards + val
    python data/download_challenge.py --variant sp8192           # the field's sp8192, from kevclark/parameter-golf
    python data/download_challenge.py --variant sp8192_caseops   # CaseOps, with its val byte sidecars
    python data/download_challenge.py --variant sp1024 --train-shards 8

Each variant comes from the dataset repo the field publishes it in (PUBLISHED; data/README.md lists them).
$MATCHED_FINEWEB_REPO_ID and $MATCHED_FINEWEB_REMOTE_ROOT_PREFIX, the challenge's own variables, override that
table, and --repo-id / --remote-root override them. The repo's `<remote-root>/manifest.json` lists the variants;
see data/README.md for the fields read.

Files land where train_gpt.py looks: datasets/fineweb10B_<variant>/fineweb_*.bin, tokenizers/<the file name as
published>, and the manifest at manifest.json, as the challenge's downloader lays them out. Each file goes
through huggingface_hub's cache (which resumes a transfer cut mid-file with an HTTP Range request) and is
hard-linked out of it, so it costs no extra disk (a copy when the cache is on another filesystem). A rerun reuses
every file whose size matches the hub's and whose shard header is consistent, so an interrupted run picks up
where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

DEFAULT_TRAIN_SHARDS = 80  # the challenge's default: 8B training tokens
REPO_ENV, REMOTE_ROOT_ENV = "MATCHED_FINEWEB_REPO_ID", "MATCHED_FINEWEB_REMOTE_ROOT_PREFIX"
CHALLENGE_REPO = "willdepueoai/parameter-golf"  # the challenge's own export: sp1024
FIELD_REPO = "kevclark/parameter-golf"  # the sp4096 and sp8192 the records train on
CASEOPS_REPO = "romeerp/parameter-golf-caseops-v1"  # CaseOps, from the record 2026-04-18_PR1626_CaseOps_Taper
CASEOPS_SUFFIX = "_lossless_caps_caseops_v1_reserved"  # the field's variant name: sp8192_lossless_caps_caseops_v1_reserved
DEFAULT_REMOTE_ROOT = "datasets"
# variant -> (repo, remote root). Not verifiable offline; a variant not listed is looked up in CHALLENGE_REPO, and
# any <sp...>_lossless_caps_caseops_v1_reserved in CASEOPS_REPO.
PUBLISHED = {
    "sp1024": (CHALLENGE_REPO, DEFAULT_REMOTE_ROOT),
    "byte260": (CHALLENGE_REPO, DEFAULT_REMOTE_ROOT),
    "sp4096": (FIELD_REPO, DEFAULT_REMOTE_ROOT),
    "sp8192": (FIELD_REPO, DEFAULT_REMOTE_ROOT),
    f"sp8192{CASEOPS_SUFFIX}": (CASEOPS_REPO, DEFAULT_REMOTE_ROOT),
}
TOKENIZER_FILE_KEYS = ("model_path", "vocab_path", "path")  # a tokenizer entry's files; `path`: the byte tokenizer's JSON


@dataclass
class HubSource:
    repo_id: str
    remote_root: str  # folder of manifest.json in the repo; "" for the repo's root
    why: str  # which setting chose them, for the log


@dataclass
class RemoteFile:
    remote_path: str  # in the repo, below the remote root
    local_path: Path
    listed_size: int | None  # from the manifest, when it lists sizes


def canonical_variant(variant: str) -> str:
    """`sp8192_caseops` is short for the field's name `sp8192_lossless_caps_caseops_v1_reserved`."""
    m = re.fullmatch(r"(sp\d+)_caseops", variant)
    return m.group(1) + CASEOPS_SUFFIX if m else variant


def resolve_source(variant: str, repo_id: str | None = None, remote_root: str | None = None,
                   environ=os.environ) -> HubSource:
    """Where to download `variant` (a canonical name) from: a flag, else the challenge's env var, else where the
    field publishes it. An empty remote root (flag or env var) means the repo's top level."""
    published = PUBLISHED.get(variant) or ((CASEOPS_REPO if variant.endswith(CASEOPS_SUFFIX) else CHALLENGE_REPO),
                                           DEFAULT_REMOTE_ROOT)
    why = []
    if repo_id:
        why.append("--repo-id")
    elif environ.get(REPO_ENV):
        repo_id = environ[REPO_ENV]
        why.append(f"${REPO_ENV}")
    else:
        repo_id = published[0]
    if remote_root is not None:
        why.append("--remote-root")
    elif environ.get(REMOTE_ROOT_ENV) is not None:
        remote_root = environ[REMOTE_ROOT_ENV]
        why.append(f"${REMOTE_ROOT_ENV}")
    else:
        remote_root = published[1]
    remote_root = remote_root.strip("/")
    known = f"where the field publishes {variant}" if variant in PUBLISHED else f"the default repo for {variant}"
    return HubSource(repo_id, remote_root, " and ".join(why) or known)


def dataset_dir_name(variant: str) -> str:
    return f"fineweb10B_{variant}"


def plan_files(manifest: dict, variant: str, train_shards: int | str | None, data_dir: Path) -> list[RemoteFile]:
    """The files of one variant: the first `train_shards` train shards (None: the challenge's default of 80, or
    all when fewer are listed; "all": all), every val shard with its byte sidecar when the manifest lists
    sidecars, and the tokenizer's files."""
    entries = {d["name"]: d for d in manifest.get("datasets", [])}
    name = dataset_dir_name(variant)
    if name not in entries:
        known = sorted(n.removeprefix("fineweb10B_") for n in entries)
        raise ValueError(f"unknown variant {variant!r}: the manifest lists {known}; pass --variant one of them, "
                         "or point --repo-id/--remote-root at the repo that publishes it")
    entry = entries[name]
    # Shards: an explicit `files` list ({"name", "size"}) or the counts in `stats`, with sidecars when the entry
    # has a val_bytes_glob (the CaseOps export's: fineweb_val_bytes_<i>.bin beside each fineweb_val_<i>.bin).
    if "files" in entry:
        listed = {f["name"]: int(f["size"]) for f in entry["files"]}
    else:
        stats = entry["stats"]
        splits = [("train", "files_train"), ("val", "files_val")] + [("val_bytes", "files_val")] * bool(entry.get("val_bytes_glob"))
        listed = {shard_name(split, i): None for split, key in splits for i in range(int(stats[key]))}
    train = sorted(n for n in listed if re.fullmatch(r"fineweb_train_\d+\.bin", n))
    val = sorted(n for n in listed if re.fullmatch(r"fineweb_val_\d+\.bin", n))
    sidecars = sorted(n for n in listed if re.fullmatch(r"fineweb_val_bytes_\d+\.bin", n))
    if not val:
        raise ValueError(f"the manifest lists no val shards for {name}; check --repo-id and --remote-root")
    if sidecars and len(sidecars) != len(val):
        raise ValueError(f"the manifest lists {len(sidecars)} byte sidecars for {len(val)} val shards of {name}; "
                         "the repo is inconsistent")
    if train_shards is None:
        train = train[:DEFAULT_TRAIN_SHARDS]
    elif train_shards != "all":
        if not 0 <= train_shards <= len(train):
            raise ValueError(f"--train-shards {train_shards}: {name} has {len(train)} train shards; "
                             f"pass 0..{len(train)} or all")
        train = train[:train_shards]
    files = [RemoteFile(f"datasets/{name}/{n}", data_dir / "datasets" / name / n, listed[n])
             for n in val + sidecars + train]
    tokenizers = {t["name"]: t for t in manifest.get("tokenizers", [])}
    if entry.get("tokenizer_name") not in tokenizers:
        raise ValueError(f"the manifest's {name} names tokenizer {entry.get('tokenizer_name')!r}, "
                         f"which is not among its tokenizers {sorted(tokenizers)}")
    tok = tokenizers[entry["tokenizer_name"]]
    paths = [tok[key] for key in TOKENIZER_FILE_KEYS if tok.get(key)]
    if not paths:
        raise ValueError(f"the manifest's tokenizer {tok['name']!r} names no file ({' / '.join(TOKENIZER_FILE_KEYS)})")
    files += [RemoteFile(p, data_dir / "tokenizers" / Path(p).name, None) for p in paths]
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


def download(variant: str, train_shards: int | str | None, data_dir: Path, repo_id: str | None = None,
             remote_root: str | None = None, revision: str = "main", endpoint: str | None = None,
             cache_dir: str | None = None) -> dict:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    t0 = time.perf_counter()
    variant = canonical_variant(variant)
    source = resolve_source(variant, repo_id, remote_root)
    hub = dict(repo_id=source.repo_id, repo_type="dataset", revision=revision)
    folder = dataset_dir_name(variant)
    print(f"{folder}: from {source.repo_id}, remote root {source.remote_root or '(top level)'!r} ({source.why})")

    def remote(path: str) -> str:
        return f"{source.remote_root}/{path}" if source.remote_root else path

    manifest_path = Path(hf_hub_download(filename=remote("manifest.json"), cache_dir=cache_dir, endpoint=endpoint, **hub))
    manifest = json.loads(manifest_path.read_text())
    try:
        files = plan_files(manifest, variant, train_shards, data_dir)
    except ValueError as e:
        raise ValueError(f"{source.repo_id}/{remote('manifest.json')} ({source.why}): {e}") from None
    link_or_copy(manifest_path.resolve(), data_dir / "manifest.json")  # as the challenge keeps it: the latest repo's
    counts = {"linked": 0, "copied": 0, "reused": 0}
    total_bytes = 0
    for f in tqdm(files, desc=f"{folder} files", unit="file"):
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
    shard_tokens = {f.local_path.name: read_datafile_header(f.local_path) for f in files if f.local_path.suffix == ".bin"}
    for name, n in shard_tokens.items():
        if name.startswith("fineweb_val_bytes_") and shard_tokens[name.replace("_bytes", "")] != n:
            raise ValueError(f"{folder}/{name} holds {n} values for the {shard_tokens[name.replace('_bytes', '')]} "
                             f"tokens of its val shard; the repo is inconsistent")
    tokens = sum(n for name, n in shard_tokens.items() if not name.startswith("fineweb_val_bytes_"))
    seconds = time.perf_counter() - t0
    train = sum(name.startswith("fineweb_train_") for name in shard_tokens)
    sidecars = sum(name.startswith("fineweb_val_bytes_") for name in shard_tokens)
    tokenizer = next(f.local_path for f in files if f.local_path.parent.name == "tokenizers")
    print(f"{folder}: {len(files)} files ({train} train and {len(shard_tokens) - train - sidecars} val shards"
          + (f", {sidecars} val byte sidecars" if sidecars else "") + f", {tokens:,} tokens, {total_bytes:,} bytes): "
          f"{counts['linked']} linked and {counts['copied']} copied from the hub cache, {counts['reused']} reused, "
          f"{seconds:.1f} s; train with DATA_PATH={data_dir / 'datasets' / folder} TOKENIZER_PATH={tokenizer}")
    return {"files": files, "tokens": tokens, "bytes": total_bytes, "source": source, **counts}


def train_shards_arg(value: str) -> int | str:
    if value == "all":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: pass a number of train shards or all")
    return int(value)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="sp1024",
                        help="sp1024 (default), byte260, sp4096, sp8192, sp8192_caseops (= sp8192" + CASEOPS_SUFFIX
                             + "), or another variant the manifest lists")
    parser.add_argument("--train-shards", type=train_shards_arg, default=None,
                        help=f"first N train shards, or all (default {DEFAULT_TRAIN_SHARDS}, the challenge's; all when fewer are listed)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="where datasets/ and tokenizers/ go (default: this folder)")
    parser.add_argument("--repo-id", default=None,
                        help=f"hub dataset repo (default: ${REPO_ENV}, else where the field publishes the variant)")
    parser.add_argument("--remote-root", default=None,
                        help=f"folder of manifest.json in the repo (default: ${REMOTE_ROOT_ENV}, else {DEFAULT_REMOTE_ROOT})")
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
