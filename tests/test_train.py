"""End-to-end tests of convs2s.train.launch on Ray Train (2 CPU workers, gloo) with the tiny preset
on the demo corpus from the real preprocessing pipeline (the session `demo_batches` fixture):
a worker killed mid-epoch (the `CrashInjection` test hook) + a rerun of the same job, on local
disk and on a bucket, and what the local run leaves (learning, MLflow, checkpoints); 2-worker ==
1-process parity of an update with an unreachable tracking server; bf16/nccl on a GPU; a
checkpoint uploaded in Ray Train's background thread while the worker goes on.

Three TorchTrainer jobs on CPU (the crashed ones run twice, about 45 s each here) and one bare
one-worker run (about 20 s); all are marked slow.
Run: .venv/bin/python -m pytest tests/test_train.py -q
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import mlflow_store, s3_server
import torch
from mlflow.tracking import MlflowClient

from storage import location
from storage.lease import RunLease
from storage.signals import sigterm_handed_to_ctrl_c
from convs2s.io.checkpoint import CHECKPOINT_FILE, SPM_FILE, load_checkpoint, load_model, read_info
from convs2s.train.collate import collate_arrow
from convs2s.config import PRESETS, TrainConfig
from convs2s.model.network import ConvS2S
from convs2s.train.optim import LRSchedule, build_optimizer, set_lr
from convs2s.precision import local_precision
from convs2s.tracking.run_logger import read_local_metrics
from convs2s.tracking.runs import RUN_KEY_TAG
from convs2s.train.launch import fit
from convs2s.train.memory_fit import BudgetTooLarge
from convs2s.train.job import TrainJob
from convs2s.train.faults import (
    CRASH_AT_UPDATE_ENV,
    CRASH_MARKER,
    CRASH_RANK_ENV,
    RECORD_BATCHES_ENV,
    UNFIT_RANK_ENV,
    CrashInjection,
)
from convs2s.train.trainer import METRICS_FILE, PRECISION_TAG
from convs2s.train.comm import Comm
from convs2s.train.update import train_update

pytestmark = pytest.mark.slow
TINY = PRESETS["tiny"]()


def make_job(demo, storage: Path | str, name: str, train: TrainConfig, **kw) -> TrainJob:
    manifest = demo.manifests["batches/train"]
    if "tracking_uri" not in kw:
        kw["tracking_uri"] = mlflow_store(Path(storage))
    return TrainJob(model=TINY, train=train, train_data=demo.batches["train"],
                    valid_data=demo.batches["valid"], spm_model=demo.spm_model,
                    vocab_size=demo.vocab_size, storage_path=str(storage), run_name=name,
                    num_workers=2, experiment_name="test_train",
                    data_manifest={"train_batches": manifest["batches"],
                                   "train_rows": manifest["rows_kept"]}, **kw)


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def train_rows(demo) -> int:
    return demo.manifests["batches/train"]["batches"]


# The crash-and-rerun run (test_worker_death_...) on local disk: 2 workers, tiny model, checkpoints
# every CHECKPOINT_INTERVAL updates, the last KEEP_LAST kept; rank 1 dies mid-epoch 2 and Ray
# restarts the group, then the same job is run again for one more epoch (3 in all).
CHECKPOINT_INTERVAL, KEEP_LAST, EPOCHS = 30, 2, 3


def _crash_and_rerun(demo, storage, tracking: str, record: Path) -> dict:
    """Train `demo` 2 epochs with rank 1 dying after the update 7 past the first checkpoint of
    epoch 2 (fit reads the test hook from this process's environment and hands it to the
    workers; each rank writes the sentence ids of every update's batch under `record`), then
    run the same job (same name and storage path) again with one more epoch. Returns job,
    first, second (TrainResults), per_epoch, ckpt_before_crash."""
    per_epoch = train_rows(demo) // 2  # equal shards: rows // workers batches each
    ckpt_before_crash = (per_epoch // CHECKPOINT_INTERVAL + 1) * CHECKPOINT_INTERVAL
    assert per_epoch < ckpt_before_crash < 2 * per_epoch - 10  # mid-way through epoch 2
    cfg = TrainConfig(max_epochs=2, log_interval=5, checkpoint_interval=CHECKPOINT_INTERVAL,
                      keep_last=KEEP_LAST)
    # The run folder's lease held here, as a workflow holds it: rank 0 checks it before each
    # checkpoint, every rank learning the verdict (it stays this test's: the run goes on)
    lease = RunLease(f"{storage}/crashes", command="test_train crashes").acquire()
    job = make_job(demo, storage, "crashes", cfg, max_failures=1, system_metrics_s=1.0,
                   tracking_uri=tracking, lease=lease.ref())
    # Python's own Ctrl-C handler, as a program starts with (and as the session may not have
    # it: an earlier test's library may have left another)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(CRASH_AT_UPDATE_ENV, str(ckpt_before_crash + 7))
            mp.setenv(CRASH_RANK_ENV, "1")
            mp.setenv(RECORD_BATCHES_ENV, str(record))
            first = fit(job)
        second = fit(job.replace(train=cfg.replace(max_epochs=EPOCHS)))
    finally:
        lease.release()
    assert not lease.lost
    return {"job": job, "first": first, "second": second, "per_epoch": per_epoch,
            "ckpt_before_crash": ckpt_before_crash, "record": record,
            "sigint": signal.getsignal(signal.SIGINT)}


@pytest.fixture(scope="module")
def crashed_run(demo_batches, tmp_path_factory) -> dict:
    """`_crash_and_rerun` once for this module, its data, checkpoints and records in a bucket
    (the loopback S3 server: a cluster's storage), or on local disk where the tests may not
    start that server: the worker-death test checks its recovery, the others what any
    finished run leaves (it trained 3 epochs in all). (It ran on local disk and again in a
    bucket, 50 s each; a worker group Ray restarts from local disk is the local-training and
    sweep tests' too.)"""
    root = tmp_path_factory.mktemp("crashed_run")
    record = root / "record"
    record.mkdir()
    try:
        s3 = s3_server()
    except pytest.skip.Exception:  # (AWS_ENDPOINT_URL set outside the tests)
        s3, demo, storage = None, demo_batches, root
    else:
        demo, storage = _in_a_bucket(demo_batches, root, s3)
    return {**_crash_and_rerun(demo, storage, mlflow_store(root), record), "s3": s3,
            "root": root, "demo": demo}


@pytest.fixture(scope="module")
def trained(crashed_run):
    """(job, result) of a run that learned: the crashed run after its rerun."""
    return crashed_run["job"], crashed_run["second"]


def test_loss_falls_and_validation_perplexity_is_in_mlflow(trained):
    job, result = trained
    client = MlflowClient(job.tracking_uri)
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    loss = history(client, result.run_id, "train/loss")
    assert loss[-1][1] < 0.7 * loss[0][1], loss  # ln(400) ~ 6 at the start
    ppl = history(client, result.run_id, "valid/ppl")  # one a epoch
    assert len(ppl) == EPOCHS and ppl[-1][1] < ppl[0][1] < 400, ppl
    for key in ("train/lr", "train/gnorm", "train/tokens_per_s", "train/padding_efficiency",
                "train/peak_mem_mb", "train/updates_per_s", "valid/loss", "valid/nll"):
        assert history(client, result.run_id, key), key
    params = run.data.params
    assert params["model.embed_dim"] == "32" and params["train.lr"] == "0.25"
    assert params["job.num_workers"] == "2" and params["data.train_batches"] == \
        str(job.data_manifest["train_batches"])
    assert len(params["job.code_version"]) >= 5
    assert run.data.tags[RUN_KEY_TAG] == result.run_dir
    arts = {a.path for a in client.list_artifacts(result.run_id, "config")}
    assert {"config/train_job.json", "config/spm.model"} <= arts
    assert f"best_checkpoint/{CHECKPOINT_FILE}" in \
        {a.path for a in client.list_artifacts(result.run_id, "best_checkpoint")}
    assert result.metrics["epoch"] == EPOCHS
    assert result.metrics["val_ppl"] == pytest.approx(ppl[-1][1])
    # precision "auto": what the workers picked on this host, and why, is on the run (both
    # workers share this host, so it is what this process picks)
    expected = local_precision("auto", torch.device("cpu"))
    assert params["train.precision"] == "auto"
    assert run.data.tags[PRECISION_TAG] == expected.name == result.metrics["precision"]
    assert run.data.tags[PRECISION_TAG + "_reason"] == expected.reason


def test_ctrl_c_is_the_callers_again_once_a_run_ends(crashed_run):
    """Ray Train's fit, in the main thread, installs a SIGINT handler that aborts its run; once
    the run has ended, Ctrl-C is the caller's again: it raises KeyboardInterrupt (a workflow's
    next stage stops and says how to resume) instead of going to the finished run's handler,
    which swallowed it."""
    assert crashed_run["sigint"] is signal.default_int_handler  # as before the two runs
    # (still in place: a SIGINT to another handler, or to none, could end the session)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)


def _press_ctrl_c_once_training(metrics: Path, done: threading.Event, seen: list) -> None:
    """SIGINT to this process once Ray Train's handler is in place (it installs it just before
    its run starts) and the run has logged an update (or 120 s after the start); never after
    `done` is set or to any other handler (a KeyboardInterrupt outside the test would end the
    session). `seen` gets the SIGTERM handler in place at that moment."""
    deadline = time.monotonic() + 120
    while not done.wait(0.1):
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            continue  # not yet (or no longer) Ray Train's
        if time.monotonic() > deadline or (metrics.is_file()
                                           and "train/loss" in metrics.read_text()):
            seen.append(signal.getsignal(signal.SIGTERM))
            os.kill(os.getpid(), signal.SIGINT)
            return


def test_ctrl_c_during_a_run_is_a_keyboard_interrupt_and_the_run_is_killed(demo_batches,
                                                                           tmp_path):
    """Ctrl-C while the workers train: Ray Train's handler aborts the worker group and calls
    sys.exit; `fit` raises KeyboardInterrupt instead (a workflow then exits 130 and says how to
    resume), the MLflow run is KILLED, and Ctrl-C is the caller's again. SIGTERM (`ray job
    stop`) meanwhile goes to the project's handler, which hands it to the same Ctrl-C handler
    (Ray's own would exit in the middle of `fit`: the command then ended in an abort)."""
    cfg = TrainConfig(max_epochs=50, log_interval=1)  # far from its end when the key is pressed
    uri = mlflow_store(tmp_path)
    # one worker: the handler and the abort are the driver's, whatever the group's size
    job = make_job(demo_batches, tmp_path, "ctrl-c", cfg, tracking_uri=uri).replace(num_workers=1)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, as a program has
    term = signal.getsignal(signal.SIGTERM)  # Ray's, from `ray.init` in this process
    done, seen = threading.Event(), []
    presser = threading.Thread(target=_press_ctrl_c_once_training,
                               args=(tmp_path / "ctrl-c" / METRICS_FILE, done, seen), daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fit(job)
    finally:
        done.set()
        presser.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert seen and seen[0] is sigterm_handed_to_ctrl_c and signal.getsignal(signal.SIGTERM) is term
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("test_train").experiment_id])
    assert run.info.status == "KILLED"
    assert read_local_metrics(tmp_path / "ctrl-c" / METRICS_FILE)  # it had trained


def test_ctrl_c_while_the_workers_wait_for_room_stops_the_run_by_the_abort_deadline(
        demo_batches, tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) while Ray Train waits to place the workers (a cluster without room
    for them): Ray Train's handler waits on its controller's abort, which a controller placing
    its worker group answers only between tries, if at all (a SIGTERM had not stopped the driver
    10 minutes later). By the abort deadline (here 3 s) the controller is stopped, and what it
    reserved and asked for with it: `fit` raises KeyboardInterrupt, the MLflow run is KILLED,
    and nothing of the run holds a CPU of the session's Ray or asks the autoscaler for one."""
    from convs2s.train.launch import ABORT_WAIT_ENV, START_TIMEOUT_ENV

    monkeypatch.setenv(ABORT_WAIT_ENV, "3")
    monkeypatch.setenv(START_TIMEOUT_ENV, "40")  # Ray Train's try: the old wait, bounded
    uri = mlflow_store(tmp_path)
    # one worker of 3 CPUs, which the session's Ray (2 CPUs) cannot place; 2 tries at most
    job = make_job(demo_batches, tmp_path, "no-room", TrainConfig(max_epochs=1),
                   tracking_uri=uri).replace(num_workers=1, cpus_per_worker=3,
                                              placement_wait_s=80)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    done, pressed = threading.Event(), []

    def press_once_waiting():  # Ray Train's handler in place, its controller placing the group
        while not done.wait(0.2):
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler \
                    and _left_of_the_run(3.0, groups_only=True):
                time.sleep(1)  # (in the placement group's wait)
                pressed.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)
                return

    presser = threading.Thread(target=press_once_waiting, daemon=True)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            fit(job)
        stopped = time.monotonic()
    finally:
        done.set()
        presser.join()
    assert pressed and stopped - pressed[0] < 3 + 15, stopped - pressed[0]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("test_train").experiment_id],
                                filter_string="attributes.run_name = 'no-room'")
    assert run.info.status == "KILLED"
    deadline = time.monotonic() + 30  # (Ray removes a dead owner's actors and groups)
    while (left := _left_of_the_run(3.0)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def _left_of_the_run(cpus: float, groups_only: bool = False) -> list[str]:
    """Ray Train controllers alive, placement groups of `cpus`-CPU bundles not removed, and
    such bundles in the request the autoscaler reads (Ray Train's for its workers)."""
    import json

    from ray.experimental.internal_kv import _internal_kv_get
    from ray.util.state import list_actors, list_placement_groups

    asked = [] if groups_only else [
        f"autoscaler request {b}" for b in json.loads(
            _internal_kv_get(b"autoscaler_resource_request") or b"[]") if b.get("CPU") == cpus]
    return asked + [f"actor {a.class_name}" for a in list_actors(filters=[("state", "=", "ALIVE")])
                    if a.class_name == "TrainController" and not groups_only] + [
        f"placement group {g.placement_group_id} {g.state} {g.bundles}"
        for g in list_placement_groups(detail=True) if g.state != "REMOVED"
        and any(b.get("unit_resources", b).get("CPU") == cpus for b in g.bundles)]


def test_each_training_node_logs_its_utilization_to_the_run(trained):
    """MLflow system metrics, sampled by one worker per node (2 workers here, one node),
    named after the node's rank, its host a tag (keys of the host's name never lined up across
    runs on a cluster, whose nodes are named anew each time)."""
    import socket

    from convs2s.tracking.system_metrics import node_name

    job, result = trained
    client = MlflowClient(job.tracking_uri)
    node = node_name(0)
    assert node == "node0"
    run = client.get_run(result.run_id).data
    keys = [k for k in run.metrics if k.startswith("system/")]
    assert keys and all(k.startswith("system/node0/") for k in keys), keys
    assert run.tags["convs2s.node0.host"] == socket.gethostname()
    for name in ("cpu_utilization_percentage", "system_memory_usage_megabytes",
                 "system_memory_usage_percentage"):
        samples = history(client, result.run_id, f"system/{node}/{name}")
        assert len(samples) >= 2, (name, samples)
        steps = [step for step, _ in samples]
        assert steps == sorted(set(steps))  # one sampler: no step twice
        values = [value for _, value in samples]
        if "percentage" in name:  # (psutil's first CPU reading is 0 by definition)
            assert all(0 <= v <= 100 for v in values) and max(values) > 0, samples
        else:
            assert all(v > 0 for v in values), samples


def test_checkpoints_keep_best_and_last_k_and_load_without_ray(trained, demo_batches):
    job, result = trained
    per_epoch = train_rows(demo_batches) // 2
    # Checkpoints every CHECKPOINT_INTERVAL updates and at each epoch's end; Ray keeps the last
    # KEEP_LAST.
    taken = sorted(set(range(CHECKPOINT_INTERVAL, EPOCHS * per_epoch + 1, CHECKPOINT_INTERVAL))
                   | {e * per_epoch for e in range(1, EPOCHS + 1)})
    assert [read_info(p).update for p in result.checkpoints] == taken[-KEEP_LAST:]
    assert result.last_checkpoint == result.checkpoints[-1]
    best = read_info(result.best_checkpoint)
    client = MlflowClient(job.tracking_uri)
    nll = history(client, result.run_id, "valid/nll")
    assert best.end_of_epoch and best.val_loss == pytest.approx(min(v for _, v in nll))
    state = load_checkpoint(result.best_checkpoint)  # (in a bucket: fetched)
    assert {"model", "optimizer", "scheduler", "rng", "model_config", "train_config"} <= set(state)
    assert len(state["rng"]["states"]) == 2  # one RNG state per rank
    model, meta = load_model(result.best_checkpoint)
    assert meta["spm_model"] and Path(meta["spm_model"]).name == SPM_FILE
    assert sum(p.numel() for p in model.parameters()) > 0
    records = read_local_metrics(location(result.run_dir) / METRICS_FILE)
    assert [r["step"] for r in records if "train/loss" in r["metrics"]] == \
        [s for s, _ in history(client, result.run_id, "train/loss")]


def dead_tracking_uri() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_two_workers_equal_one_process_on_the_union_and_a_dead_tracker_is_harmless(
        demo_batches, tmp_path):
    # Two batch rows: each of the 2 workers trains on one of them for a single update.
    first_part = min(Path(demo_batches.batches["train"]).glob("*.parquet"))
    table = pq.read_table(first_part).slice(0, 2)
    data = tmp_path / "two_batches"
    data.mkdir()
    pq.write_table(table, data / "part-0.parquet")
    # No gradient renormalization: a wrong token normalization then shows in full. float32: the
    # comparison is of the normalization, not of bf16 rounding.
    cfg = TrainConfig(max_updates=1, clip_norm=0.0, log_interval=1, seed=3, precision="fp32")
    job = make_job(demo_batches, tmp_path, "parity", cfg, tracking_uri=dead_tracking_uri())
    assert job.system_metrics_s > 0  # on by default; a dead tracker stops the sampler, not training
    job = job.replace(train_data=str(data))
    t0 = time.monotonic()
    result = fit(job)
    assert time.monotonic() - t0 < 300
    assert result.run_id is None  # the run could not be created; training went on
    records = read_local_metrics(Path(result.run_dir) / METRICS_FILE)
    assert records[0]["step"] == 1 and "train/loss" in records[0]["metrics"]
    assert any("valid/ppl" in r["metrics"] for r in records)

    two_workers = load_checkpoint(result.last_checkpoint)["model"]
    torch.manual_seed(cfg.seed)
    model = ConvS2S(TINY, demo_batches.vocab_size, demo_batches.vocab_size)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    opt = build_optimizer(model.parameters(), cfg)
    set_lr(opt, LRSchedule(cfg).lr_at(0))
    union = [collate_arrow(table.slice(i, 1)) for i in range(2)]
    assert union[0].ntokens != union[1].ntokens
    train_update(model, opt, union, cfg, Comm(), torch.device("cpu"))
    one_process = model.state_dict()
    for k, v in one_process.items():
        assert torch.allclose(two_workers[k], v, rtol=1e-4, atol=1e-6), k
    assert max(float((one_process[k] - init[k]).abs().max()) for k in init) > 1e-3


def _in_a_bucket(demo, tmp_path: Path, s3):
    """The demo batches and BPE model uploaded to the loopback S3 server (each folder with its
    manifest last, as a stage commits there), and a storage path in the same bucket."""
    import dataclasses

    from storage import location, publish_dir

    root = location(f"s3://convs2s-test/{tmp_path.name}")
    batches = {}
    for split in ("train", "valid"):
        batches[split] = str(root / "batches" / split)
        publish_dir(demo.batches[split], batches[split], marker="manifest.json")
    spm = root / "spm.model"
    spm.upload(demo.spm_model)
    return dataclasses.replace(demo, batches=batches, spm_model=str(spm)), str(root / "runs")


def test_worker_death_resumes_from_the_last_checkpoint_and_a_rerun_resumes(
        crashed_run, rows_follow_the_plan):
    """A rank dies mid-epoch; Ray restarts the group from the latest checkpoint, which trains
    exactly the rows it had left. In a bucket (the loopback S3 server): the data is read from
    it, the checkpoints, best/ and metrics.jsonl are objects there (the module's
    `crashed_run`, whose outputs the tests above read too)."""
    from storage import location

    run, demo_batches = crashed_run, crashed_run["demo"]
    storage = run["job"].storage_path
    job, first, second = run["job"], run["first"], run["second"]
    per_epoch, ckpt_before_crash = run["per_epoch"], run["ckpt_before_crash"]
    run_dir = location(first.run_dir)
    assert str(run_dir).startswith(str(storage))  # in the bucket: an s3:// URI
    assert (run_dir / CRASH_MARKER).exists()  # rank 1 really died once
    assert first.metrics["resumed_from_update"] == ckpt_before_crash
    assert first.metrics["update"] == 2 * per_epoch  # the resumed epoch skipped what it had done
    # Which rows: those of an uninterrupted run's plan; the updates the death lost were
    # trained again on the same rows.
    replayed = rows_follow_the_plan(run["record"], demo_batches.batches["train"], job.train.seed,
                                    job.train.shuffle_buffer, 2, 2 * per_epoch)
    assert replayed and replayed <= set(range(ckpt_before_crash + 1, ckpt_before_crash + 8))

    # The same job (same name and storage path) run again with one more epoch resumed.
    assert second.run_id == first.run_id
    assert second.metrics["resumed_from_update"] == 2 * per_epoch
    assert second.metrics["update"] == 3 * per_epoch and second.metrics["epoch"] == 3

    client = MlflowClient(job.tracking_uri)
    exp = client.get_experiment_by_name("test_train")
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_dir}'")
    assert [r.info.run_id for r in runs] == [first.run_id]
    assert runs[0].info.status == "FINISHED"
    system = [k for k in runs[0].data.metrics if k.startswith("system/")]
    assert system  # the utilization samples continue across the restarts ...
    for key in ("train/loss", "train/lr", "valid/ppl", "epoch", *system):
        steps = [s for s, _ in history(client, first.run_id, key)]
        assert len(steps) == len(set(steps)), (key, steps)  # no duplicate steps after restarts
    # every 5 updates, and at each epoch's end (its last interval, cut short there)
    assert [s for s, _ in history(client, first.run_id, "train/loss")] == \
        sorted({*range(5, 3 * per_epoch + 1, 5), per_epoch, 2 * per_epoch, 3 * per_epoch})
    assert [s for s, _ in history(client, first.run_id, "valid/ppl")] == \
        [per_epoch, 2 * per_epoch, 3 * per_epoch]
    local = [(k, r["step"]) for r in read_local_metrics(run_dir / METRICS_FILE)
             for k in r["metrics"]]
    assert len(local) == len(set(local))
    if run["s3"] is not None:  # every output an object in the bucket; nothing local after it
        keys = run["s3"].keys("convs2s-test", f"{run['root'].name}/runs/")
        names = {k.split("/crashes/", 1)[1] for k in keys if "/crashes/" in k}
        assert {"best/meta.json", "best/checkpoint.pt", METRICS_FILE, CRASH_MARKER} <= names
        assert any(n.startswith("checkpoint_") and n.endswith("/meta.json") for n in names)
        assert not Path("s3:").exists() and not (run["root"] / "s3:").exists()


