"""A local stand-in for the Hugging Face hub's file endpoints, on 127.0.0.1 only, for testing
data/download_challenge.py through huggingface_hub's real download code, and the field's dataset repos laid
out as they are published (`field_repos`).

It answers what hf_hub_download asks: HEAD/GET /datasets/<owner>/<repo>/resolve/<revision>/<path> with
X-Repo-Commit and ETag headers. Like the hub, large files (.bin here) are LFS: the resolve URL
redirects to a content-addressed URL on another origin, a second port standing in for the CDN
(X-Linked-Etag, X-Linked-Size on the redirect), which serves byte ranges.
`drop_after[path] = n` makes the next GET of that file send n bytes and then close the connection.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

# The repos as the field publishes them (facts from the challenge's repository; see data/README.md).
CHALLENGE_REPO = "willdepueoai/parameter-golf"  # sp1024, and the byte tokenizer listed under `path`
FIELD_REPO = "kevclark/parameter-golf"  # sp4096 and sp8192
CASEOPS_REPO = "romeerp/parameter-golf-caseops-v1"  # CaseOps sp8192, with val byte sidecars
CASEOPS_VARIANT = "sp8192_lossless_caps_caseops_v1_reserved"
CASEOPS_TOKENIZER = "fineweb_8192_bpe_lossless_caps_caseops_v1_reserved"
PURE_BYTE_JSON = {"tokenizer_type": "pure_byte", "vocab_size": 260,
                  "config": {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "byte_offset": 4, "byte_count": 256}}


def shard_bytes(tokens) -> bytes:
    """A shard file's bytes, written here independently of data/shards.py: 256 int32 header, uint16 tokens."""
    tokens = np.asarray(tokens, dtype="<u2")
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, tokens.size)
    return header.tobytes() + tokens.tobytes()


def export(variants: list[dict], tokenizers: list[dict], root: str = "datasets", seed: int = 0) -> dict[str, bytes]:
    """The files of one repo as the challenge's exporter lays them out below `root`: manifest.json,
    datasets/fineweb10B_<variant>/fineweb_{train,val}_NNNNNN.bin (+ fineweb_val_bytes_NNNNNN.bin where a variant
    has `sidecars`), and each tokenizer's files (model_path / vocab_path, or the byte tokenizer's `path`).
    A variant: {"name", "tokenizer", "vocab", "train", "val", "sidecars"}; documents are BOS + a few tokens."""
    rng = np.random.default_rng(seed)
    files, datasets = {}, []
    for v in variants:
        folder = f"datasets/fineweb10B_{v['name']}"
        for split in ("train", "val"):
            for i in range(v[split]):
                tokens = np.concatenate([[1], rng.integers(4, v["vocab"], size=150 + 10 * i)])
                files[f"{folder}/fineweb_{split}_{i:06d}.bin"] = shard_bytes(tokens)
                if split == "val" and v.get("sidecars"):
                    counts = np.where(tokens == 1, 0, rng.integers(0, 6, size=tokens.size))
                    files[f"{folder}/fineweb_val_bytes_{i:06d}.bin"] = shard_bytes(counts)
        entry = {"name": f"fineweb10B_{v['name']}", "tokenizer_name": v["tokenizer"], "path": folder,
                 "train_glob": f"{folder}/fineweb_train_*.bin", "val_glob": f"{folder}/fineweb_val_*.bin",
                 "vocab_size": v["vocab"], "bos_id": 1, "eos_id": 2,
                 "stats": {"files_train": v["train"], "files_val": v["val"], "files_total": v["train"] + v["val"]}}
        if v.get("sidecars"):
            entry["val_bytes_glob"] = f"{folder}/fineweb_val_bytes_*.bin"
        datasets.append(entry)
    for tok in tokenizers:
        for key in ("model_path", "vocab_path"):
            if key in tok:
                files[tok[key]] = f"stand-in {key} of {tok['name']}".encode()
        if "path" in tok:  # the byte tokenizer: the challenge's exporter writes sorted keys, indent 2
            files[tok["path"]] = (json.dumps(PURE_BYTE_JSON, indent=2, sort_keys=True) + "\n").encode()
    files["manifest.json"] = json.dumps({"version": "10B", "datasets": datasets, "tokenizers": tokenizers}).encode()
    return {f"{root}/{path}" if root else path: data for path, data in files.items()}


def sp_tokenizer(vocab: int, name: str | None = None, stem: str | None = None, **extra) -> dict:
    stem = stem or f"fineweb_{vocab}_bpe"
    return {"name": name or f"sp_bpe_{vocab}", "kind": "sentencepiece_bpe", "vocab_size": vocab, "bos_id": 1,
            "eos_id": 2, "model_path": f"tokenizers/{stem}.model", "vocab_path": f"tokenizers/{stem}.vocab", **extra}


