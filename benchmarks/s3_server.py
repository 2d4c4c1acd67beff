"""An S3-protocol server on loopback, for the tests and benchmarks of object storage: no S3
service is reachable from the machines this project is tested on.

The server is moto's standalone server mode (`moto_server`, the `moto[server]` package): a
separate process that speaks the S3 REST protocol over HTTP, so pyarrow, boto3, Ray Train and
MLflow reach it exactly as they reach a bucket, through the network path and the standard
environment (AWS_ENDPOINT_URL and credentials). Chosen over MinIO because it installs from
the package registry with pip (MinIO is a separate binary download, which these machines
cannot make) and is maintained with every AWS API change; its S3 implementation covers what
the project uses (PUT / GET / HEAD / list / DELETE, multipart uploads).

    server = LoopbackS3.start()            # on a free port
    os.environ.update(server.env())        # endpoint + test credentials (not secret)
    server.create_bucket("convs2s-test")
    ...
    server.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from workflows.cluster import free_port


def _die_with_parent() -> None:
    """In the server's process (Linux): end it when the process that started it ends, so a
    test session killed mid-run leaves no server behind."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _json_stream(text: str) -> list[dict]:
    """The JSON objects of moto's recording, one after another: moto writes an entry and its
    line end in two writes from the server's request threads, so a large entry (a part
    upload's body) can have another's between them, lines do not delimit entries."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        entry, i = decoder.raw_decode(text, i)
        out.append(entry)


class LoopbackS3:
    """A `moto_server` process on 127.0.0.1:`port`, its data in memory (gone when stopped)."""

    REGION = "us-east-1"

    def __init__(self, port: int, proc: subprocess.Popen, scratch: str | None = None):
        self.port, self.proc, self.scratch = port, proc, scratch

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, port: int | None = None, timeout_s: float = 30.0) -> LoopbackS3:
        exe = Path(sys.executable).parent / "moto_server"
        if not exe.exists():
            raise RuntimeError(f"{exe} not found: install the test extras (pip install -e "
                               "'.[test]', which brings moto[server])")
        port = port or free_port()
        # moto's request recorder (`recorded`) writes its file here, not into the cwd
        scratch = tempfile.mkdtemp(prefix="convs2s-s3-server-")
        proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent,
                                env={**os.environ,
                                     "MOTO_RECORDER_FILEPATH": f"{scratch}/recording"})
        server = cls(port, proc, scratch)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=1).close()
                return server
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError(f"moto_server did not answer on {server.endpoint}")
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        """The standard variables pyarrow, boto3, Ray and MLflow read (test values)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": self.REGION,
                "AWS_DEFAULT_REGION": self.REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        env = self.env()
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.REGION,
                            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key in `bucket` under `prefix`."""
        out, token = [], None
        while True:
            kw = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token}
                                                          if token else {})}
            page = self.client().list_objects_v2(**kw)
            out += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    def _recorder(self, action: str) -> bytes:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}",
                                     method="GET" if action.startswith("download") else "POST")
        with urllib.request.urlopen(req) as r:
            return r.read()

    @contextlib.contextmanager
    def recorded(self):
        """The requests the server answers inside the block, as moto's recorder keeps them
        ({method, url, headers, ...} each; the list is filled when the block ends). Every
        client's requests are recorded: filter by URL."""
        out: list[dict] = []
        self._recorder("reset-recording")
        self._recorder("start-recording")
        try:
            yield out
        finally:
            self._recorder("stop-recording")
            out += _json_stream(self._recorder("download-recording").decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


if __name__ == "__main__":  # a server for trying things by hand: prints its environment
    import argparse

    argparse.ArgumentParser(
        prog="python -m benchmarks.s3_server",
        description="Start an S3-protocol server on loopback (moto) and print the environment "
                    "that reaches it (export lines); Ctrl-C stops it. PORT=N picks the port."
    ).parse_args()
    s = LoopbackS3.start(int(os.environ.get("PORT", 0)) or None)
    print("\n".join(f"export {k}={v}" for k, v in s.env().items()), flush=True)
    try:
        s.proc.wait()
    except KeyboardInterrupt:
        s.stop()
