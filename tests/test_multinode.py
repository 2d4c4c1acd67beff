"""Multi-node training: a Ray cluster of real raylets on this host (`ray start --head` plus
`ray start --address ...` nodes, one CPU each), the smoke workflow's training with one worker on
each node and its checkpoints on a path every node shares, driven as on a cluster (RAY_ADDRESS
set); then one node lost mid-training and a replacement joining.

    timeout 900 .venv/bin/python -m pytest tests/test_multinode.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHORT_OUTPUTS, mlflow_store

REPO = Path(__file__).resolve().parents[1]


def _ray_json(ray_cli, *args: str):
    proc = subprocess.run(["ray", *args, "--address", ray_cli.gcs_address, "--format", "json"],
                          env=ray_cli.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


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
def test_training_spans_two_nodes_survives_losing_one_and_finishes_on_a_replacement(
        ray_cli, tmp_path, rows_follow_the_plan):
    """Two workers, one per node, checkpointing to a shared path. Then a whole node is lost
    mid-training (its raylet and every process under it SIGKILLed, as in a spot preemption):
    without a replacement the workflow stops within the placement wait with one clear line,
    resumable; once a replacement node has joined (as an autoscaler brings one), the same
    command resumes from the latest checkpoint and finishes with one MLflow train run, no
    duplicate metric steps, the planned number of updates and, update by update, the rows an
    uninterrupted run trains."""
    from mlflow.tracking import MlflowClient

    from convs2s.config import TrainConfig

    ray_cli.start_head(num_cpus=1)
    spot = ray_cli.add_node(num_cpus=1)
    shared = tmp_path / "shared"
    record = tmp_path / "record"
    record.mkdir()
    uri = mlflow_store(shared)
    env = {**ray_cli.env, "RAY_ADDRESS": ray_cli.gcs_address,
           # Ray Train tries to place the workers for 5 s a time, the workflow waits 10 s
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5", "CONVS2S_PLACEMENT_WAIT_S": "10",
           "CONVS2S_TEST_RECORD_BATCHES": str(record)}
    updates = 80  # checkpoints every 50 (the smoke preset): the loss comes after the first
    # (a quarter of the demo corpus: 26 updates an epoch, the loss in the second)
    cmd = [sys.executable, "workflows/wmt14_en_fr.py", "--preset", "smoke", "--num-workers",
           "2", "--max-updates", str(updates), "--storage-path", str(shared), "--tracking-uri",
           uri, "--run-name", "lost-node", "--no-system-metrics", *SHORT_OUTPUTS,
           "--set", "data.demo_rows={train: 5000, valid: 200, test: 200}"]
    train_dir = shared / "lost-node" / "train"
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: (train_dir / "checkpoint_00000050" / "meta.json").is_file(), 600,
                  "checkpoint at update 50", proc)
        # One training worker runs on each node (2 nodes x 1 CPU: Ray had no other placement).
        workers = [a for a in _ray_json(ray_cli, "list", "actors", "--detail", "--limit", "1000")
                   if a["class_name"] == "RayTrainWorker" and a["state"] == "ALIVE"]
        assert len({a["node_id"] for a in workers}) == 2, workers
        assert ray_cli.kill_node(spot) >= 2  # the raylet and at least the worker on it
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out[-4000:]
    assert "Ray: cluster" in out and "2 CPUs" in out
    # The error line, where a Ray log line forwarded from another thread at the same moment
    # may have been written just before its newline (Python's print writes the text and the
    # newline in two calls).
    # (Ray's own gRPC lines may also say "error: ...": ours is the one about training.)
    said = [line[line.index("error: training"):] for line in out.splitlines()
            if "error: training" in line]
    assert len(said) == 1 and "could not place its 2 worker(s)" in said[0], out[-3000:]
    assert "rerun the same job" in said[0]

    ray_cli.add_node(num_cpus=1)  # the replacement
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-5000:]
    assert "resumed from update" in log

    # The run finished, its checkpoints on the shared path; one MLflow train run.
    assert (train_dir / "best" / "checkpoint.pt").is_file()
    assert list(train_dir.glob("checkpoint_*/checkpoint.pt"))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == "lost-node"]
    assert parent.info.status == "FINISHED" and "bleu" in parent.data.metrics
    trains = [r for r in runs if r.info.run_name == "train"]
    assert len(trains) == 1 and trains[0].info.status == "FINISHED"
    assert trains[0].data.params["job.num_workers"] == "2"
    for key in ("train/loss", "valid/ppl"):
        steps = [m.step for m in client.get_metric_history(trains[0].info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    assert trains[0].data.metrics["train/loss"] > 0
    cfg = TrainConfig()
    (batches,) = list(shared.glob("preprocessed/*/*/batches/*/train"))
    rows_follow_the_plan(record, str(batches), cfg.seed, cfg.shuffle_buffer, 2, updates)
    # The lost node went with its agents, and the cluster's stop takes the rest.
    from benchmarks.local_cluster import orphaned_agents

    ray_cli.stop()
    assert not orphaned_agents()


def test_two_local_ray_instances_each_ask_their_own_state_api(ray_session, ray_cli):
    """Two Ray instances on one machine (the session's and a `ray start` head: as two
    workflows at once): a process of each finds its own instance's state API, as Ray Train's
    placement-group cleaner must, instead of failing with "Found multiple active Ray
    instances" (workflows.cluster.own_dashboard)."""
    import ray

    ray_cli.start_head(num_cpus=1)

    @ray.remote(num_cpus=0)
    class Marker:
        def ping(self) -> int:
            return 1

    marker = Marker.options(name="session-marker").remote()
    ray.get(marker.ping.remote())

    @ray.remote(num_cpus=0)
    def actor_names() -> list[str]:
        from ray.util.state import list_actors

        return [a.name for a in list_actors(filters=[("state", "=", "ALIVE")])]

    assert "session-marker" in ray.get(actor_names.remote())  # this instance's, not the head's
    ray.kill(marker)
