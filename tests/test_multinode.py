"""A Ray cluster of real raylets on this host (`ray start --head` plus `ray start --address ...`
nodes, one CPU each), driven as on a cluster, shared by this module's tests (one cluster start,
one preprocessing of the demo corpus):

- the smoke workflow's training with one worker on each node and its checkpoints on a path
  every node shares (RAY_ADDRESS set); one node lost mid-training; a replacement joining;
- the same run resumed through the README's `ray job submit` (token authentication, as Ray 2.60
  sets it up), while a second command on the run is refused;
- the session's Ray and this head side by side, each process asking its own state API;
- the cluster stopped with every process it started.

The cluster and the node-loss run start in the background when the session starts (they share
nothing with the session's Ray), so that their waits overlap the tests that run before these.

    timeout 900 .venv/bin/python -m pytest tests/test_multinode.py -q
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import QUARTER_DEMO, SHORT_OUTPUTS, mlflow_store

REPO = Path(__file__).resolve().parents[1]
# Updates of the node-loss run, a checkpoint every CHECKPOINT: the node is lost after the first
# checkpoint, with UPDATES - CHECKPOINT updates still to go (the time to list the actors and
# kill the node must not outlast them).
UPDATES, CHECKPOINT = 50, 20


def _ray_json(cluster, *args: str):
    proc = subprocess.run(["ray", *args, "--address", cluster.gcs_address, "--format", "json"],
                          env=cluster.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _wait_for(predicate, timeout: float, what: str, proc=None, cancelled=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if cancelled is not None and cancelled.is_set():
            raise RuntimeError(f"the test session ended before {what}")
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the workflow ended (rc {proc.returncode}) before {what}:\n"
                                 f"{out[-4000:]}")
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.2)


def _start_nodes(ctx):
    """The module's cluster: a head (dashboard, job API) and one more node, 1 CPU each, token
    authentication, the project's .venv first on PATH; `.spot` is the node's raylet port."""
    from benchmarks.local_cluster import RayCliCluster, cli_env

    cluster = RayCliCluster(cli_env(ctx.env))  # the session's environment as it started
    ctx.cleanup(cluster.stop)  # whatever happens to the session
    cluster.start_head(num_cpus=1)
    cluster.spot = cluster.add_node(num_cpus=1)
    return cluster


def _lose_a_node(ctx):
    """The node-loss run, then its resumption as a Ray job:

    1. the En-Fr smoke workflow, 2 workers, UPDATES updates, run by a driver with RAY_ADDRESS
       set; once its first checkpoint is on the shared path, the node (its raylet and every
       process under it) is SIGKILLed, as a spot machine is lost: the workflow stops within the
       placement wait (Ray Train tries for 5 s a time, the workflow waits 10 s);
    2. a replacement node joins, as an autoscaler brings one;
    3. the same command, submitted as the README's `ray job submit --working-dir .` (the test
       hook that records each update's rows passed in the job's runtime environment); while
       it runs, the same command started directly is refused.
    Returns the outputs of each step for the tests to read."""
    nodes = ctx.result("nodes")
    shared = ctx.tmp_path_factory.mktemp("lost_node") / "shared"
    record = shared.parent / "record"
    record.mkdir()
    uri = mlflow_store(shared)
    workflow = ["workflows/wmt14_en_fr.py", "--preset", "smoke", "--num-workers", "2",
                "--max-updates", str(UPDATES), "--set", f"train.checkpoint_interval={CHECKPOINT}",
                "--storage-path", str(shared), "--tracking-uri", uri, "--run-name", "lost-node",
                "--no-system-metrics", *SHORT_OUTPUTS, *QUARTER_DEMO]
    env = {**nodes.env, "RAY_ADDRESS": nodes.gcs_address,
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "5", "CONVS2S_PLACEMENT_WAIT_S": "10",
           "CONVS2S_TEST_RECORD_BATCHES": str(record)}
    train_dir = shared / "lost-node" / "train"
    proc = subprocess.Popen([sys.executable, *workflow], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: (train_dir / f"checkpoint_{CHECKPOINT:08d}" / "meta.json").is_file(),
                  600, f"checkpoint at update {CHECKPOINT}", proc, ctx.cancelled)
        workers = [a for a in _ray_json(nodes, "list", "actors", "--detail", "--limit", "1000")
                   if a["class_name"] == "RayTrainWorker" and a["state"] == "ALIVE"]
        killed = nodes.kill_node(nodes.spot)
        lost_out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()

    if ctx.cancelled.is_set():
        raise RuntimeError("the test session ended before the replacement node joined")
    nodes.add_node(num_cpus=1)  # the replacement
    job_env = {**nodes.env, "RAY_ADDRESS": nodes.dashboard_url}
    runtime_env = json.dumps({"env_vars": {"CONVS2S_TEST_RECORD_BATCHES": str(record)}})
    job_cmd = ["ray", "job", "submit", "--working-dir", ".", "--runtime-env-json", runtime_env,
               "--", "python", *workflow]
    job = subprocess.Popen(job_cmd, cwd=REPO, env=job_env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lease = shared / "lost-node" / ".lease.json"
    try:
        _wait_for(lambda: lease.exists() or job.poll() is not None, 300,
                  "lease taken by the job", cancelled=ctx.cancelled)
        second = None
        if lease.exists():  # a second command on the same run, while the job holds it
            second = subprocess.run(
                [sys.executable, *workflow], cwd=REPO,
                env={k: v for k, v in env.items() if k != "RAY_ADDRESS"},
                capture_output=True, text=True, timeout=120)
        stdout, stderr = job.communicate(timeout=840)
    finally:
        if job.poll() is None:
            job.kill()
    return SimpleNamespace(shared=shared, record=record, uri=uri, train_dir=train_dir,
                           workers=workers, killed=killed, lost_rc=proc.returncode,
                           lost_out=lost_out, job_rc=job.returncode, job_stdout=stdout,
                           job_stderr=stderr, second=second, lease=lease)


# Both run in the background from the session's start (tests/conftest.py, `Background`): the
# cluster's start, the node's loss and the job overlap the tests that run before this module's.
BACKGROUND_RUNS = {"nodes": _start_nodes, "lost_node_run": _lose_a_node}


@pytest.fixture(scope="module")
def nodes(background):
    """The cluster of `_start_nodes`, shared by this module's tests. The last test stops it and
    checks what is left; the teardown stops it in any case."""
    cluster = background.result("nodes")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def lost_node_run(nodes, background):
    """What `_lose_a_node` saw (a namespace)."""
    return background.result("lost_node_run")


@pytest.mark.slow
def test_training_spans_two_nodes_survives_losing_one_and_finishes_on_a_replacement(
        lost_node_run, rows_follow_the_plan):
    """Two workers, one per node, checkpointing to a shared path. A whole node lost
    mid-training: without a replacement the workflow stops within the placement wait with one
    clear line, resumable; once a replacement node has joined, the same command resumes from
    the latest checkpoint and finishes with one MLflow train run, no duplicate metric steps,
    the planned number of updates and, update by update, the rows an uninterrupted run
    trains."""
    from mlflow.tracking import MlflowClient

    from convs2s.config import TrainConfig

    r = lost_node_run
    # One training worker ran on each node (2 nodes x 1 CPU: Ray had no other placement).
    assert len({a["node_id"] for a in r.workers}) == 2, r.workers
    assert r.killed >= 2  # the raylet and at least the worker on it
    out = r.lost_out
    assert r.lost_rc == 3, out[-4000:]
    assert "Ray: cluster" in out and "2 CPUs" in out
    # The error line, where a Ray log line forwarded from another thread at the same moment
    # may have been written just before its newline (Python's print writes the text and the
    # newline in two calls).
    # (Ray's own gRPC lines may also say "error: ...": ours is the one about training.)
    said = [line[line.index("error: training"):] for line in out.splitlines()
            if "error: training" in line]
    assert len(said) == 1 and "could not place its 2 worker(s)" in said[0], out[-3000:]
    assert "rerun the same job" in said[0]

    log = r.job_stdout + r.job_stderr
    assert r.job_rc == 0, log[-5000:]
    assert "resumed from update" in log

    # The run finished, its checkpoints on the shared path; one MLflow train run.
    assert (r.train_dir / "best" / "checkpoint.pt").is_file()
    assert list(r.train_dir.glob("checkpoint_*/checkpoint.pt"))
    client = MlflowClient(r.uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [run for run in runs if run.info.run_name == "lost-node"]
    assert parent.info.status == "FINISHED" and "bleu" in parent.data.metrics
    trains = [run for run in runs if run.info.run_name == "train"]
    assert len(trains) == 1 and trains[0].info.status == "FINISHED"
    assert trains[0].data.params["job.num_workers"] == "2"
    for key in ("train/loss", "valid/ppl"):
        steps = [m.step for m in client.get_metric_history(trains[0].info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)
    assert trains[0].data.metrics["train/loss"] > 0
    cfg = TrainConfig()
    (batches,) = list(r.shared.glob("preprocessed/*/*/batches/*/train"))
    rows_follow_the_plan(r.record, str(batches), cfg.seed, cfg.shuffle_buffer, 2, UPDATES)


@pytest.mark.slow
def test_ray_job_submit_runs_the_workflow_on_a_real_head(lost_node_run, nodes):
    """The README's job command (plus the run's flags) on a real head: the job succeeds, its
    driver joins the cluster, its console is clean, the MLflow store holds the parent run with
    its stage children and scores, one writer holds the run at a time, and what was uploaded
    is the code alone."""
    from mlflow.tracking import MlflowClient

    from workflows.console import alarming_lines

    r = lost_node_run
    # While the job ran, a second command on the same run name and storage (another real
    # process) was refused at once with the holder named: one writer per run (storage/lease.py).
    assert r.second is not None, "the job never took its run's lease:\n" + \
        (r.job_stdout + r.job_stderr)[-4000:]
    assert r.second.returncode == 2, r.second.stdout[-2000:] + r.second.stderr[-2000:]
    assert re.search(r"error: \S+/lost-node is in use by another command \(wmt14_en_fr "
                     r"smoke\): pid \d+ on ", r.second.stderr), r.second.stderr
    log = r.job_stdout + r.job_stderr
    assert r.job_rc == 0, log[-5000:]
    assert re.search(r"Job '\S+' succeeded", log), log[-3000:]
    assert "==== wmt14_en_fr (smoke) done" in log and "mlflow ui --backend-store-uri" in log
    assert "Ray: cluster" in log  # the driver joined the head, it did not start its own Ray
    # The workflow's own console (the job's log, as `ray job submit` tails it) is clean: no
    # Ray ERROR line, no warning, no traceback (workflows/console.py). (stdout: stderr holds
    # the client's own packaging notices. This head and the test session's Ray run on one
    # machine: each asks its own state API, so Ray Train's placement-group cleaner prints no
    # "Found multiple active Ray instances" traceback.)
    job_log = r.job_stdout.split("Tailing logs until the job exits", 1)[-1]
    alarming = alarming_lines(job_log)
    assert not alarming, "\n".join(alarming)

    # The store holds the parent run, its stage children and the scores.
    client = MlflowClient(r.uri)
    exp = client.get_experiment_by_name("wmt14_en_fr")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [run for run in runs if run.info.run_name == "lost-node"]
    children = {run.info.run_name: run for run in runs
                if run.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert parent.info.status == "FINISHED" and parent.data.metrics["updates"] == UPDATES
    assert {"preprocess", "train", "eval/best/demo_test"} <= set(children)
    assert children["eval/best/demo_test"].data.metrics["bleu"] == \
        pytest.approx(parent.data.metrics["bleu"])
    assert f"{parent.data.metrics['bleu']:.2f}" in log
    assert not r.lease.exists()  # released when the job finished

    # The uploaded working directory is the code: no virtualenv, runs, stores or checkpoints.
    pkgs = [p for p in Path(nodes.temp_dir).glob(
        "session_2*/runtime_resources/working_dir_files/_ray_pkg_*") if p.is_dir()]
    assert len(pkgs) == 1, pkgs
    names = {p.relative_to(pkgs[0]).as_posix() for p in pkgs[0].rglob("*")}
    assert "workflows/orchestrate.py" in names and "convs2s/model/network.py" in names
    heavy = [n for n in names if n.split("/")[0] in (".venv", "runs", "mlruns", "mlartifacts")
             or n.endswith((".db", ".pt"))]
    assert not heavy, heavy[:10]


def test_two_local_ray_instances_each_ask_their_own_state_api(ray_session, nodes):
    """Two Ray instances on one machine (the session's and this module's `ray start` head: as
    two workflows at once): a process of each finds its own instance's state API, as Ray
    Train's placement-group cleaner must, instead of failing with "Found multiple active Ray
    instances" (workflows.cluster.own_dashboard)."""
    import ray

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