def test_a_budget_one_rank_cannot_hold_ends_the_run_at_once_in_one_message(demo_batches,
                                                                            tmp_path):
    """A rank whose GPU cannot hold the batches (here rank 1 of 2, by the test hook: the check
    itself needs a GPU) stops every rank before training, and the driver gets the message as
    `BudgetTooLarge`, not Ray Train's worker-group error after `max_failures` restarts that
    would each probe and fail again. The training run is marked failed; nothing was trained."""
    job = make_job(demo_batches, tmp_path, "unfit", TrainConfig(max_updates=5), max_failures=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(UNFIT_RANK_ENV, "1")
        with pytest.raises(BudgetTooLarge) as err:
            fit(job)
    assert str(err.value).startswith("rank 1 of 2: fault injection: rank 1 cannot hold")
    assert "\n" not in str(err.value)  # one line for the workflow's `error:` (exit 2)
    assert not list((tmp_path / "unfit").glob("checkpoint_*"))
    client = MlflowClient(job.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("test_train").experiment_id],
                                "attributes.run_name = 'unfit'")
    assert run.info.status == "FAILED"


def test_fault_injection_is_a_test_hook_not_a_training_setting():
    assert CrashInjection.from_env({}) == CrashInjection(at_update=0, rank=1)  # off
    assert CrashInjection.from_env({CRASH_AT_UPDATE_ENV: "37", CRASH_RANK_ENV: "0"}) == \
        CrashInjection(at_update=37, rank=0)
    with pytest.raises(ValueError, match=CRASH_AT_UPDATE_ENV):
        CrashInjection.from_env({CRASH_AT_UPDATE_ENV: "soon"})
    # Checkpoints written while the hook was a TrainConfig field hold it in train_config.
    cfg = TrainConfig(max_epochs=2, lr=0.5)
    assert "crash_at_update" not in cfg.to_dict()
    old = {**cfg.to_dict(), "crash_at_update": 0, "crash_rank": 1}
    assert TrainConfig.from_dict(old) == cfg
    with pytest.raises(ValueError, match="unknown TrainConfig fields"):
        TrainConfig.from_dict({**cfg.to_dict(), "crash_at": 3})


