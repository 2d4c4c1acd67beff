"""Multi-node training: a two-node Ray cluster on this host (`ray start --head` plus a second
`ray start --address ...`, one CPU each), the smoke workflow's training with one worker on each
node and its checkpoints on a path both nodes share, driven as on a cluster (RAY_ADDRESS set).

    timeout 900 .venv/bin/python -m pytest tests/test_multinode.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _ray_json(ray_cli, *args: str):
    proc = subprocess.run(["ray", *args, "--address", ray_cli.gcs_address, "--format", "json"],
                          env=ray_cli.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_training_spans_two_nodes_with_shared_checkpoints(ray_cli, tmp_path):
    from mlflow.tracking import MlflowClient

    ray_cli.start_head(num_cpus=1)
    ray_cli.add_node(num_cpus=1)
    nodes = [n for n in _ray_json(ray_cli, "list", "nodes") if n["state"] == "ALIVE"]
    assert len(nodes) == 2, nodes

    shared = tmp_path / "shared"  # one host: a local path is storage both nodes see
    uri = f"sqlite:///{shared / 'mlflow.db'}"
    env = {**ray_cli.env, "RAY_ADDRESS": ray_cli.gcs_address}
    proc = subprocess.run(
        [sys.executable, "workflows/wmt14_en_fr.py", "--preset", "smoke", "--num-workers", "2",
         "--max-updates", "30", "--storage-path", str(shared), "--tracking-uri", uri,
         "--run-name", "two-nodes"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=840)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "Ray: cluster" in log and "2 CPUs" in log

    # One training worker ran on each node (2 nodes x 1 CPU: Ray had no other placement).
    workers = [a for a in _ray_json(ray_cli, "list", "actors", "--detail", "--limit", "1000")
               if a["class_name"] == "RayTrainWorker"]
    assert len(workers) == 2, workers
    assert len({a["node_id"] for a in workers}) == 2, [a["node_id"] for a in workers]

    # The run finished and its checkpoints are on the shared path.
    run_dir = shared / "two-nodes" / "train"
    assert (run_dir / "best" / "checkpoint.pt").is_file()
    assert list(run_dir.glob("checkpoint_*/checkpoint.pt"))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert runs["two-nodes"].info.status == "FINISHED"
    assert runs["train"].info.status == "FINISHED"
    assert runs["train"].data.params["job.num_workers"] == "2"
    assert runs["train"].data.metrics["valid/ppl"] > 0
    assert "bleu" in runs["two-nodes"].data.metrics


def _wait_for(predicate, timeout: float, what: str, proc=None) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the workflow ended (rc {proc.returncode}) before {what}:\n"
                                 f"{out[-4000:]}")
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.5)


@pytest.mark.slow
def test_a_lost_node_stops_resumably_and_a_replacement_node_finishes_the_same_run(
        ray_cli, tmp_path, rows_follow_the_plan):
    """A whole node lost mid-training (its raylet and every process under it SIGKILLed, as in a
    spot preemption): without a replacement the workflow stops within the placement wait with
    one clear line, resumable; once a replacement node has joined (as an autoscaler brings
    one), the same command resumes from the latest checkpoint and finishes with one MLflow
    train run, no duplicate metric steps, the planned number of updates and, update by
    update, the rows an uninterrupted run trains."""
    from mlflow.tracking import MlflowClient

    from convs2s.config import TrainConfig

    ray_cli.start_head(num_cpus=1)
    spot = ray_cli.add_node(num_cpus=1)
    shared = tmp_path / "shared"
    record = tmp_path / "record"
    record.mkdir()
    uri = f"sqlite:///{shared / 'mlflow.db'}"
    env = {**ray_cli.env, "RAY_ADDRESS": ray_cli.gcs_address,
           # Ray Train tries to place the workers for 10 s a time, the workflow waits 20 s
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10", "CONVS2S_PLACEMENT_WAIT_S": "20",
           "CONVS2S_TEST_RECORD_BATCHES": str(record)}
    updates = 120  # checkpoints every 50 (the smoke preset): one before the loss
    cmd = [sys.executable, "workflows/wmt14_en_fr.py", "--preset", "smoke", "--num-workers",
           "2", "--max-updates", str(updates), "--storage-path", str(shared), "--tracking-uri",
           uri, "--run-name", "lost-node", "--no-system-metrics"]
    train_dir = shared / "lost-node" / "train"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: (train_dir / "checkpoint_00000050" / "meta.json").is_file(), 600,
                  "checkpoint at update 50", proc)
        assert ray_cli.kill_node(spot) >= 2  # the raylet and at least the worker on it
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out[-4000:]
    said = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "could not place its 2 worker(s)" in said[0], out[-3000:]
    assert "rerun the same job" in said[0]

    ray_cli.add_node(num_cpus=1)  # the replacement
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-5000:]
    assert "resumed from update" in log

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    trains = [r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == "train"]
    assert len(trains) == 1 and trains[0].info.status == "FINISHED"
    for key in ("train/loss", "valid/ppl"):
        steps = [m.step for m in client.get_metric_history(trains[0].info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    assert trains[0].data.metrics["train/loss"] > 0
    cfg = TrainConfig()
    (batches,) = list((shared / "preprocessed" / "wmt14_en_fr").glob("*/batches/train"))
    rows_follow_the_plan(record, str(batches), cfg.seed, cfg.shuffle_buffer, 2, updates)