@pytest.mark.slow
def test_a_folder_or_file_another_node_does_not_see_is_named(lost_node_run, nodes, tmp_path):
    """What a workflow's --storage-path and a corpus job's --output and model files are checked
    with on a cluster (storage.ray_join.node_not_seeing): a task on each other node looks for
    them. Here every node is on this host, so the folder is seen; a file no node has stands for
    one another node does not mount, and is named with that node's address."""
    code = ("import json, sys, ray; ray.init(log_to_driver=False); "
            "from storage.ray_join import node_not_seeing; "
            "from workflows.cluster import check_shared_storage; "
            "check_shared_storage(sys.argv[1], 'sqlite:///' + sys.argv[1] + '/db/mlflow.db'); "
            "print(json.dumps([node_not_seeing(sys.argv[1]), "
            "node_not_seeing(sys.argv[1], also=(sys.argv[2],)), "
            "node_not_seeing(None, also=(sys.argv[2],))]))")
    missing = str(tmp_path / "on-the-driver-only.pt")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out"), missing], cwd=REPO,
                          env={**nodes.env, "RAY_ADDRESS": nodes.gcs_address},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen, unseen, unseen_file = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen is None
    address, what = unseen
    assert what == missing and re.fullmatch(r"[\d.]+", address), unseen
    assert unseen_file == unseen  # (no folder: the files alone are looked for)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["db"]  # the probes removed


