"""`ray job submit` end to end: a real Ray head started with `ray start --head` on this machine
(token authentication, as Ray 2.60 sets it up), the README's job command (plus 60 updates and a
temporary storage path / tracking URI), then the MLflow store and the uploaded working
directory are checked. The run is the session's `smoke_workflow` (tests/conftest.py), whose
outputs other tests read as well.

    timeout 900 .venv/bin/python -m pytest tests/test_job_submit.py -q
"""

from __future__ import annotations

import re

import pytest
from conftest import orphaned_ray_agents


@pytest.mark.slow
def test_ray_job_submit_runs_the_smoke_workflow_on_a_real_head(smoke_workflow):
    from mlflow.tracking import MlflowClient

    w = smoke_workflow
    proc = w.job
    log = proc.stdout + proc.stderr
    # While the job ran, a second command on the same run name and storage (another real
    # process) was refused at once with the holder named: one writer per run (storage/lease.py).
    assert w.lease_seen, "the job never took its run's lease"
    second = w.second
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert re.search(r"error: \S+/smoke-test is in use by another command \(wmt14_en_fr "
                     r"smoke\): pid \d+ on ", second.stderr), second.stderr
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
    alarming = alarming_lines(w.stdout)
    assert not alarming, "\n".join(alarming)

    # The store holds the parent run, its stage children and the scores.
    client = MlflowClient(w.tracking_uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == w.run_name]
    children = {r.info.run_name: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert parent.info.status == "FINISHED" and parent.data.metrics["updates"] == 60
    assert {"preprocess", "train", "eval/best/demo_test"} <= set(children)
    assert children["eval/best/demo_test"].data.metrics["bleu"] == \
        pytest.approx(parent.data.metrics["bleu"])
    assert f"{parent.data.metrics['bleu']:.2f}" in log
    assert (w.storage / w.run_name / "train" / "best" / "checkpoint.pt").is_file()
    assert not w.lease.exists()  # released when the job finished

    # The uploaded working directory is the code: no virtualenv, runs, stores or checkpoints.
    assert len(w.working_dir) == 1, w.working_dir
    names = set(w.working_dir[0])
    assert "workflows/orchestrate.py" in names and "convs2s/model/network.py" in names
    heavy = [n for n in names if n.split("/")[0] in (".venv", "runs", "mlruns", "mlartifacts")
             or n.endswith((".db", ".pt"))]
    assert not heavy, heavy[:10]
    # The head was stopped with every process it started, its agents among them.
    assert not orphaned_ray_agents()


def test_two_local_ray_instances_each_ask_their_own_state_api(smoke_workflow):
    """Two Ray instances on one machine (the session's and the job's `ray start` head: two
    workflows at once): a process of each finds its own instance's state API, as Ray Train's
    placement-group cleaner must, instead of failing with "Found multiple active Ray
    instances" (workflows.cluster.own_dashboard). The session's task, run while the head ran
    the job, found the session's marker actor, not the head's actors."""
    assert "session-marker" in smoke_workflow.session_actors
