"""One rank's training loop, `run_loop`, and its `Trainer`, under any launcher: Ray Train
(`train_loop_per_worker`, the worker of `convs2s.train.launch.fit`) or one plain process /
torchrun (`convs2s.train.local.fit_local`). The launcher's part (rank, device, the checkpoint to
resume from, where checkpoints go) is a runtime object (`convs2s.train.runtime`); nothing here
imports Ray.

`run_loop` builds a `Trainer` (one per rank), restores it from the latest checkpoint, trains it
epoch by epoch until a limit is reached and returns its final metrics:

    trainer = Trainer(config, runtime)  # model (DDP), optimizer, lr schedule, data, logger
    trainer.restore()               # weights, optimizer, RNG states, position in the epoch
    while not trainer.should_stop():
        trainer.train_epoch()       # updates, then validate(), anneal, checkpoint()
    return trainer.finish()         # Result.return_value on the Ray driver

Each worker builds the model from the preset (same seed everywhere), wraps it in DDP
(`prepare_model`; gloo on CPU, nccl on GPU), iterates its equal share of the `train` batch rows (one
row = one batch; which rows and in what order each epoch is a plan made from the files, the seed,
the epoch and the number of ranks alone: convs2s.train.data), runs
`convs2s.train.update.train_update` (token-normalized over all ranks), validates every epoch,
anneals the lr (`convs2s.train.optim`), stops on the first limit reached (`STOP_REASONS`), and
checkpoints every `checkpoint_interval` updates and at each epoch end through the runtime's
`report` (a barrier: every rank calls it at the same updates). A restarted worker group resumes
from the latest checkpoint, RNG states and position in the epoch included: it trains exactly the
rows the interrupted epoch had not trained. Rank 0 logs to MLflow through
`convs2s.tracking.run_logger.RunLogger` and prints a progress line at most every `CONSOLE_SECONDS`.

Tests kill a worker mid-run, and record which rows each update trained, through
`convs2s.train.faults.CrashInjection` (environment variables of the driver, not a training
setting).
"""

from __future__ import annotations

import itertools
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from convs2s.io.checkpoint import (
    BEST_DIR,
    META_FILE,
    capture_rng_state,
    checkpoint_dir_name,
    reconcile_best,
    restore_rng_state,
    save_checkpoint,
)
from storage import location, publish_dir
from storage.lease import LeaseLost
from storage.scratch import scratch_dir
from convs2s.model.network import ConvS2S
from convs2s.train.optim import LRSchedule, build_optimizer, load_optimizer_state, set_lr
from convs2s.precision import Precision, world_precision
from convs2s.train.memory_fit import (BudgetTooLarge, WorstStep, agree_on_fit, check_fits,
                                      describe_steps, graph_shapes_that_fit, usable_bytes)
from convs2s.train.meter import TrainMeter, progress_line
from convs2s.tracking.run_logger import RunLogger
from convs2s.tracking.system_metrics import node_metrics, node_name
from convs2s.train.regularization import PassesProbe, choice_message, set_dropout
from convs2s.train.ddp import compress_gradients, ddp_kwargs
from convs2s.train.batches import static_batches, train_batches, valid_batches
from convs2s.train.data import (TrainFiles, data_identity, read_manifest, read_rows, resume_point,
                                 resumed_rows)
from convs2s.train.faults import UNFIT_RANK_ENV, CrashInjection
from convs2s.train.resume import (ResumeRefused, budget_changes, check_lease,
                                   check_same_model, check_same_training, initial_weights,
                                   recipe_changes)
from convs2s.console import worker_line as _say  # (one line on the console, once)
from convs2s.train.job import STOP_REASONS, Diverged, TrainJob
from convs2s.train.runtime import (StorageNotShared, agree_on_storage, load_agreed,
                                   quiet_reports, wait_until_gone)
from convs2s.train.update import apply_step_settings, compile_for_training, train_update
from convs2s.train.update import validate as validate_all_ranks

METRICS_FILE = "metrics.jsonl"  # rank 0's local copy of every metric, in the run directory
PRECISION_TAG = "convs2s.precision"  # the train run's decided precision; _reason: why


@dataclass
class Progress:
    epoch: int = 0  # completed epochs
    update: int = 0  # completed updates
    batches_in_epoch: int = 0  # batch rows this rank consumed in the current epoch
    seconds_before: float = 0.0  # training seconds spent up to the checkpoint resumed from
    started: float = 0.0  # time.monotonic() when this process began training
    # The current epoch's plans before this one (convs2s.train.data.resumed_rows): (rows done
    # on each rank, ranks) for each, when a resume changed the number of ranks mid-epoch; and
    # `batches_in_epoch` when this plan began (the rows each rank did on it: the difference).
    cuts: list = field(default_factory=list)
    plan_start: int = 0

    def seconds(self) -> float:
        """Training wall time of the run so far, resumes included (the max_time clock)."""
        return self.seconds_before + time.monotonic() - self.started


