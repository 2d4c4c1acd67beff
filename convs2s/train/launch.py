"""Synchronous data-parallel ConvS2S training on Ray Train (V2) with MLflow tracking.

With `convs2s.train.trainer` (the workers' loop), the only `convs2s` modules that import Ray.
Public API (used by the workflows):

    from convs2s.train.launch import fit
    from convs2s.config import TrainConfig
    from convs2s.train.job import STOP_REASONS, TrainJob, TrainResult
    result = fit(TrainJob(model=PRESETS["tiny"](), train=TrainConfig(max_epochs=5),
                          train_data=out.batches["train"], valid_data=out.batches["valid"],
                          spm_model=out.spm_model, vocab_size=out.vocab_size,
                          storage_path="/abs/runs", run_name="demo", num_workers=2))
    result.run_id, result.best_checkpoint, result.last_checkpoint, result.checkpoints

`fit(job) -> TrainResult` runs on the driver (inside `ray.init`): it finds or creates the MLflow
run (tagged with the run directory, so rerunning the same run name + storage path logs into the
same run), logs params and config artifacts, starts a `TorchTrainer` whose workers run
`train_loop_per_worker`, and logs the best checkpoint as an artifact at the end. Rerunning a
stopped job resumes from its latest checkpoint (Ray Train restores the run directory); a worker
that dies mid-epoch makes Ray restart the group from the latest checkpoint
(`TrainJob.max_failures`), and the resumed epoch trains exactly the rows it had left
(`convs2s.train.data`). A group that cannot be placed again (a lost node not replaced) is
waited for `TrainJob.placement_wait_s`, then `WorkersNotPlaced` is raised; the run resumes
when rerun. `fit` takes no lease of the run folder: its caller holds one (a workflow holds its
run's, storage.lease.RunLease) and passes it as `TrainJob.lease`, which rank 0 checks before
each checkpoint (`LeaseLost` where another command took the run over).

Run directory `<storage_path>/<run_name>/`: Ray Train state, the last `keep_last`
`checkpoint_<update>/` directories, `best/` (lowest validation loss), `metrics.jsonl`. The
storage path is a local or shared folder, or a bucket URI (`s3://bucket/prefix`): Ray Train
then writes through the same pyarrow filesystem (`storage_filesystem`), `best/` is published
with its meta.json last and metrics.jsonl is rewritten at each checkpoint (docs/storage.md).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading

import ray
import ray.train
import ray.train.torch
from ray.train import (
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
)

from storage.signals import sigterm_as_ctrl_c
from convs2s.io.checkpoint import (
    BEST_DIR,
    list_checkpoints,
)
from convs2s.train.data import preflight
from convs2s.train.job import TrainJob, TrainResult, WorkersNotPlaced
from convs2s.tracking.redact import Hidden
from convs2s.train.tracked import close_train_run, fail_train_run, open_train_run
from convs2s.train.faults import CrashInjection
from convs2s.train.runtime import RAY_RECORD, set_aside_stale_ray_record
from convs2s.train.trainer import STOPPED_KEY, STOPPING_ERRORS, train_loop_per_worker
from storage import filesystem_of, is_uri, location

# --- driver -------------------------------------------------------------------------------------


def fit(job: TrainJob) -> TrainResult:
    """Train `job` on Ray Train; resumes when `<storage_path>/<run_name>` already holds a run."""
    # a bad name, bad or incomplete data, another run's folder: refused before any run starts
    files, valid_files = preflight(job, job.num_workers)
    storage = location(job.storage_path)  # a local / shared folder, or a bucket (storage/)
    run_dir = storage / job.run_name
    # Ray Train's record of the run, where the run went on without Ray since (keep_last removed
    # folders it names, or it knows only older checkpoints): set aside, so the workers resume
    # from the folder's newest checkpoint, as for a run started without Ray
    if why := set_aside_stale_ray_record(run_dir, job.train.keep_last):
        logging.getLogger(__name__).warning(
            "%s: Ray Train's record of the run is set aside as %s.stale-<time>: %s; resuming "
            "from the run folder's newest checkpoint", run_dir, RAY_RECORD, why)
    # Ray Train writes its checkpoints through the same pyarrow filesystem the project uses.
    ray_fs, ray_path = filesystem_of(storage)
    uri, run_id = open_train_run(job, run_dir, files, {"num_workers": job.num_workers,
                                                        "use_gpu": job.use_gpu})
    resources = {"CPU": job.cpus_per_worker, **({"GPU": 1} if job.use_gpu else {})}
    trainer = _TorchTrainer(
        train_loop_per_worker,
        # "crash": the tests' fault injection, read from this process's environment and handed
        # over here: the Ray workers may have started before the test set it.
        # (Ray Train's run state records this config as text: the URI's password hidden)
        train_loop_config={"job": job, "run_dir": str(run_dir), "tracking_uri": Hidden(uri),
                           "run_id": run_id, "train_files": files,
                           "valid_files": valid_files,
                           "crash": CrashInjection.from_env()},
        scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.use_gpu,
                                     resources_per_worker=resources,
                                     accelerator_type=job.accelerator_type
                                     if job.use_gpu else None),
        run_config=RunConfig(name=job.run_name, storage_path=ray_path,
                             storage_filesystem=ray_fs if is_uri(storage) else None,
                             failure_config=FailureConfig(
                                 max_failures=job.max_failures,
                                 controller_failure_limit=_placement_tries(job)),
                             checkpoint_config=CheckpointConfig(num_to_keep=job.train.keep_last),
                             # Ray Train's INFO lines (worker group start-up) stay in its log
                             # files; the console shows our progress lines and warnings.
                             logging_config=LoggingConfig(log_level="WARNING")),
    )
    try:
        with sigterm_as_ctrl_c():
            result = _fit_until_ctrl_c(trainer)
    except BaseException as err:
        fail_train_run(uri, run_id, err)
        if _not_placed(err):
            raise WorkersNotPlaced(
                f"training could not place its {job.num_workers} worker(s) "
                f"({_resources(job)} each) for {job.placement_wait_s:.0f} s: a node was lost "
                "and not replaced, or the cluster is too small. The run stopped at its latest "
                f"checkpoint ({run_dir}); rerun the same job (the same --run-name and "
                "--storage-path) once the cluster has room, and it resumes there") from None
        raise
    final = dict(result.return_value or result.metrics or {})
    if STOPPED_KEY in final:  # the workers' memory check failed (no training), or the run
        # diverged: no retries
        kind, message = final[STOPPED_KEY]
        err = STOPPING_ERRORS[kind](message)
        fail_train_run(uri, run_id, err)
        raise err
    has_best = close_train_run(uri, run_id, final, run_dir)
    kept = [i.path for i in list_checkpoints(run_dir)]
    last = result.checkpoint.path if result.checkpoint is not None else None
    if last is not None and is_uri(storage):  # Ray gives the path inside the filesystem
        last = f"{storage.scheme}://{last}"
    return TrainResult(run_id=run_id, run_dir=str(run_dir),
                       best_checkpoint=str(run_dir / BEST_DIR) if has_best else None,
                       last_checkpoint=last, checkpoints=kept, metrics=final)


def _fit_until_ctrl_c(trainer: ray.train.torch.TorchTrainer):
    """`trainer.fit()`, with a Ctrl-C during the run raised as KeyboardInterrupt, as anywhere
    else in a workflow (exit status 130, the runs marked KILLED, the command that resumes). Ray
    Train's own SIGINT handler, installed for the run, aborts the worker group and then calls
    `sys.exit(0)`, which leaves `fit` as SystemExit (status 1: raised again by `ray.get`).
    Nothing else in the driver's part of `fit` exits: a SystemExit from it is a signal
    handler's, and during the run the Ctrl-C handler is Ray Train's."""
    try:
        return trainer.fit()
    except SystemExit:
        raise KeyboardInterrupt("Ctrl-C: Ray Train aborted the run") from None
    finally:
        if trainer.abort_deadline is not None:
            trainer.abort_deadline.cancel()


# Seconds Ray Train's own abort of a run gets after a Ctrl-C or SIGTERM before the run's
# controller is stopped (_AbortDeadline).
ABORT_WAIT_ENV, DEFAULT_ABORT_WAIT_S = "CONVS2S_ABORT_WAIT_S", 30.0


class _TorchTrainer(ray.train.torch.TorchTrainer):
    """Ray Train's TorchTrainer, its Ctrl-C abort given a deadline. Ray Train's SIGINT handler
    asks the run's controller actor to abort and waits for its answer. A controller placing its
    worker group waits for the placement group synchronously (up to
    RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s by default, a try; and then it tries again) and
    does not answer it: on a cluster without room for the workers, a Ctrl-C or SIGTERM did
    nothing until Ray Train gave up placing them (`placement_wait_s`, 15 minutes by default;
    2026-12-05, a `ray start --head --num-cpus 2` and 4 workers, and tests/test_train.py).
    Ray Train's handler is wrapped here (its registration is Ray Train's own method,
    overridden; tests/test_train.py shows the wrapper runs): the first Ctrl-C also starts
    `_AbortDeadline`."""

    abort_deadline: _AbortDeadline | None = None

    def _register_sigint_handler(self, controller) -> None:
        super()._register_sigint_handler(controller)
        ray_trains = signal.getsignal(signal.SIGINT)
        self.abort_deadline = deadline = _AbortDeadline(controller, float(
            os.environ.get(ABORT_WAIT_ENV, DEFAULT_ABORT_WAIT_S)),
            f"train-{self.train_run_context.run_id}")

        def sigint_handler(signum, frame):
            deadline.start()
            ray_trains(signum, frame)

        signal.signal(signal.SIGINT, sigint_handler)


class _AbortDeadline:
    """After `wait_s` seconds, the run's controller actor is killed, unless the run ended
    first (`cancel`). Its worker actors end with it (Ray's ownership); Ray Train's handler,
    waiting on the abort call, gets the actor's death and exits as after an abort (SystemExit:
    `_fit_until_ctrl_c` makes it the Ctrl-C it was). The placement group it was waiting for
    is this job's until the driver exits (a group outlives its creator actor while its job
    lives; Ray Train's cleaner takes only a placed group): removed here, with any other group
    the job made since the run's start (a pending group is demand an autoscaler adds nodes
    for). So is the controller's request to the autoscaler for the workers (`requester`, Ray
    Train's name for it in Ray's autoscaling coordinator; it would stand 3 minutes more).
    Started and cancelled in the main thread only (signal handlers run there): no lock."""

    def __init__(self, controller, wait_s: float, requester: str):
        self.controller, self.wait_s, self.requester = controller, wait_s, requester
        self._timer: threading.Timer | None = None
        self._groups_before = _groups_of_this_job()

    def start(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.wait_s, self._stop)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        """The run ended: no stop; one under way is waited for (bounded), so that the driver
        does not shut Ray down under it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(30)

    def _stop(self) -> None:
        log = logging.getLogger(__name__)
        log.warning(
            "Ray Train did not abort the run within %.0f s of the Ctrl-C (its controller was "
            "busy, e.g. waiting for room for the workers; %s): stopping the controller, its "
            "workers and their reserved resources", self.wait_s, ABORT_WAIT_ENV)
        for step, what in ((self._kill, "its controller"), (self._remove_groups,
                                                             "its placement group"),
                           (self._cancel_request, "its autoscaler request")):
            try:
                step()
            except Exception as err:  # noqa: BLE001 - each its own; the driver's exit ends them
                log.warning("could not stop %s (%s: %s); it ends with this command",
                            what, type(err).__name__, str(err).splitlines()[0][:200]
                            if str(err) else "")

    def _kill(self) -> None:
        ray.kill(self.controller, no_restart=True)
        # (its death first: a group it asked for just before is then known to Ray)
        ray.wait([self.controller.__ray_ready__.remote()], timeout=10)

    def _remove_groups(self) -> None:
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        now = _groups_of_this_job()
        if now is not None and self._groups_before is not None:  # (else: with the driver)
            for group in now - self._groups_before:
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(group)))

    def _cancel_request(self) -> None:
        # (Ray Train's own client of the coordinator; Ray is pinned, pyproject.toml. Without
        # it the request expires 3 minutes after the controller last sent it.)
        from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client \
            import TrainAutoscalingCoordinatorClient

        TrainAutoscalingCoordinatorClient(self.requester).cancel_resource_request()