# Run under `unshare -m` with a tmpfs mounted on argv[1] first: the driver's files there are
# on no other node, as a node-local disk's are. Each command's exit status and stderr as JSON.
_DRIVER_ONLY = """
import contextlib, io, json, shutil, sys
from pathlib import Path

only, best = Path(sys.argv[1]), sys.argv[2]
said = {}

def run(name, main, args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as e:
            rc = e.code
    said[name] = [rc, err.getvalue()]

from workflows.evaluation_command import main as evaluate
from preprocessing.cli import main as preprocess
from convs2s.cli.serve_command import serve

# relative test files, in this shared folder: the tasks run in the raylets' folder
Path("t.en").write_text("a house .\\n"), Path("t.fr").write_text("une maison .\\n")
tracking = ["--tracking-uri", "sqlite:///" + str(Path("mlflow.db").resolve())]
run("relative", evaluate, ["--run-dir", str(Path(best).parent), "--last-n", "0", "--test",
                           "t", "t.en", "t.fr", "fr", "--out", "eval", *tracking])
(only / "t.en").write_text("a house .\\n"), (only / "t.fr").write_text("une maison .\\n")
run("evaluation", evaluate, ["--run-dir", str(Path(best).parent), "--last-n", "0", "--test",
                             "t", str(only / "t.en"), str(only / "t.fr"), "fr", "--out",
                             "eval2", *tracking])
run("preprocessing", preprocess, ["--task", "demo", "--source", "demo", "--out",
                                  str(only / "prep")])
shutil.copytree(best, only / "best")
run("serve", serve, ["--checkpoint", str(only / "best")])
said["probes left"] = [p.name for p in only.rglob(".convs2s-shared-probe-*")]
print(json.dumps(said))
"""