CONSOLE_SECONDS = 30.0  # progress lines at most this often (epoch ends and stops: always)


# The key of a worker's return value that carries a run-ending error to the Ray driver, as
# [its class name, its message]; the errors that travel so, by name.
STOPPED_KEY = "stopped_by"
STOPPING_ERRORS = {cls.__name__: cls for cls in (BudgetTooLarge, Diverged, LeaseLost,
                                                  ResumeRefused, StorageNotShared)}


def train_loop_per_worker(config: dict) -> dict:
    """Ray Train worker entry; `config` is the train_loop_config built by `fit`. A token budget
    the GPUs cannot hold (the same on every rank, `agree_on_fit`), a diverged run (the same
    on every rank, `Trainer._check_finite`) or a checkpoint this run may not resume (the same
    on every rank, `ResumeRefused`) is returned, not raised: a raised error would make Ray
    Train restart the group from its last checkpoint, to fail the same way again."""
    from convs2s.train.runtime import RayRuntime

    quiet_reports()
    try:
        return run_loop(config, RayRuntime(config["run_dir"]))
    except tuple(STOPPING_ERRORS.values()) as err:
        return {STOPPED_KEY: [type(err).__name__, str(err)]}


def run_loop(config: dict, runtime) -> dict:
    """The training loop of one rank under any launcher (`convs2s.train.runtime`): restore,
    epochs until a limit, the final metrics. `config`: job, run_dir, tracking_uri (Hidden),
    run_id, train_files, valid_files, crash."""
    job: TrainJob = config["job"]
    # One utilization sampler per node (its first worker), into the training run.
    interval = job.system_metrics_s if runtime.local_rank == 0 and config["run_id"] else 0.0
    with node_metrics(config["tracking_uri"].value, config["run_id"], node_name(runtime.node_rank),
                      interval):
        agree_on_storage(runtime.comm, config)  # (a node added after the driver's probe)
        trainer = Trainer(config, runtime)
        trainer.restore()
        while not trainer.should_stop():
            trainer.train_epoch()
        return trainer.finish()