@pytest.mark.gpu
def test_bf16_updates_with_nccl_on_one_gpu(demo_batches, tmp_path):
    cfg = TrainConfig(max_updates=8, log_interval=2, precision="bf16")
    job = make_job(demo_batches, tmp_path, "gpu", cfg, use_gpu=True).replace(num_workers=1)
    result = fit(job)
    assert result.metrics["update"] == 8
    records = read_local_metrics(Path(result.run_dir) / METRICS_FILE)
    losses = [r["metrics"]["train/loss"] for r in records if "train/loss" in r["metrics"]]
    assert len(losses) == 4 and all(0 < x < 10 for x in losses)
    assert losses[-1] < losses[0]
    mem = [r["metrics"]["train/peak_mem_mb"] for r in records if "train/loss" in r["metrics"]]
    assert all(m > 0 for m in mem)
    assert load_checkpoint(result.last_checkpoint)["update"] == 8


def test_a_checkpoint_waits_for_the_last_ones_background_upload(tmp_path):
    """Rank 0 hands one checkpoint at a time to Ray Train's background upload (which deletes
    the folder when done): the next waits until the last folder is gone, so storage slower
    than the checkpoints come never piles them up on the local disk."""
    import threading

    from convs2s.train.trainer import wait_until_gone

    folder = tmp_path / "convs2s-ckpt-uploading"
    folder.mkdir()
    threading.Timer(0.6, folder.rmdir).start()  # the upload ends
    waited = wait_until_gone(folder)
    assert not folder.exists() and waited >= 0.5
    assert wait_until_gone(None) < 0.1 and wait_until_gone(folder) < 0.1
    stuck = tmp_path / "failed-upload"
    stuck.mkdir()  # a failed upload leaves its folder: the wait ends at its limit
    assert 0.3 <= wait_until_gone(stuck, limit_s=0.3) < 5.0


