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
