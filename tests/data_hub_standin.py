"""A local stand-in for the Hugging Face hub's file endpoints, on 127.0.0.1 only, for testing
data/download_challenge.py through huggingface_hub's real download code.

It answers what hf_hub_download asks: HEAD/GET /datasets/<repo>/resolve/<revision>/<path> with
X-Repo-Commit and ETag headers. Like the hub, large files (.bin here) are LFS: the resolve URL
redirects to a content-addressed URL on another origin, a second port standing in for the CDN
(X-Linked-Etag, X-Linked-Size on the redirect), which serves byte ranges.
`drop_after[path] = n` makes the next GET of that file send n bytes and then close the connection.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HubStandIn:
    def __init__(self, repo_id: str, files: dict[str, bytes]):
        self.repo_id, self.files = repo_id, files
        # Like a git commit, the revision names the content: the library trusts a cached commit's files.
        self.commit = hashlib.sha1(b"".join(hashlib.sha256(k.encode() + v).digest() for k, v in sorted(files.items()))).hexdigest()
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

    def gets(self, path: str) -> list[str | None]:
        """Range headers of the GETs that fetched `path`'s content."""
        sha = hashlib.sha256(self.files[path]).hexdigest()
        return [rng for method, p, rng in self.requests if method == "GET" and p in (f"/lfs/{sha}", self._resolve(path))]

    def _resolve(self, path: str) -> str:
        return f"/datasets/{self.repo_id}/resolve/main/{path}"

    def _handler(self):
        hub = self
        resolve = re.compile(rf"^/datasets/{re.escape(self.repo_id)}/resolve/[^/]+/(.+)$")

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a stuck client cannot hold a server thread forever

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def answer(self, body: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if m := resolve.match(self.path):
                    path = m.group(1)
                    if path not in hub.files:
                        self.send_response(404)
                        self.send_header("X-Repo-Commit", hub.commit)
                        self.send_header("X-Error-Code", "EntryNotFound")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    data = hub.files[path]
                    sha = hashlib.sha256(data).hexdigest()
                    if path.endswith(".bin"):  # LFS: redirect to the content-addressed blob
                        self.send_response(302)
                        self.send_header("Location", f"{hub.cdn}/lfs/{sha}")
                        self.send_header("X-Repo-Commit", hub.commit)
                        self.send_header("X-Linked-Etag", f'"{sha}"')
                        self.send_header("X-Linked-Size", str(len(data)))
                        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_data(path, data, body, {"X-Repo-Commit": hub.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})
                    return
                if self.path.startswith("/lfs/"):
                    for path, data in hub.files.items():
                        if hashlib.sha256(data).hexdigest() == self.path.removeprefix("/lfs/"):
                            self.send_data(path, data, body, {})
                            return
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

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