def _groups_of_this_job() -> set[str] | None:
    """The ids of the placement groups this job (the driver) made that are not removed (a
    group's id ends with its job's); None where Ray cannot list them (Ray Client)."""
    try:
        job = ray.get_runtime_context().get_job_id()
        return {gid for gid, g in ray.util.placement_group_table().items()
                if gid.endswith(job) and g["state"] != "REMOVED"}
    except Exception:  # noqa: BLE001 - a convenience; the groups go when the driver exits
        return None


# Ray Train gives up one attempt to place a worker group after this long (its default is 60 s);
# it reads the variable from the driver's environment.
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


def _placement_tries(job: TrainJob) -> int:
    """Attempts to place the worker group (Ray Train's controller failures) that fit into
    `placement_wait_s`; -1: without end."""
    if job.placement_wait_s is None:
        return -1
    per_try = float(os.environ.get(START_TIMEOUT_ENV, 60.0))
    return max(1, math.ceil(job.placement_wait_s / max(per_try, 1e-3)))


def _not_placed(err: BaseException) -> bool:
    """Whether Ray Train gave up placing the workers (its startup-timeout controller error;
    the class is internal to Ray Train, so it is recognized by name)."""
    from ray.train import ControllerError

    return isinstance(err, ControllerError) and \
        type(getattr(err, "controller_failure", None)).__name__ == "WorkerGroupStartupTimeoutError"


def _resources(job: TrainJob) -> str:
    return f"{job.cpus_per_worker:g} CPU" + (" + 1 GPU" if job.use_gpu else "")
