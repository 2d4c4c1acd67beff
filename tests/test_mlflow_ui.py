"""The MLflow UI on a workflow's store: the `mlflow ui` command the workflow printed (`mlflow ui`
is `mlflow server`) on loopback, and the pages the workflow printed links to, opened in headless
Chromium (Debian's `chromium`): the compare view must name the runs and show their BLEU, the
runs page the workflow run and its data, the Models view each logged model and its BLEU. Keeps
screenshots in test-artifacts/mlflow_compare.png and mlflow_models.png.

    timeout 900 .venv/bin/python -m pytest tests/test_mlflow_ui.py -q
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import mlflow_ui

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


@pytest.fixture(scope="module")
def mlflow_server(smoke_workflow, tmp_path_factory):
    """The `mlflow ui ...` command the workflow printed (`mlflow ui` is `mlflow server`) on a
    free loopback port, one worker process."""
    (printed,) = re.findall(r"^\s*(mlflow ui .*)$", smoke_workflow.stdout, flags=re.M)
    args = printed.split()[1:]
    assert args[args.index("--backend-store-uri") + 1] == smoke_workflow.tracking_uri
    log = tmp_path_factory.mktemp("mlflow_server") / "server.log"
    with mlflow_ui.mlflow_server(args, log) as url:
        yield url


def _render(chromium: str, url: str, profile: Path, budget_s: int,
            *mode: str, width: int = 1600) -> subprocess.CompletedProcess:
    """One headless Chromium run; the page's JavaScript gets `budget_s` of virtual time. Wide
    windows for tables whose columns are only drawn when visible (the Models view)."""
    flags = [f for f in CHROMIUM_FLAGS if not f.startswith("--window-size")]
    return subprocess.run([chromium, *flags, f"--window-size={width},2600",
                           f"--virtual-time-budget={budget_s * 1000}",
                           f"--user-data-dir={profile}", *mode, url],
                          capture_output=True, text=True, timeout=300)


def _until_shown(chromium: str, url: str, tmp_path: Path, expected: list[str], name: str,
                 width: int = 1600, values: tuple[float, ...] = (),
                 shot: Path | None = None) -> None:
    """Render until every expected string and value is on the page (the UI fetches after its
    scripts load; a loaded machine needs a longer budget). With `shot`, the same render also
    saves a screenshot of the page there (one Chromium run gives both)."""
    ARTIFACTS.mkdir(exist_ok=True)
    for attempt, budget in enumerate((30, 60, 120)):
        screenshot = () if shot is None else (f"--screenshot={shot}",)
        if shot is not None:
            shot.unlink(missing_ok=True)
        proc = _render(chromium, url, tmp_path / f"profile-{name}{attempt}", budget,
                       "--dump-dom", *screenshot, width=width)
        assert proc.returncode == 0, proc.stderr[-2000:]
        text = _page_text(proc.stdout)
        missing = [e for e in expected if e not in text]
        missing += [v for v in values if not _value_shown(text, v)]
        if not missing:
            if shot is not None:  # a rendered page, not a blank one
                assert shot.is_file() and shot.stat().st_size > 20_000, proc.stderr[-2000:]
            return
    (ARTIFACTS / f"mlflow_{name}.txt").write_text(text)
    pytest.fail(f"the {name} page lacks {missing} (page text in test-artifacts/mlflow_{name}.txt)")


def _js_number(value: float) -> str:
    """A float as the Models table prints it (JavaScript's shortest form: 0, not 0.0)."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _page_text(dom: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))


def _value_shown(text: str, value: float) -> bool:
    """Whether the page shows `value` as some number within one unit of that number's last
    digit. The compare table's rounding differs between views and versions (0.05992,
    0.060, 69.64, ...), so the check is numeric; short numbers (chart ticks such as 0.06) only
    count for a zero."""
    for s in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", text):
        decimals = len(s.split(".")[1]) if "." in s else 0
        significant = len(s.replace(".", "").lstrip("0").rstrip("0"))
        if abs(float(s) - value) <= 10 ** -decimals and (value == 0 or decimals >= 3
                                                          or significant >= 3):
            return True
    return False


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
    # The parent and the evaluation runs: two jobs, each on the validation and the test set.
    assert len(runs) == 5
    assert sorted(r.info.run_name for r in runs[1:]) == [
        f"eval/{job}/{test}" for job in ("avg_last2", "best")
        for test in ("demo_test", "demo_valid")]

    expected = [f"Comparing {len(runs)} Runs", "bleu_tokenized", "chrf"]
    expected += [r.info.run_name for r in runs]
    _until_shown(chromium, url, tmp_path, expected, "compare",
                 values=tuple(r.data.metrics["bleu"] for r in runs),
                 shot=ARTIFACTS / "mlflow_compare.png")


@pytest.mark.slow
def test_runs_page_and_models_view_show_the_runs_their_data_and_each_models_bleu(
        smoke_workflow, mlflow_server, tmp_path):
    """The `runs:` and `models:` links the workflow printed open MLflow's model-training pages:
    the runs table lists the workflow run with its training data; the Models view lists each
    evaluated checkpoint's logged model with its BLEU on the test set."""
    from mlflow.tracking import MlflowClient

    chromium = _chromium()
    links = dict(re.findall(r"^  (runs|models): +(\S+)$", smoke_workflow.stdout, flags=re.M))
    client = MlflowClient(smoke_workflow.tracking_uri)
    exp = client.get_experiment_by_name(smoke_workflow.experiment)

    runs_url = mlflow_server + links["runs"][links["runs"].index("/#/"):]
    _until_shown(chromium, runs_url, tmp_path, ["Runs", "Model training",
                                                smoke_workflow.run_name, "demo/train"], "runs")

    models = [m for m in client.search_logged_models([exp.experiment_id])
              if m.name.startswith(f"{smoke_workflow.run_name}-")]
    assert len(models) == 2
    expected = ["Models", "demo_test", "bleu"]
    for m in models:
        bleu = next(x.value for x in m.metrics if x.key == "bleu"
                    and x.dataset_name == "demo_test")
        expected += [m.name, _js_number(bleu)]
    models_url = mlflow_server + links["models"][links["models"].index("/#/"):]
    _until_shown(chromium, models_url, tmp_path, expected, "models", width=2800,
                 shot=ARTIFACTS / "mlflow_models.png")