def _report_in_the_background(config: dict) -> dict:
    """A Ray Train worker that hands a checkpoint folder to `RayRuntime.report(background=True)`
    (what `Trainer.checkpoint` does for every checkpoint of a run but its first), looks at the
    folder the moment the call returns, then waits for the upload as the Trainer's next
    checkpoint would."""
    import tempfile

    from convs2s.train.runtime import RayRuntime
    from convs2s.train.trainer import wait_until_gone

    runtime = RayRuntime(config["run_dir"])
    folder = Path(tempfile.mkdtemp(prefix="convs2s-ckpt-"))
    (folder / "weights.bin").write_bytes(bytes(config["size"]))
    handed = runtime.report({"update": 1}, folder, "checkpoint_00000001", background=True)
    # copying `size` bytes takes the upload thread tens of ms at least: a report that had
    # uploaded before returning would leave no folder here (it deletes it once uploaded)
    there_on_return = (folder / "weights.bin").is_file()
    waited = wait_until_gone(folder, limit_s=120)
    return {"handed": handed, "there_on_return": there_on_return,
            "gone_after": not folder.exists(), "waited_s": waited}


@pytest.mark.slow
def test_a_background_checkpoint_upload_runs_while_the_worker_goes_on(ray_session, tmp_path):
    """Under Ray Train a checkpoint handed with background=True is uploaded by Ray Train's own
    thread: `report` returns with the folder still there (a synchronous upload returns after
    it), the thread deletes the folder once the copy is in the run's storage, and that copy is
    the run's checkpoint, whole."""
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import test_train
    from storage.signals import callers_signal_handlers

    ray.cloudpickle.register_pickle_by_value(test_train)  # (workers import no test module)
    size, ctrl_c = 64 * 2**20, signal.getsignal(signal.SIGINT)
    # (Ray Train's fit leaves its own Ctrl-C handler installed: the suite's next tests, which
    # press Ctrl-C or send SIGTERM, get theirs back, as `launch.fit` gives its caller)
    try:
        with callers_signal_handlers():
            result = TorchTrainer(
                _report_in_the_background,
                train_loop_config={"run_dir": str(tmp_path / "runs" / "bg"), "size": size},
                scaling_config=ScalingConfig(num_workers=1),
                run_config=RunConfig(name="bg", storage_path=str(tmp_path / "runs"))).fit()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(test_train)
    assert signal.getsignal(signal.SIGINT) is ctrl_c
    got = result.return_value
    assert got["handed"] and got["there_on_return"] and got["gone_after"], got
    kept = Path(result.checkpoint.path)
    assert kept.name == "checkpoint_00000001" and kept.parent == tmp_path / "runs" / "bg"
    assert (kept / "weights.bin").stat().st_size == size
