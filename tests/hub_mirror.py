"""A Hugging Face hub mirror on loopback, for the hub path's tests (the hub is not reachable
here): it serves a local folder laid out as a dataset repository's files, under revisions that
the test moves, through the HTTP API `huggingface_hub` speaks to any endpoint
(`--hub-endpoint`, HF_ENDPOINT): a dataset's info at a revision, its files' info, and the files
themselves with HTTP ranges.

    with HubMirror(folder, {"main": "a" * 40}) as hub:   # hub.url: the endpoint
        hub.commits["main"] = "b" * 40                   # the branch moves

Every commit serves the same files (a test tells the commits apart by the requests, which name
the revision read: `hub.requests`). Not served as the hub serves them: LFS redirects to its
CDN, `Link` paging of long listings, real object ids (an oid / ETag here is the file's size).
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from urllib.parse import parse_qs, unquote


class HubMirror:
    def __init__(self, folder: Path, commits: dict[str, str]):
        self.folder, self.commits = Path(folder), commits
        self.requests: list[str] = []  # "METHOD path" of each request, in order
        self._seen = set(commits.values())
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                mirror._answer(self, body=True)

            def do_HEAD(self):
                mirror._answer(self, body=False)

            def do_POST(self):
                mirror._answer(self, body=True)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "HubMirror":
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _commit(self, rev: str) -> str | None:
        """The commit `rev` resolves to: a branch's or tag's now, or a commit a revision has
        stood at (the hub keeps a moved branch's commits)."""
        rev = unquote(rev)
        self._seen.update(self.commits.values())
        return self.commits.get(rev, rev if rev in self._seen else None)

    def _files(self) -> list[str]:
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*")
                      if p.is_file())

    def _answer(self, h, body: bool) -> None:
        path, _, query = h.path.partition("?")
        self.requests.append(f"{h.command} {path}")
        data = b""
        if h.command == "POST":
            data = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        parts = path.split("/")
        # /api/datasets/<owner>/<name>/revision/<rev>
        if path.startswith("/api/datasets/") and parts[5:6] == ["revision"]:
            sha = self._commit(parts[6])
            if sha is None:
                return self._send(h, 404, {"error": "Revision not found"}, body,
                                  {"X-Error-Code": "RevisionNotFound"})
            return self._send(h, 200, {"id": "/".join(parts[3:5]), "sha": sha,
                                       "siblings": [{"rfilename": f} for f in self._files()]},
                              body)
        # /api/datasets/<owner>/<name>/tree/<rev>[/<folder>]?recursive=...
        if path.startswith("/api/datasets/") and parts[5:6] == ["tree"]:
            sha, under = self._commit(parts[6]), unquote("/".join(parts[7:]))
            top = self.folder / under
            if sha is None:
                return self._send(h, 404, {"error": "Revision not found"}, body,
                                  {"X-Error-Code": "RevisionNotFound"})
            if not top.is_dir():
                return self._send(h, 404, {"error": "Entry not found"}, body,
                                  {"X-Error-Code": "EntryNotFound"})
            deep = parse_qs(query).get("recursive", ["false"])[0].lower() == "true"
            found = sorted(top.rglob("*") if deep else top.iterdir())
            return self._send(h, 200, [self._entry(f) for f in found], body)
        # /api/datasets/<owner>/<name>/paths-info/<rev>  (form or JSON: paths=...)
        if path.startswith("/api/datasets/") and parts[5:6] == ["paths-info"]:
            if self._commit(parts[6]) is None:
                return self._send(h, 404, {"error": "Revision not found"}, body,
                                  {"X-Error-Code": "RevisionNotFound"})
            try:
                asked = json.loads(data).get("paths", [])
            except ValueError:
                asked = parse_qs(data.decode()).get("paths", [])
            found = [self.folder / p for p in ([asked] if isinstance(asked, str) else asked)]
            return self._send(h, 200, [self._entry(f) for f in found if f.exists()], body)
        # /datasets/<owner>/<name>/resolve/<rev>/<file path>
        if path.startswith("/datasets/") and parts[4:5] == ["resolve"]:
            sha = self._commit(parts[5])
            f = self.folder / unquote("/".join(parts[6:]))
            if sha is None or not f.is_file():
                return self._send(h, 404, {"error": "Entry not found"}, body,
                                  {"X-Error-Code": "EntryNotFound"})
            blob = f.read_bytes()
            start, end, status = 0, len(blob) - 1, 200
            if rng := h.headers.get("Range"):
                a, _, b = rng.removeprefix("bytes=").partition("-")
                if a:
                    start, end = int(a), min(int(b) if b else len(blob) - 1, len(blob) - 1)
                else:  # the last b bytes
                    start = max(0, len(blob) - int(b))
                status = 206
            chunk = blob[start:end + 1]
            h.send_response(status)
            h.send_header("Content-Length", str(len(chunk)))
            h.send_header("X-Repo-Commit", sha)
            h.send_header("ETag", f'"{len(blob):x}"')
            h.send_header("Accept-Ranges", "bytes")
            if status == 206:
                h.send_header("Content-Range", f"bytes {start}-{end}/{len(blob)}")
            h.end_headers()
            if body:
                h.wfile.write(chunk)
            return None
        return self._send(h, 404, {"error": f"not served here: {h.command} {path}"}, body)

    def _entry(self, f: Path) -> dict:
        """A file's or folder's entry as the hub's tree and paths-info list it."""
        rel = str(f.relative_to(self.folder))
        if f.is_dir():
            return {"type": "directory", "path": rel, "oid": "0" * 40}
        return {"type": "file", "path": rel, "size": f.stat().st_size,
                "oid": f"{f.stat().st_size:040x}"}

    @staticmethod
    def _send(h, status: int, doc, body: bool, headers: dict | None = None) -> None:
        blob = json.dumps(doc).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(blob)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(blob)


def hub_layout(folder: Path, config: str, langs: tuple[str, str], rows: int = 50,
               splits=("train", "validation", "test")) -> Path:
    """`folder` laid out as a translation dataset on the hub (wmt/wmt14's layout:
    <config>/<split>-00000-of-00001.parquet, a `translation` column of {lang: text}), `rows`
    numbered pairs a split in row groups of 10. Returns `folder`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (folder / config).mkdir(parents=True, exist_ok=True)
    for split in splits:
        pairs = [{langs[0]: f"{split} {langs[0]} {i}", langs[1]: f"{split} {langs[1]} {i}"}
                 for i in range(rows)]
        pq.write_table(pa.table({"translation": pairs}),
                       folder / config / f"{split}-00000-of-00001.parquet", row_group_size=10)
    return folder


def served_as_the_hub(url: str, monkeypatch) -> None:
    """This process's hub endpoint is `url`, as HF_ENDPOINT=url set before `huggingface_hub`
    is imported makes it (its file URLs are made from a template of the endpoint at import)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        url + "/{repo_id}/resolve/{revision}/{filename}")
