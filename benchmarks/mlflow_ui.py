"""A real `mlflow server` on a free loopback port, for what renders MLflow's UI: the analysis
benchmark's compare-view screenshot and the UI tests.

    with mlflow_server(["server", "--backend-store-uri", uri], log) as url:
        ...  # url answers /health with OK
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from workflows.cluster import free_port


@contextmanager
def mlflow_server(args: list[str], log: Path, timeout_s: float = 180.0,
                  wrapper: tuple[str, ...] = (), env: dict | None = None) -> Iterator[str]:
    """`python -m mlflow <args>` (`server ...` or `ui ...`; a --port in `args` is replaced) on
    127.0.0.1 at a free port with one worker, in its own process group so that its uvicorn
    workers end with it. Yields its URL once /health answers OK; a server that exits or does
    not answer within `timeout_s` is a RuntimeError with the end of its log. `wrapper`: a
    command that runs the server (infra/mlflow/auth-entrypoint.sh), `env` its environment."""
    args = list(args)
    port = str(free_port())
    if "--port" in args:
        args[args.index("--port") + 1] = port
    else:
        args += ["--port", port]
    log = Path(log)
    with open(log, "w") as out:
        proc = subprocess.Popen([*wrapper, sys.executable, "-m", "mlflow", *args, "--host",
                                 "127.0.0.1", "--workers", "1"], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.read().strip() == b"OK":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                why = "exited" if proc.poll() is not None else f"did not answer in {timeout_s} s"
                raise RuntimeError(f"mlflow server {why}; the end of its log ({log}):\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