def field_repos(sp1024_train: int = 3) -> dict[str, dict[str, bytes]]:
    """The three repos the field downloads from, each rooted at `datasets/` like the real ones."""
    byte_tok = {"name": "pure_byte_260", "kind": "byte", "vocab_size": 260, "bos_id": 1, "eos_id": 2,
                "path": "tokenizers/fineweb_pure_byte_260.json", "pad_id": 0, "unk_id": 3}
    return {
        CHALLENGE_REPO: export(
            [{"name": "sp1024", "tokenizer": "sp_bpe_1024", "vocab": 1024, "train": sp1024_train, "val": 1},
             {"name": "byte260", "tokenizer": "pure_byte_260", "vocab": 260, "train": 1, "val": 1}],
            [sp_tokenizer(1024), byte_tok], seed=1),
        FIELD_REPO: export(
            [{"name": "sp4096", "tokenizer": "sp_bpe_4096", "vocab": 4096, "train": 2, "val": 1},
             {"name": "sp8192", "tokenizer": "sp_bpe_8192", "vocab": 8192, "train": 2, "val": 1}],
            [sp_tokenizer(4096), sp_tokenizer(8192)], seed=2),
        CASEOPS_REPO: export(
            [{"name": CASEOPS_VARIANT, "tokenizer": "sp_bpe_8192_lossless_caps_caseops_v1_reserved", "vocab": 8192,
              "train": 2, "val": 1, "sidecars": True}],
            [sp_tokenizer(8192, "sp_bpe_8192_lossless_caps_caseops_v1_reserved", CASEOPS_TOKENIZER,
                          text_transform="lossless_caps_caseops_v1", reserve_text_transform_controls=True)], seed=3),
    }


class HubStandIn:
    def __init__(self, repos: dict[str, dict[str, bytes]]):
        """repos: {"owner/name": {path in the repo: file bytes}}."""
        self.repos = repos
        # Like a git commit, the revision names the content: the library trusts a cached commit's files.
        self.commits = {repo: hashlib.sha1(b"".join(hashlib.sha256(k.encode() + v).digest()
                                                    for k, v in sorted(files.items()))).hexdigest()
                        for repo, files in repos.items()}
        self.blobs = {hashlib.sha256(data).hexdigest(): (repo, path, data)
                      for repo, files in repos.items() for path, data in files.items()}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.drop_after: dict[str, int] = {}
        self.servers = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler()) for _ in range(2)]  # hub, CDN
        self.endpoint, self.cdn = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)
        self.threads = []
        for server in self.servers:
            server.daemon_threads = True
            self.threads.append(threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True))

    def __enter__(self) -> "HubStandIn":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for server, thread in zip(self.servers, self.threads):
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

    def gets(self, repo: str, path: str) -> list[str | None]:
        """Range headers of the GETs that fetched `path`'s content from `repo`."""
        sha = hashlib.sha256(self.repos[repo][path]).hexdigest()
        return [rng for method, p, rng in self.requests if method == "GET" and p in (f"/lfs/{sha}", self.resolve_url(repo, path))]

    def repos_asked(self) -> set[str]:
        """The repos whose files were asked for."""
        return {m.group(1) for _, p, _ in self.requests if (m := re.match(r"^/datasets/([^/]+/[^/]+)/resolve/", p))}

    @staticmethod
    def resolve_url(repo: str, path: str) -> str:
        return f"/datasets/{repo}/resolve/main/{path}"

    def _handler(self):
        hub = self
        resolve = re.compile(r"^/datasets/([^/]+/[^/]+)/resolve/[^/]+/(.+)$")

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a stuck client cannot hold a server thread forever

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def not_found(self, headers: dict):
                self.send_response(404)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def answer(self, body: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if m := resolve.match(self.path):
                    repo, path = m.groups()
                    if repo not in hub.repos:
                        self.not_found({"X-Error-Code": "RepoNotFound"})
                        return
                    commit = hub.commits[repo]
                    if path not in hub.repos[repo]:
                        self.not_found({"X-Repo-Commit": commit, "X-Error-Code": "EntryNotFound"})
                        return
                    data = hub.repos[repo][path]
                    sha = hashlib.sha256(data).hexdigest()
                    if path.endswith(".bin"):  # LFS: redirect to the content-addressed blob
                        self.send_response(302)
                        self.send_header("Location", f"{hub.cdn}/lfs/{sha}")
                        self.send_header("X-Repo-Commit", commit)
                        self.send_header("X-Linked-Etag", f'"{sha}"')
                        self.send_header("X-Linked-Size", str(len(data)))
                        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_data(path, data, body, {"X-Repo-Commit": commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
                    return
                if self.path.startswith("/lfs/") and (blob := hub.blobs.get(self.path.removeprefix("/lfs/"))):
                    self.send_data(blob[1], blob[2], body, {})
                    return
                self.not_found({})

            def send_data(self, path: str, data: bytes, body: bool, headers: dict):
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not body:
                    return
                payload = data[start:]
                if path in hub.drop_after:  # a connection that dies mid-file
                    payload = payload[:hub.drop_after.pop(path)]
                    self.wfile.write(payload)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(payload)

        return Handler
