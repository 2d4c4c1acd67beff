"""`ray job submit` end to end: a real Ray head started with `ray start --head` on this machine
(token authentication, as Ray 2.60 sets it up), the README's job command (plus one epoch and a
temporary storage path / tracking URI), then the MLflow store and the uploaded working
directory are checked.

    timeout 900 .venv/bin/python -m pytest tests/test_job_submit.py -q
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SHORT_OUTPUTS, mlflow_store

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ray_job_submit_runs_the_smoke_workflow_on_a_real_head(ray_cli, tmp_path):
    from mlflow.tracking import MlflowClient

    ray_cli.start_head(num_cpus=2)
    out = tmp_path / "out"
    uri = mlflow_store(out)
    env = {**ray_cli.env, "RAY_ADDRESS": ray_cli.dashboard_url}
    # The README's command, run from the repository root, with one epoch of a quarter of the
    # demo corpus (--set), short outputs (an epoch leaves a model far from learned) and
    # temporary outputs.
    cmd = ["ray", "job", "submit", "--working-dir", ".", "--",
           "python", "workflows/wmt14_en_fr.py", "--preset", "smoke", "--max-epochs", "1",
           "--set", "data.demo_rows={train: 5000, valid: 200, test: 200}", *SHORT_OUTPUTS,
           "--storage-path", str(out), "--tracking-uri", uri, "--run-name", "job-smoke"]
    job = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    # While the job runs, a second command on the same run name and storage (another real
    # process) is refused at once with the holder named: one writer per run (storage/lease.py).
    lease = out / "job-smoke" / ".lease.json"
    deadline = time.monotonic() + 300
    while not lease.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not lease.exists():  # say why: the submission refused, the driver failed, or slow
        if job.poll() is None:
            job.kill()
        stdout, stderr = job.communicate(timeout=60)
        pytest.fail(f"the job never took its run's lease (`ray job submit` exit "
                    f"{job.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    second = subprocess.run(
        [sys.executable, "workflows/wmt14_en_fr.py", "--preset", "smoke", "--max-epochs", "1",
         "--set", "data.demo_rows={train: 5000, valid: 200, test: 200}", *SHORT_OUTPUTS,
         "--storage-path", str(out), "--tracking-uri", uri, "--run-name", "job-smoke"],
        cwd=REPO, env={k: v for k, v in env.items() if k != "RAY_ADDRESS"},
        capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert re.search(r"error: \S+/job-smoke is in use by another command \(wmt14_en_fr "
                     r"smoke\): pid \d+ on ", second.stderr), second.stderr
    stdout, stderr = job.communicate(timeout=840)
    proc = subprocess.CompletedProcess(cmd, job.returncode, stdout, stderr)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert re.search(r"Job '\S+' succeeded", log), log[-3000:]
    assert "==== wmt14_en_fr (smoke) done" in log and "mlflow ui --backend-store-uri" in log
    assert "Ray: cluster" in log  # the driver joined the head, it did not start its own Ray
    # The workflow's own console (the job's log, as `ray job submit` tails it) is clean: no
    # Ray ERROR line, no warning, no traceback (workflows/console.py).
    from workflows.console import alarming_lines

    # (stdout: stderr holds the client's own packaging notices. This head and the test
    # session's Ray run on one machine: each asks its own state API, so Ray Train's
    # placement-group cleaner prints no "Found multiple active Ray instances" traceback.)
    job_log = proc.stdout.split("Tailing logs until the job exits", 1)[-1]
    alarming = alarming_lines(job_log)
    assert not alarming, "\n".join(alarming)

    # The store holds the parent run, its stage children and the scores.
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == "job-smoke"]
    children = {r.info.run_name: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert parent.info.status == "FINISHED" and parent.data.metrics["epochs"] == 1
    assert {"preprocess", "train", "eval/best/demo_test"} <= set(children)
    assert children["eval/best/demo_test"].data.metrics["bleu"] == \
        pytest.approx(parent.data.metrics["bleu"])
    assert f"{parent.data.metrics['bleu']:.2f}" in log
    assert (out / "job-smoke" / "train" / "best" / "checkpoint.pt").is_file()
    assert not lease.exists()  # released when the job finished

    # The uploaded working directory is the code: no virtualenv, runs, stores or checkpoints.
    pkgs = [p for p in Path(ray_cli.temp_dir).glob(
        "session_2*/runtime_resources/working_dir_files/_ray_pkg_*") if p.is_dir()]
    assert len(pkgs) == 1, pkgs
    names = {p.relative_to(pkgs[0]).as_posix() for p in pkgs[0].rglob("*")}
    assert "workflows/orchestrate.py" in names and "convs2s/model/network.py" in names
    heavy = [n for n in names if n.split("/")[0] in (".venv", "runs", "mlruns", "mlartifacts")
             or n.endswith((".db", ".pt"))]
    assert not heavy, heavy[:10]
    # The head stops with every process it started, its agents among them.
    from benchmarks.local_cluster import orphaned_agents

    ray_cli.stop()
    assert not orphaned_agents()