class Trainer:
    """One rank's training: the model (DDP-wrapped), optimizer, lr schedule, collectives
    (`Comm`), where training stands (`Progress`), the meter and rank 0's logger, the run folder.

    Every rank makes the same calls in the same order: `restore`, `train_epoch`, `validate`
    and `checkpoint` hold collectives (all-reduces, gathers; `checkpoint` reports to Ray Train,
    a barrier). Between them each rank decides alone, but on numbers that are the same on every
    rank, so all agree on every stop and every checkpoint."""

    def __init__(self, config: dict, runtime):
        """`config`: the train_loop_config of `fit` (job, run_dir, tracking_uri, run_id,
        train_files, valid_files, crash); `runtime`: rank, device, checkpoints
        (`convs2s.train.runtime`)."""
        job: TrainJob = config["job"]
        self.job, self.cfg = job, job.train
        self.run_dir = location(config["run_dir"])  # a local / shared folder, or a bucket
        self.crash: CrashInjection = config.get("crash") or CrashInjection()
        self.runtime = runtime
        self.rank, self.world = runtime.rank, runtime.world_size
        self.device = runtime.device
        if self.device.type == "cpu":  # intra-op threads: the CPUs this rank may use
            torch.set_num_threads(runtime.cpu_threads(job))
        torch.manual_seed(self.cfg.seed)  # identical initial weights on every rank
        self.net = ConvS2S(job.model, job.vocab_size, job.tgt_vocab_size or job.vocab_size)
        convs, fused = apply_step_settings(self.net, self.cfg)  # TrainConfig.conv, .fuse
        if self.rank == 0 and self.cfg.fuse:
            _say(f"[convs2s.train] fuse={self.cfg.fuse}: the element-wise work of {fused} "
                 "blocks and attention layers compiled as 4 shared functions"
                 + (", and the loss's chunks" if self.device.type == "cuda" else ""))
        if self.rank == 0 and self.cfg.conv == "native":
            _say(f"[convs2s.train] conv=native: the {convs} convolutions' full pass by the "
                 "library's convolution, not k-frame windows")
        # to the device; DDP when world > 1, with the run's buckets and gradient compression
        self.model = compress_gradients(runtime.prepare_model(self.net, ddp_kwargs(self.cfg)),
                                        self.cfg.grad_compression)
        if self.rank == 0 and self.world > 1 and self.cfg.grad_compression != "none":
            _say(f"[convs2s.train] gradients all-reduced as {self.cfg.grad_compression} "
                 f"(grad_compression; buckets of {self.cfg.ddp_bucket_mb:g} MiB)")
        if self.cfg.compile:  # the training forward (model + fused loss): one dynamic graph
            self.model = compile_for_training(self.model, self.cfg.compile)
        # Static shapes (and CUDA graphs over them): the batches' token budget caps the ladder
        # of sentence counts (convs2s.train.collate.static_shape)
        self.budget = int(read_manifest(job.train_data).get("max_tokens") or 0) \
            if self.cfg.static_shapes else 0
        if self.cfg.cuda_graphs:
            self.model = self._graphed(self.model)
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg)
        self.schedule = LRSchedule(self.cfg)
        self.comm = runtime.comm  # (the runtime's gloo group: one a process, not two)
        self._tracking = (config["tracking_uri"].value, config["run_id"])
        # bf16 autocast or float32, decided once from every rank's hardware (a collective):
        # the same on every rank; the steps below see the decided value, never "auto".
        self.precision = world_precision(job.train.precision, self.device, self.comm)
        self.cfg = self.cfg.replace(precision=self.precision.name)
        if self.rank == 0:  # (its tags go to the run with the logger's, from restore)
            _say(f"[convs2s.train] precision {self.precision.name}: {self.precision.reason}")
        self._check_memory_fit()
        # Set by restore(), which then opens the logger, the data shards and the meter (in the
        # order the loop always made them: after the checkpoint is loaded).
        self.progress = Progress()
        self.resumed_from = 0  # the update of the checkpoint resumed from (0: a fresh start)
        self._checkpointed = 0
        self._uploading: Path | None = None  # the checkpoint folder Ray Train is uploading
        # The first update whose gradient norm was NaN or infinite (-1: none), kept on the
        # device (no host sync in a step); read where the loop reads the host anyway
        # (`_check_finite`: log lines, validation, checkpoints)
        self._nonfinite_at = torch.full((), -1, dtype=torch.int64, device=self.device)
        self.logger: RunLogger | None = None  # rank 0 only
        # The training rows: every rank plans its rows of each epoch from the files alone
        # (convs2s.train.data), so a resumed run trains exactly what its epoch had left.
        self.files: TrainFiles = config["train_files"]
        self.valid_files: TrainFiles = config["valid_files"]
        self.meter: TrainMeter | None = None
        self.rows_per_rank = self.files.rows_per_rank(self.world)  # batch rows of an epoch
        self.updates_per_epoch = math.ceil(self.rows_per_rank / self.cfg.update_freq)
        self.valid: list | None = None  # this rank's validation batches, kept after one read
        self.final: dict = {}  # the last validation's report
        self.seconds = 0.0  # the training clock at the last check (`_clock`)
        self.stop_reason: str | None = None  # a key of STOP_REASONS once a limit is reached
        self._last_line = -math.inf  # when the last progress line was printed
        # dropout_by_passes (convs2s.train.regularization): the choice once made, and the
        # timing that makes it
        self.dropout_choice: dict | None = None
        self.probe = PassesProbe(self.cfg.dropout_by_passes, self.cfg.passes_probe_updates)

    def _graphed(self, model: torch.nn.Module) -> torch.nn.Module:
        """The training step captured once per batch shape (convs2s.train.graphs) where it can
        be: on a CUDA device, one rank. Elsewhere the run says why and steps eagerly on the
        same padded batches."""
        why = None
        if self.device.type != "cuda":
            why = f"CUDA graphs need a CUDA device, this rank's is {self.device}"
        elif self.world > 1:  # DDP's gradient hooks inside a captured backward: not yet run
            why = f"captured steps run on one rank only so far, this run has {self.world}"
        if why:
            if self.rank == 0:
                _say(f"[convs2s.train] cuda_graphs off: {why}; stepping eagerly on the same "
                     f"static shapes")
            return model
        from convs2s.train.graphs import CudaGraphedLoss

        _say("[convs2s.train] cuda_graphs: each batch shape's forward and backward captured "
             "once and replayed")
        return CudaGraphedLoss(model)

    def _check_memory_fit(self) -> None:
        """On a GPU, the data's largest step once before training: a token budget this GPU
        cannot hold stops the run now, naming the largest that fits (convs2s.train.memory_fit).
        Every rank ends in the same agreement (a collective), whatever it found alone."""
        error, peak, worst = None, None, None
        if self.crash.unfit_rank == self.rank:  # fault injection (tests): see UNFIT_RANK_ENV
            error = BudgetTooLarge(f"fault injection: rank {self.rank} cannot hold the budget "
                                   f"({UNFIT_RANK_ENV})")
        elif self.device.type == "cuda":
            worst = WorstStep.of_data(self.job.train_data, self.net.max_positions)
        if worst is None and error is None and self.device.type == "cuda" and self.rank == 0:
            _say("[convs2s.train] GPU memory not checked before training: the batches' "
                 "manifest does not record their longest sentences (batches cut before "
                 "it did: preprocessing into a new --out records it)")
        extra, param_bytes = 0, 0
        if worst is not None:
            param_bytes = sum(p.numel() * p.element_size() for p in self.net.parameters())
            # what an update adds to the probed step (DDP's buckets, made with the wrapper, are
            # in it): the optimizer's state (Adam: two buffers; NAG: the momentum), and with
            # micro-batches the gradients kept through the next one's forward
            state = 2 if self.cfg.optimizer == "adam" else int(self.cfg.momentum > 0)
            extra = param_bytes * (state + int(self.cfg.update_freq > 1))
            try:
                peak = check_fits(self.net, worst, self.precision, self.device,
                                  self.cfg.label_smoothing, extra, self.cfg.static_shapes,
                                  self.net.max_positions)  # padded as `static_batches` pads
            except BudgetTooLarge as err:
                error = err
        # every rank, every path (a rank that skipped it would pair its next collective with
        # this one): all stop if one cannot hold the budget
        agree_on_fit(self.comm, error)
        if self.rank == 0 and peak is not None:
            steps = describe_steps(worst, None, self.cfg.static_shapes, self.net.max_positions)
            _say(f"[convs2s.train] GPU memory: the data's largest steps ({steps}) peak at "
                 f"{peak / 2**30:.1f} GiB (+{extra / 2**30:.1f} GiB for the update)")
        if peak is not None and hasattr(self.model, "max_shapes"):  # CUDA graphs: one rank
            cap = self.model.max_shapes
            self.model.max_shapes = graph_shapes_that_fit(
                peak, param_bytes, extra, usable_bytes(self.device)[0], cap)
            _say(f"[convs2s.train] cuda_graphs: up to {self.model.max_shapes} batch shapes "
                 f"captured (of {cap}; each keeps about {(peak - param_bytes) / 2**30:.1f} GiB), "
                 "the others stepped eagerly")

    # --- resuming ---------------------------------------------------------------------------

    def restore(self) -> None:
        """Resume from Ray's latest checkpoint (worker restart or rerun job), else start fresh;
        then open the logger and the data, start the clocks and check the limits (a resumed
        run may already have reached one)."""
        self.progress = self._load_latest()
        self.resumed_from = self.progress.update
        self._checkpointed = self.progress.update  # the update of the last checkpoint made
        self.logger = RunLogger(*self._tracking, self.run_dir / METRICS_FILE) \
            if self.rank == 0 else None
        if self.logger is not None:  # from the logger's thread: no rank waits for MLflow
            self.logger.set_tags({PRECISION_TAG: self.precision.name,
                                  PRECISION_TAG + "_reason": self.precision.reason})
        self.meter = TrainMeter(self.comm, self.device)  # its clock starts now
        if self._meter_state is not None:  # the log interval the checkpoint was inside
            self.meter.load_state_dict(self._meter_state)
        self.seconds = self._clock()
        self.stop_reason = self._limit_reached(self.seconds)
        if self.stop_reason is not None and self._unvalidated:
            # Resumed at a limit from an interval checkpoint that no validation followed (the
            # epoch's last update reached the limit and the worker died between its interval
            # checkpoint and the epoch's end; or the checkpoint's clock already past max_time):
            # the validation, best/ and epoch end the uninterrupted run made at this update.
            # It ended with none: no best/, no valid loss, an epoch short.
            self.final = self._end_epoch(self.progress.epoch + 1,
                                         epoch_end=len(self._rows_left()) == 0)

    def _rows_left(self):
        """This rank's rows of the current epoch not yet trained (the same count on every
        rank: the epoch's plan cuts them evenly)."""
        cfg, progress = self.cfg, self.progress
        return resumed_rows(self.files, cfg.seed, progress.epoch + 1, self.world, self.rank,
                            cfg.shuffle_buffer, [*progress.cuts, (progress.batches_in_epoch
                                                                  - progress.plan_start,
                                                                  self.world)])

    def _load_latest(self) -> Progress:
        cfg, rank, world = self.cfg, self.rank, self.world
        check_lease(self.job, self.comm, "resuming the run")  # (a worker group Ray restarted)
        with self.runtime.latest_checkpoint() as d:  # the same choice on every rank
            state = load_agreed(d, self.comm)  # read by every rank, or all stop
        self._meter_state = None
        # resumed from a checkpoint made between validations (an interval's)
        self._unvalidated = state is not None and state.get("val_loss") is None
        if state is None:
            if self.job.init_from:  # fine-tuning: a trained (or imported) model's weights
                self.net.load_state_dict(initial_weights(self.job))
            torch.manual_seed(cfg.seed + 1 + rank)  # per-rank dropout streams
            return Progress(started=time.monotonic())
        check_same_model(state, self.job, d)
        check_same_training(state, self.job, data_identity(self.job.train_data, self.files), d,
                            world)
        self.net.load_state_dict(state["model"])
        if self.job.train.precision == "auto" and state.get("precision", self.precision.name) \
                != self.precision.name:  # (a restart on other nodes: the run's own, said)
            here = self.precision
            self.precision = Precision(state["precision"], "auto, kept from the checkpoint "
                                       f"resumed; {here.name} here ({here.reason})")
            self.cfg = self.cfg.replace(precision=self.precision.name)
            if rank == 0:
                _say(f"[convs2s.train] precision {self.precision.name}: {self.precision.reason}")
            self._check_memory_fit()  # (checked with this machine's: float32 needs more)
        if state.get("dropout_choice"):  # the dropout chosen by the run's probe, kept
            self.dropout_choice = state["dropout_choice"]
            set_dropout(self.net, self.dropout_choice["dropout"])
        self.probe.resumed(state["update"], state.get("probe_start"))
        load_optimizer_state(self.optimizer, state["optimizer"])  # this device's fused step
        self.schedule.load_state_dict(state["scheduler"])
        # The interrupted epoch continues with exactly its untrained rows (train_data): on as
        # many workers as its last plan had, that plan goes on; on another number its rows left
        # are cut again, one cut more. Its progress counts the same share of the epoch.
        cuts, done, begun = resume_point(state.get("epoch_cuts"), state["batches_in_epoch"],
                                         state["world_size"], world)
        # The time budget continues from the checkpoint (time after it was lost with the process).
        progress = Progress(state["epoch"], state["update"], done,
                            float(state.get("train_seconds", 0.0)), time.monotonic(), cuts, begun)
        if state["rng"]["world_size"] == world:
            restore_rng_state(state["rng"]["states"][rank])
            meters = state.get("meters")  # (none in older checkpoints)
            self._meter_state = meters[rank] if meters else None
        else:
            torch.manual_seed(cfg.seed + 1 + rank + progress.update)
        if rank == 0:
            _say(f"[convs2s.train] resumed from update {progress.update} (epoch "
                 f"{progress.epoch} done, {progress.batches_in_epoch} batches into the next, "
                 f"{progress.seconds_before:.0f} s of training spent)")
            was = (state.get("train_config") or {}).get("lr")
            if was is not None and float(was) != cfg.lr:  # (the schedule's state decides)
                _say(f"[convs2s.train] lr {cfg.lr:g} asked, the checkpoint's run had lr "
                     f"{float(was):g}: its schedule goes on from its own state, lr "
                     f"{self.schedule.epoch_lr:g} now (a new lr is a new --run-name)")
            budget = budget_changes(state.get("train_config") or {}, cfg)
            if budget and cfg.lr_schedule in ("cosine", "linear"):
                _say(f"[convs2s.train] another budget than the checkpoint's run ({budget}): the "
                     f"{cfg.lr_schedule} lr follows the new budget from where the run stands "
                     "(where it grew, the lr goes back up from near 0: a warm restart, not the "
                     "run a budget this size from the start trains)")
            if other := recipe_changes(state.get("train_config") or {}, cfg, state,
                                       self.job.model):
                _say(f"[convs2s.train] resumed with other training settings than the "
                     f"checkpoint's run: {other}; the rest of the run trains with them (give "
                     "its own to train on as it began)")
            # A death between reporting a checkpoint and copying it to best/ left best/ stale:
            # best/ is what this checkpoint says is best.
            fixed = reconcile_best(self.run_dir, self.schedule.best_loss, progress.update)
            if fixed != "ok":
                _say(f"[convs2s.train] best/: {fixed}")
        return progress

    # --- training ---------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """Whether a limit is reached (`stop_reason` says which): the same on every rank."""
        return self.stop_reason is not None

    def train_epoch(self) -> dict:
        """Train the rest of the next epoch, up to its end or the first limit reached (every
        rank stops at the same update), then validate, anneal and checkpoint; returns the
        validation's report (also kept as `final`)."""
        cfg, progress, meter = self.cfg, self.progress, self.meter
        epoch = progress.epoch + 1
        rows = self._rows_left()
        batches = train_batches(read_rows(self.files, rows, cfg.shuffle_buffer),
                                 self.net.max_positions)
        if cfg.static_shapes:
            batches = static_batches(batches, self.budget, cfg.static_shapes,
                                     self.net.max_positions)
        updates_at_start = progress.update - progress.batches_in_epoch // cfg.update_freq
        left = len(rows)  # every rank has as many: all see the last update alike
        epoch_end = True
        # (resumed at the epoch's last update, none is made here: the lr it was made with)
        trained_lr = self.schedule.lr_at(max(progress.update - 1, 0), self._spent(self.seconds))
        meter.resume()
        while True:
            micro = list(itertools.islice(batches, cfg.update_freq))
            lr = self.schedule.lr_at(progress.update, self._spent(self.seconds))
            set_lr(self.optimizer, lr)
            stats = train_update(self.model, self.optimizer, micro, cfg, self.comm, self.device)
            if stats is None:
                break  # some rank's shard is exhausted: the epoch ends on every rank
            trained_lr = lr  # (the lr of the last update made, for the epoch's last interval)
            progress.update += 1
            progress.batches_in_epoch += len(micro)
            left -= len(micro)
            meter.add(stats, micro)
            self._nonfinite_at = torch.where(
                (self._nonfinite_at < 0) & ~torch.isfinite(stats.grad_norm), progress.update,
                self._nonfinite_at)
            self.crash.record(self.rank, progress.update, micro)
            self.crash.maybe_crash(self.rank, progress.update, self.run_dir)
            self.seconds = self._clock()
            if cfg.dropout_by_passes and cfg.max_time and self.dropout_choice is None:
                self._probe_passes()
            if progress.update % cfg.log_interval == 0:
                self._log_train(epoch, lr, updates_at_start)
            self.stop_reason = self._limit_reached(self.seconds)  # update or time limit
            if self.stop_reason is not None and left:
                epoch_end = False  # stopped inside the epoch: validate and checkpoint here
                break
            if cfg.checkpoint_interval and progress.update % cfg.checkpoint_interval == 0:
                meter.pause()  # (a checkpoint is not training time: TrainMeter)
                self.checkpoint({"update": progress.update, "epoch": progress.epoch})
                meter.resume()
            if not left:  # the epoch's last update (a limit reached there ends it too)
                break
        if epoch_end and meter.updates:  # (the same count on every rank: a collective)
            # the epoch's last interval: its updates are in the curve, and the next interval
            # is the next epoch's alone (a run stopped inside an epoch keeps its interval in
            # its checkpoint, for the continued run to log whole, as an uninterrupted one does)
            self._log_train(epoch, trained_lr, updates_at_start)
        meter.pause()
        self.final = self._end_epoch(epoch, epoch_end)
        self.seconds = self._clock()
        self.stop_reason = self.stop_reason or self._limit_reached(self.seconds)
        return self.final

    def _log_train(self, epoch: int, lr: float, updates_at_start: int) -> None:
        """The interval's train metrics (a collective: every rank), logged and said by rank 0."""
        metrics = self.meter.read(lr)  # collective
        self._check_finite()
        if self.logger is None:
            return
        update = self.progress.update
        graphs = {}
        if hasattr(self.model, "eager_steps"):  # CUDA graphs on: shapes past the cap run eagerly
            graphs = {"train/graph_shapes": self.model.captured_shapes,
                      "train/graph_eager_steps": self.model.eager_steps}
        self.logger.log_metrics({**metrics, **graphs, "train/epoch": epoch,
                                 "train/seconds": self.seconds}, update)
        eta = (self.updates_per_epoch - (update - updates_at_start)) \
            / max(metrics["train/updates_per_s"], 1e-9)
        if time.monotonic() - self._last_line >= CONSOLE_SECONDS:
            self._last_line = time.monotonic()
            line = progress_line(epoch, update, metrics, eta)
            if graphs:
                line += (f" | graphs {graphs['train/graph_shapes']} shapes, "
                         f"{graphs['train/graph_eager_steps']} eager steps")
            _say(f"[convs2s.train] {line}")

    def _check_finite(self, val_loss: float | None = None) -> None:
        """Raise `Diverged` when an update's gradient norm (or `val_loss`) was NaN or
        infinite: the step has written it into the weights and the momentum, and every later
        update would train on from there, saving NaN checkpoints (the reference stops too).
        The same on every rank: the norm is of the all-reduced gradients, the loss summed over
        the ranks."""
        at = int(self._nonfinite_at.item())
        if at < 0 and (val_loss is None or math.isfinite(val_loss)):
            return
        what = (f"the gradient norm of update {at:,} was NaN or infinite" if at >= 0 else
                f"the validation loss after update {self.progress.update:,} was {val_loss}")
        kept = (f"the last checkpoint, at update {self._checkpointed:,}, is from before it "
                "(nothing after it is saved)" if self._checkpointed else
                "no checkpoint was made before it")
        clip = self.cfg.clip_norm
        raise Diverged(
            f"training diverged: {what}; {kept}. Lower the learning rate (train.lr, "
            f"{self.schedule.epoch_lr:g} now) or the clip norm (train.clip_norm, "
            f"{clip:g}{': off' if clip <= 0 else ''}), or train in fp32 (train.precision), "
            "and start a new run (another --run-name)")

    def validate(self) -> tuple[float, float, int]:
        """(loss sum, nll sum, target tokens) of the validation set, summed over all ranks (a
        collective). The batches are read on the first call and kept: validation sets are
        small (thousands of sentences)."""
        if self.valid is None:
            self.valid = list(valid_batches(self.valid_files, self.comm))
        return validate_all_ranks(self.net, self.valid, self.comm, self.device, self.cfg)

    def _end_epoch(self, epoch: int, epoch_end: bool) -> dict:
        """Validate (all ranks), anneal, log, checkpoint (with best/ when it improved)."""
        progress, schedule = self.progress, self.schedule
        loss, nll, ntok = self.validate()
        val_loss = nll / max(ntok, 1)  # per-token nll: perplexity = exp(val_loss)
        self._check_finite(val_loss)  # before the schedule or a checkpoint takes it
        best_before = schedule.best_loss
        # Epochs of training behind this validation: whole at an epoch end, a fraction when a
        # limit stopped training inside the epoch (the same number in every log and metric).
        epochs = float(epoch) if epoch_end else \
            epoch - 1 + min(progress.batches_in_epoch / max(self.rows_per_rank, 1), 1.0)
        if epoch_end:
            progress.epoch, progress.batches_in_epoch = epoch, 0
            progress.cuts, progress.plan_start = [], 0
            schedule.end_epoch(epoch, val_loss)
        else:
            schedule.mid_epoch(val_loss)  # stopped mid-epoch by a limit: no annealing
        # The lr the next update will use: the epoch's lr after annealing, then warmup and the
        # budget's cosine / linear decay (schedule.epoch_lr alone is the undecayed peak).
        next_lr = schedule.lr_at(progress.update, self._spent(progress.seconds()))
        metrics = {"valid/loss": loss / max(ntok, 1), "valid/nll": val_loss,
                   "valid/ppl": math.exp(min(val_loss, 50.0)), "valid/tokens": ntok,
                   "valid/seconds": progress.seconds(),  # the training clock: curve vs wall time
                   "epoch": round(epochs, 3), "lr": next_lr}
        if self.logger is not None:
            self.logger.log_metrics(metrics, progress.update)
            where = f"epoch {epoch} done" if epoch_end else f"stopped at {epochs:.2f} epochs"
            nll = f" (label-smoothed; nll {val_loss:.3f})" if f"{metrics['valid/loss']:.3f}" \
                != f"{val_loss:.3f}" else ""  # (the ppl, best/ and plateau are the nll's)
            _say(f"[convs2s.train] {where} | update {progress.update} | valid loss "
                 f"{metrics['valid/loss']:.3f}{nll} | valid ppl {metrics['valid/ppl']:.2f} | "
                 f"next lr {next_lr:.3g}")
        report = {"update": progress.update, "epoch": progress.epoch,
                  "epochs": round(epochs, 3), "val_loss": val_loss,
                  "val_ppl": metrics["valid/ppl"], "lr": next_lr}
        is_best = best_before is None or val_loss < best_before
        self.checkpoint(report, val_loss, epoch_end, is_best)
        return report

    def checkpoint(self, metrics: dict, val_loss: float | None = None,
                   end_of_epoch: bool = False, is_best: bool = False) -> None:
        """Report `metrics` with a checkpoint of the run as it stands. Every rank calls this at
        the same update (the runtime's report is a barrier; the RNG states are gathered from all
        ranks); rank 0 writes, and copies it to best/ when `is_best` (validation improved)."""
        progress, comm = self.progress, self.comm
        self._check_finite()  # never a checkpoint of weights a NaN gradient reached
        check_lease(self.job, comm, f"writing its checkpoint at update {progress.update}")
        # An epoch's end at an update already checkpointed (an interval checkpoint at the
        # epoch's last update, or the one a rerun resumed from) gets a name of its own, as
        # does a validation inside an epoch at such an update (`restore` at a limit).
        again = progress.update == self._checkpointed and (end_of_epoch or val_loss is not None)
        first = self._checkpointed == 0  # the run's first checkpoint (none to resume from)
        self._checkpointed = progress.update
        rngs = comm.gather_objects(capture_rng_state())
        meters = comm.gather_objects(self.meter.state_dict() if self.meter is not None
                                     else None)
        if comm.rank != 0:
            self.runtime.report(metrics)
            return
        job = self.job
        state = {
            "model": self.net.state_dict(), "model_config": job.model.to_dict(),
            "src_vocab_size": job.vocab_size,
            "tgt_vocab_size": job.tgt_vocab_size or job.vocab_size,
            "train_config": job.train.to_dict(), "epoch": progress.epoch,
            "update": progress.update, "batches_in_epoch": progress.batches_in_epoch,
            "world_size": comm.world_size, "optimizer": self.optimizer.state_dict(),
            "epoch_cuts": [[int(d), int(w)] for d, w in progress.cuts]
            + [[progress.batches_in_epoch - progress.plan_start, comm.world_size]],
            "scheduler": self.schedule.state_dict(),
            "rng": {"world_size": comm.world_size, "states": rngs},
            "meters": meters if all(m is not None for m in meters) else None,
            "val_loss": val_loss,
            "train_seconds": progress.seconds(), "precision": self.precision.name,
            "dropout_choice": self.dropout_choice, "probe_start": self.probe.start_seconds,
            "train_data": data_identity(job.train_data, self.files),
        }
        # One checkpoint uploading at a time: storage slower than the checkpoints come would
        # otherwise pile them up on the local disk (2 GB each for the paper's En-Fr model)
        # and leave the checkpoint a resume takes further and further behind
        waited = wait_until_gone(self._uploading)
        if waited > 5:
            _say(f"[convs2s.train] waited {waited:.0f} s for the last checkpoint's upload "
                 "(storage slower than the checkpoints come: a longer checkpoint_interval)")
        tmp = scratch_dir("convs2s-ckpt-")  # (one a killed worker left is removed later)
        tmp.chmod(0o755)  # mkdtemp makes it private; best/ is copied from it onto shared storage
        handed = False  # tmp given to the runtime's background upload (which deletes it)
        try:
            save_checkpoint(tmp, state, spm_model=job.spm_model, end_of_epoch=end_of_epoch,
                            text_files=job.text_files, durable=False)
            # best/ before the report: a death in between leaves a best/ newer than the
            # checkpoint resumed from, which the resumed run repairs (reconcile_best); after
            # the report, the checkpoint Ray keeps could be the best with no best/ copy of it.
            # But the run's first checkpoint goes first: a best/ with no checkpoint beside it
            # is taken for another run's model (checkpoint.foreign_best), and a death after it
            # leaves the checkpoint with no best/, which reconcile_best makes from it.
            best = is_best and val_loss is not None  # meta.json last: best/ whole or absent
            if best and not first:
                publish_dir(tmp, self.run_dir / BEST_DIR, marker=META_FILE)
            # Uploaded in the background while training goes on, except the first (best/ is
            # copied from tmp after it, which the background upload deletes when done)
            name = checkpoint_dir_name(progress.update, progress.epoch if again and end_of_epoch
                                       else None, validated=again and not end_of_epoch)
            handed = self.runtime.report(metrics, tmp, name, background=not first)
            self._uploading = tmp if handed else None
            if best and first:
                publish_dir(tmp, self.run_dir / BEST_DIR, marker=META_FILE)
            if self.logger is not None:
                self.logger.sync()  # metrics.jsonl in a bucket: as of this checkpoint
        finally:
            if not handed:
                shutil.rmtree(tmp, ignore_errors=True)

    def finish(self) -> dict:
        """Say why training stopped (rank 0), flush the logger; the run's final metrics (rank
        0's become Result.return_value on the driver)."""
        progress = self.progress
        if self.rank == 0:
            _say(f"[convs2s.train] stopped after update {progress.update} ({progress.epoch} "
                 f"full epochs, {progress.seconds():.0f} s of training): "
                 f"{STOP_REASONS[self.stop_reason]}")
        if self.logger is not None:
            self.logger.close()
        return {"update": progress.update, "epoch": progress.epoch,
                "resumed_from_update": self.resumed_from,
                "best_val_loss": self.schedule.best_loss, **self.final,
                "train_seconds": progress.seconds(), "stop_reason": self.stop_reason,
                "precision": self.precision.name, "dropout_choice": self.dropout_choice}

    def _probe_passes(self) -> None:
        """dropout_by_passes: time `passes_probe_updates` updates after the first few, project
        the budget's passes, set the dropout once (the same on every rank: the clock is)."""
        choice = self.probe.observe(self.progress.update, self.seconds, self.cfg.max_time,
                                    self.updates_per_epoch)
        if choice is None:
            return
        set_dropout(self.net, choice["dropout"])
        self.dropout_choice = choice
        if self.rank == 0:
            p = choice["dropout"]
            _say(f"[convs2s.train] {choice_message(self.dropout_choice)}")
            if self.logger is not None:
                self.logger.set_tags({"convs2s.dropout": p, "convs2s.dropout_reason":
                                      choice_message(self.dropout_choice)})

    # --- the clock and the limits -------------------------------------------------------------

    def _clock(self) -> float:
        """Seconds of training so far. With a time budget every rank gets the same value (the
        mean of the ranks' clocks, one small all-reduce), so all stop at the same update and a
        time-based lr is the same everywhere."""
        if not self.cfg.max_time or self.comm.world_size == 1:
            return self.progress.seconds()
        return self.comm.sum_ints([round(self.progress.seconds() * 1000)])[0] / 1000 \
            / self.comm.world_size

    def _spent(self, seconds: float) -> float:
        """The fraction of the run's budget spent: the furthest of time, updates and epochs."""
        cfg, progress = self.cfg, self.progress
        spent = [seconds / cfg.max_time if cfg.max_time else 0.0,
                 progress.update / cfg.max_updates if cfg.max_updates else 0.0]
        if cfg.max_epochs:
            spent.append((progress.epoch
                          + progress.batches_in_epoch / max(self.rows_per_rank, 1))
                         / cfg.max_epochs)
        return max(spent)

    def _limit_reached(self, seconds: float) -> str | None:
        """Why training must stop now (a key of STOP_REASONS), or None. Called at the same
        points on every rank with the same `seconds` (`_clock`)."""
        cfg, progress = self.cfg, self.progress
        if cfg.max_updates and progress.update >= cfg.max_updates:
            return "max_updates"
        if cfg.max_time and seconds >= cfg.max_time:
            return "max_time"
        if cfg.max_epochs and progress.epoch >= cfg.max_epochs:
            return "max_epochs"
        if self.schedule.should_stop():
            return "min_lr"
        return None
