"""The MLflow UI on a workflow's store: the `mlflow ui` command the workflow printed (`mlflow ui`
is `mlflow server`) on loopback, and the compare view of the runs it printed, opened in headless
Chromium (Debian's `chromium`); the rendered page must name the runs and show their BLEU. Keeps
a screenshot in test-artifacts/mlflow_compare.png.

    timeout 900 .venv/bin/python -m pytest tests/test_mlflow_ui.py -q
"""

from __future__ import annotations

import html
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
# Flags that work in this container (no GPU, no sandbox, no network beyond loopback).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--window-size=1600,2600"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no Chromium: `apt-get update && apt-get install -y chromium` (.ci/run does it)")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(smoke_workflow, tmp_path):
    """The `mlflow ui ...` command the workflow printed (`mlflow ui` is `mlflow server`) on a
    free loopback port, one worker process."""
    (printed,) = re.findall(r"^\s*(mlflow ui .*)$", smoke_workflow.stdout, flags=re.M)
    args = printed.split()[1:]
    assert args[args.index("--backend-store-uri") + 1] == smoke_workflow.tracking_uri
    port = _free_port()
    args[args.index("--port") + 1] = str(port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", *args, "--host", "127.0.0.1", "--workers", "1"],
        stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)  # its own process group: uvicorn workers end with it
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.read().strip() == b"OK":
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 180 s"
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _render(chromium: str, url: str, profile: Path, budget_s: int,
            *mode: str) -> subprocess.CompletedProcess:
    """One headless Chromium run; the page's JavaScript gets `budget_s` of virtual time."""
    return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--virtual-time-budget={budget_s * 1000}",
                           f"--user-data-dir={profile}", *mode, url],
                          capture_output=True, text=True, timeout=300)


def _page_text(dom: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))


def _shown(value: float) -> str:
    """A metric as the compare table prints it: 4 significant digits, at most 3 decimals."""
    decimals = min(3, max(0, 3 - math.floor(math.log10(abs(value))))) if value else 0
    return f"{value:.{decimals}f}"


@pytest.mark.slow
def test_compare_view_shows_the_runs_and_their_bleu(smoke_workflow, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    chromium = _chromium()
    # The compare link the workflow printed, pointed at this server.
    (link,) = re.findall(r"compare: (\S+)", smoke_workflow.stdout)
    url = mlflow_server + link[link.index("/#/"):]
    ids = re.findall(r'"([0-9a-f]{32})"', link)
    client = MlflowClient(smoke_workflow.tracking_uri)
    runs = [client.get_run(i) for i in ids]
    assert len(runs) == 3  # the parent and the two evaluation runs

    expected = [f"Comparing {len(runs)} Runs", "bleu_tokenized", "chrf"]
    expected += [r.info.run_name for r in runs] + [_shown(r.data.metrics["bleu"]) for r in runs]
    ARTIFACTS.mkdir(exist_ok=True)
    # The UI fetches runs after its scripts load; a loaded machine may need a longer budget.
    for attempt, budget in enumerate((30, 60, 120)):
        proc = _render(chromium, url, tmp_path / f"profile-dom{attempt}", budget, "--dump-dom")
        assert proc.returncode == 0, proc.stderr[-2000:]
        text = _page_text(proc.stdout)
        missing = [e for e in expected if e not in text]
        if not missing:
            break
    else:
        (ARTIFACTS / "mlflow_compare.txt").write_text(text)
        pytest.fail(f"the compare view lacks {missing} (page text in "
                    f"test-artifacts/mlflow_compare.txt)")

    shot = ARTIFACTS / "mlflow_compare.png"
    shot.unlink(missing_ok=True)
    proc = _render(chromium, url, tmp_path / "profile-shot", budget, f"--screenshot={shot}")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