@pytest.mark.slow
def test_commands_stop_at_what_only_the_driver_sees(lost_node_run, nodes, tmp_path):
    """A folder on the driver's machine only, as a node-local disk is: a tmpfs mounted in a
    private mount namespace of the driver (`unshare -m`), which the cluster's raylets, in the
    host's, do not see. Each command whose Ray tasks read or write local files stops with one
    line naming the node and the path before a task fails on it: an evaluation's test set, the
    preprocessing output, a served checkpoint. And an evaluation's relative --test paths are
    found by its tasks, which run in the folder the cluster's raylets started in (this
    cluster's: the repository), not the driver's."""
    if subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                      capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (`unshare -m` needs CAP_SYS_ADMIN): a "
                    "folder only the driver sees cannot be made on one host")
    only = tmp_path / "driver-only"
    only.mkdir()
    best = lost_node_run.train_dir / "best"
    script = 'mount -t tmpfs none "$1" && exec "$2" -c "$3" "$1" "$4"'
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(only),
         sys.executable, _DRIVER_ONLY, str(best)], cwd=tmp_path,
        env={**nodes.env, "RAY_ADDRESS": nodes.gcs_address},
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    rc, err = said["relative"]
    assert rc == 0, err[-3000:]
    assert (tmp_path / "eval" / "best" / "t.fr").read_text().strip()  # a translation
    node = r"the node at [\d.]+ does not see it"
    for name, unseen in (("evaluation", only / "t.en"), ("preprocessing", only / "prep"),
                         ("serve", only / "best")):
        rc, err = said[name]
        assert rc == 2 and re.search(f"{re.escape(str(unseen))} is not shared: {node}", err), \
            (name, rc, err[-3000:])
    assert said["probes left"] == []  # (listed in the driver's namespace, the tmpfs's own)


@pytest.mark.slow
def test_the_stopped_cluster_leaves_no_process_behind(lost_node_run, nodes):
    """After a lost node, a replacement and a job, stopping the cluster ends every process it
    started: no Ray agent outlives its raylet (an orphaned dashboard agent spins a whole core
    for minutes; benchmarks/local_cluster.py). (The check reads this cluster's processes
    alone, so a background run's local Ray may end meanwhile.)"""
    from benchmarks.local_cluster import agents, orphaned_agents

    # The check finds this cluster's agents (by the log files they hold in the cluster's
    # folder): the head's and the replacement node's.
    live = agents(nodes.temp_dir)
    assert len({raylet for _, raylet in live.values()} - {None}) == 2, live
    nodes.stop()
    assert not nodes.pids()
    assert not orphaned_agents(nodes.temp_dir)
