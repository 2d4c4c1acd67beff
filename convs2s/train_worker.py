"""The Ray Train worker of `convs2s.train.fit`: `train_loop_per_worker` and what it needs.

Each worker builds the model from the preset (same seed everywhere), wraps it in DDP
(`prepare_model`; gloo on CPU, nccl on GPU), iterates its equal shard of the `train` batch rows
(one row = one batch, reshuffled every epoch by file order and a local shuffle buffer), runs
`convs2s.update.train_update` (token-normalized over all ranks), validates every epoch, anneals
the lr (`convs2s.optim`), stops on the first limit reached (`STOP_REASONS`), and checkpoints
every `checkpoint_interval` updates and at each epoch end through `ray.train.report` (a
barrier: every rank calls it at the same updates). A restarted worker group resumes from the
latest checkpoint, RNG states and position in the epoch included. Rank 0 logs to MLflow through
`convs2s.run_logger.RunLogger` and prints a progress line at most every `CONSOLE_SECONDS`.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import (
    Checkpoint,
)

from convs2s.checkpoint import (
    BEST_DIR,
    capture_rng_state,
    checkpoint_dir_name,
    load_checkpoint,
    replace_dir,
    restore_rng_state,
    save_checkpoint,
)
from convs2s.collate import collate_arrow
from convs2s.config import TrainConfig
from convs2s.model import ConvS2S
from convs2s.optim import LRSchedule, build_optimizer, set_lr
from convs2s.progress import TrainMeter, progress_line
from convs2s.run_logger import RunLogger
from convs2s.system_metrics import node_metrics, node_name
from convs2s.train_job import STOP_REASONS, TrainJob
from convs2s.update import Comm, train_update, validate

METRICS_FILE = "metrics.jsonl"  # rank 0's local copy of every metric, in the run directory
CRASH_MARKER = ".crash_injected"


@dataclass
class Progress:
    epoch: int = 0  # completed epochs
    update: int = 0  # completed updates
    batches_in_epoch: int = 0  # batch rows this rank consumed in the current epoch
    seconds_before: float = 0.0  # training seconds spent up to the checkpoint resumed from
    started: float = 0.0  # time.monotonic() when this process began training

    def seconds(self) -> float:
        """Training wall time of the run so far, resumes included (the max_time clock)."""
        return self.seconds_before + time.monotonic() - self.started



# Progress lines on the console at most this often (metrics.jsonl and MLflow still get every
# log_interval); epoch ends and stops always print.
CONSOLE_SECONDS = 30.0


def _say(line: str) -> None:
    """One line on the worker's stdout, which Ray forwards to the driver's console once.
    Not print(): Ray Train patches it in workers to log *and* echo, so each line came twice."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _quiet_reports() -> None:
    """Ray Train (2.60) logs every `ray.train.report` of every rank at INFO on a logger named
    after its source file, which `LoggingConfig` does not reach: two console lines per
    checkpoint. The workers' own progress lines say the same; keep those only."""
    try:
        from ray.train.v2._internal.execution import context as train_context

        logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    except ImportError:  # another Ray version: nothing to quiet
        pass


def train_loop_per_worker(config: dict) -> dict:
    """Ray Train worker entry; `config` is the train_loop_config built by `fit`."""
    _quiet_reports()
    job: TrainJob = config["job"]
    ctx = ray.train.get_context()
    # One utilization sampler per node (its first worker), into the training run.
    interval = job.system_metrics_s if ctx.get_local_rank() == 0 else 0.0
    with node_metrics(config["tracking_uri"], config["run_id"], node_name(ctx.get_node_rank()),
                      interval):
        return _train(config, job)


def _train(config: dict, job: TrainJob) -> dict:
    cfg, run_dir = job.train, Path(config["run_dir"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cpu":  # intra-op threads = the CPUs Ray reserved for this worker
        torch.set_num_threads(max(1, int(job.cpus_per_worker)))
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    net = ConvS2S(job.model, job.vocab_size, job.vocab_size)
    model = ray.train.torch.prepare_model(net)  # to device; DDP when world > 1
    optimizer = build_optimizer(model.parameters(), cfg)
    schedule = LRSchedule(cfg)
    comm = Comm.create()
    progress = _restore(net, optimizer, schedule, cfg, rank, world)
    resumed_from = progress.update
    logger = RunLogger(config["tracking_uri"], config["run_id"], run_dir / METRICS_FILE) \
        if rank == 0 else None
    rows_per_rank = config["train_rows"] // world  # batch rows of one epoch on each rank
    updates_per_epoch = math.ceil(rows_per_rank / cfg.update_freq)
    train_shard = ray.train.get_dataset_shard("train")
    valid_shard = ray.train.get_dataset_shard("valid")
    meter = TrainMeter(comm, device)
    valid = None  # this rank's share of the validation batches, kept after the first read
    final: dict = {}
    seconds = _clock(cfg, progress, comm)
    stop = _stop_reason(cfg, progress, schedule, seconds)
    last_line = -math.inf  # when the last progress line was printed
    while stop is None:
        epoch = progress.epoch + 1
        batches = _train_batches(train_shard, cfg, epoch, progress.batches_in_epoch,
                                 net.max_positions)
        updates_at_start = progress.update - progress.batches_in_epoch // cfg.update_freq
        epoch_end = True
        meter.resume()
        while True:
            micro = list(itertools.islice(batches, cfg.update_freq))
            lr = schedule.lr_at(progress.update, _spent(cfg, progress, seconds, rows_per_rank))
            set_lr(optimizer, lr)
            stats = train_update(model, optimizer, micro, cfg, comm, device)
            if stats is None:
                break  # some rank's shard is exhausted: the epoch ends on every rank
            progress.update += 1
            progress.batches_in_epoch += len(micro)
            meter.add(stats, micro)
            _maybe_crash(cfg, rank, progress.update, run_dir)
            seconds = _clock(cfg, progress, comm)
            if progress.update % cfg.log_interval == 0:
                metrics = meter.read(lr)  # collective
                if logger is not None:
                    logger.log_metrics({**metrics, "train/epoch": epoch,
                                        "train/seconds": seconds}, progress.update)
                    eta = (updates_per_epoch - (progress.update - updates_at_start)) \
                        / max(metrics["train/updates_per_s"], 1e-9)
                    if time.monotonic() - last_line >= CONSOLE_SECONDS:
                        last_line = time.monotonic()
                        _say(f"[convs2s.train] "
                             f"{progress_line(epoch, progress.update, metrics, eta)}")
            stop = _stop_reason(cfg, progress, schedule, seconds)  # update or time limit
            if stop is not None:
                epoch_end = False  # stopped inside the epoch: validate and checkpoint here
                break
            if cfg.checkpoint_interval and progress.update % cfg.checkpoint_interval == 0:
                _checkpoint(job, net, optimizer, schedule, progress, comm, run_dir,
                            {"update": progress.update, "epoch": progress.epoch}, None, False)
        meter.pause()
        if valid is None:  # read once: validation sets are small (thousands of sentences)
            valid = list(_valid_batches(valid_shard, comm))
        final = _end_epoch(job, net, optimizer, schedule, progress, comm, run_dir, valid,
                           device, logger, epoch, epoch_end, rows_per_rank)
        seconds = _clock(cfg, progress, comm)
        stop = stop or _stop_reason(cfg, progress, schedule, seconds)
    if rank == 0:
        _say(f"[convs2s.train] stopped after update {progress.update} ({progress.epoch} full "
             f"epochs, {progress.seconds():.0f} s of training): {STOP_REASONS[stop]}")
    if logger is not None:
        logger.close()
    # Rank 0's return value becomes Result.return_value: the final metrics of the run.
    return {"update": progress.update, "epoch": progress.epoch,
            "resumed_from_update": resumed_from, "best_val_loss": schedule.best_loss,
            **final, "train_seconds": progress.seconds(), "stop_reason": stop}


def _end_epoch(job, net, optimizer, schedule, progress, comm, run_dir, valid, device, logger,
               epoch, epoch_end, rows_per_rank) -> dict:
    """Validate (all ranks), anneal, log, checkpoint (with best/ when it improved)."""
    cfg = job.train
    loss, nll, ntok = validate(net, valid, comm, device, cfg)
    val_loss = nll / max(ntok, 1)  # per-token nll: perplexity = exp(val_loss)
    best_before = schedule.best_loss
    # Epochs of training behind this validation: whole at an epoch end, a fraction when a
    # limit stopped training inside the epoch (the same number in every log and metric).
    epochs = float(epoch) if epoch_end else \
        epoch - 1 + min(progress.batches_in_epoch / max(rows_per_rank, 1), 1.0)
    if epoch_end:
        progress.epoch, progress.batches_in_epoch = epoch, 0
        schedule.end_epoch(epoch, val_loss)
    elif best_before is None or val_loss < best_before:
        schedule.best_loss = val_loss  # stopped mid-epoch by max_updates: no annealing
    # The lr the next update will use: the epoch's lr after annealing, then warmup and the
    # budget's cosine / linear decay (schedule.epoch_lr alone is the undecayed peak).
    next_lr = schedule.lr_at(progress.update, _spent(cfg, progress, progress.seconds(),
                                                     rows_per_rank))
    metrics = {"valid/loss": loss / max(ntok, 1), "valid/nll": val_loss,
               "valid/ppl": math.exp(min(val_loss, 50.0)), "valid/tokens": ntok,
               "valid/seconds": progress.seconds(),  # the training clock: curve vs wall time
               "epoch": round(epochs, 3), "lr": next_lr}
    if logger is not None:
        logger.log_metrics(metrics, progress.update)
        where = f"epoch {epoch} done" if epoch_end else f"stopped at {epochs:.2f} epochs"
        _say(f"[convs2s.train] {where} | update {progress.update} | valid loss "
             f"{metrics['valid/loss']:.3f} | valid ppl {metrics['valid/ppl']:.2f} | "
             f"next lr {next_lr:.3g}")
    report = {"update": progress.update, "epoch": progress.epoch,
              "epochs": round(epochs, 3), "val_loss": val_loss,
              "val_ppl": metrics["valid/ppl"], "lr": next_lr}
    is_best = best_before is None or val_loss < best_before
    _checkpoint(job, net, optimizer, schedule, progress, comm, run_dir, report, val_loss,
                epoch_end, is_best)
    return report


def _clock(cfg: TrainConfig, progress: Progress, comm: Comm) -> float:
    """Seconds of training so far. With a time budget every rank gets the same value (the mean
    of the ranks' clocks, one small all-reduce), so all stop at the same update and a
    time-based lr is the same everywhere."""
    if not cfg.max_time or comm.world_size == 1:
        return progress.seconds()
    return comm.sum_ints([round(progress.seconds() * 1000)])[0] / 1000 / comm.world_size


def _spent(cfg: TrainConfig, progress: Progress, seconds: float, rows_per_rank: int) -> float:
    """The fraction of the run's budget spent: the furthest of time, updates and epochs."""
    spent = [seconds / cfg.max_time if cfg.max_time else 0.0,
             progress.update / cfg.max_updates if cfg.max_updates else 0.0]
    if cfg.max_epochs:
        spent.append((progress.epoch + progress.batches_in_epoch / max(rows_per_rank, 1))
                     / cfg.max_epochs)
    return max(spent)


def _stop_reason(cfg: TrainConfig, progress: Progress, schedule: LRSchedule,
                 seconds: float) -> str | None:
    """Why training must stop now (a key of STOP_REASONS), or None. Called at the same points
    on every rank with the same `seconds` (`_clock`)."""
    if cfg.max_updates and progress.update >= cfg.max_updates:
        return "max_updates"
    if cfg.max_time and seconds >= cfg.max_time:
        return "max_time"
    if cfg.max_epochs and progress.epoch >= cfg.max_epochs:
        return "max_epochs"
    if schedule.should_stop():
        return "min_lr"
    return None


def _rows(shard, prefetch: int):
    """The shard's batch rows as one-row tables, read a whole Ray Data block at a time.

    Asking Ray Data for one row at a time (batch_size=1), or letting it shuffle rows
    (local_shuffle_buffer_size), cost 10-15% of a CPU training step: each call slices and
    concatenates Arrow tables in the iterator thread, which competes with torch's threads."""
    for block in shard.iter_batches(batch_size=None, batch_format="pyarrow",
                                    prefetch_batches=prefetch):
        for i in range(block.num_rows):
            yield block.slice(i, 1)  # zero-copy


def shuffled(items, size: int, rng: random.Random):
    """Shuffle a stream through a buffer of `size` items (0: keep the order)."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def _train_batches(shard, cfg: TrainConfig, epoch: int, skip: int, max_positions: int):
    """This rank's batches of one epoch, in a new order every epoch (Ray Data shuffles the
    file order, a buffer of `shuffle_buffer` rows the rest); skips the `skip` rows a resumed
    run already trained on in this epoch."""
    rows = shuffled(_rows(shard, prefetch=2), cfg.shuffle_buffer,
                    random.Random(cfg.seed * 100_003 + epoch))
    for table in itertools.islice(rows, skip, None):
        batch = collate_arrow(table)
        longest = max(batch.src_tokens.shape[1], batch.target.shape[1])
        if longest > max_positions:
            raise ValueError(
                f"batch with sentence ids {batch.ids[:5].tolist()} has a {longest}-token "
                f"sentence, over the model's max_positions={max_positions}: filter longer "
                "sentences in preprocessing or raise ModelConfig.max_positions")
        yield batch


def _valid_batches(shard, comm: Comm):
    """Every rank reads all validation rows and keeps those whose first sentence id falls to
    it: the split does not depend on the order in which rows arrive."""
    for table in _rows(shard, prefetch=1):
        batch = collate_arrow(table)
        if int(batch.ids[0]) % comm.world_size == comm.rank:
            yield batch


def _maybe_crash(cfg: TrainConfig, rank: int, update: int, run_dir: Path) -> None:
    """Fault injection for tests: a real process death, once per run directory."""
    if cfg.crash_at_update and update == cfg.crash_at_update and rank == cfg.crash_rank:
        marker = run_dir / CRASH_MARKER
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            _say(f"[convs2s.train] fault injection: rank {rank} exits at update {update}")
            # Let Ray's controller collect the last report first (it polls workers every 2 s),
            # as when a machine dies some time after its last checkpoint.
            time.sleep(5)
            os._exit(1)


def _checkpoint(job: TrainJob, net, optimizer, schedule, progress: Progress, comm: Comm,
                run_dir: Path, metrics: dict, val_loss: float | None, end_of_epoch: bool,
                is_best: bool = False) -> None:
    """Every rank calls this at the same update (ray.train.report is a barrier); rank 0 writes."""
    rngs = comm.gather_objects(capture_rng_state())
    if comm.rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    state = {
        "model": net.state_dict(), "model_config": job.model.to_dict(),
        "src_vocab_size": job.vocab_size, "tgt_vocab_size": job.vocab_size,
        "train_config": job.train.to_dict(), "epoch": progress.epoch, "update": progress.update,
        "batches_in_epoch": progress.batches_in_epoch, "world_size": comm.world_size,
        "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
        "rng": {"world_size": comm.world_size, "states": rngs}, "val_loss": val_loss,
        "train_seconds": progress.seconds(),
    }
    tmp = Path(tempfile.mkdtemp(prefix="convs2s-ckpt-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; best/ is copied from it onto shared storage
    try:
        save_checkpoint(tmp, state, spm_model=job.spm_model, end_of_epoch=end_of_epoch)
        ray.train.report(metrics, checkpoint=Checkpoint.from_directory(str(tmp)),
                         checkpoint_dir_name=checkpoint_dir_name(progress.update))
        if is_best and val_loss is not None:
            replace_dir(tmp, run_dir / BEST_DIR)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _restore(net, optimizer, schedule: LRSchedule, cfg: TrainConfig, rank: int,
             world: int) -> Progress:
    """Resume from Ray's latest checkpoint (worker restart or rerun job), else start fresh."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        torch.manual_seed(cfg.seed + 1 + rank)  # per-rank dropout streams
        return Progress(started=time.monotonic())
    with ckpt.as_directory() as d:
        state = load_checkpoint(d)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["scheduler"])
    skip = state["batches_in_epoch"] * state["world_size"] // world  # same rows if world changed
    # The time budget continues from the checkpoint (time after it was lost with the process).
    progress = Progress(state["epoch"], state["update"], skip,
                        float(state.get("train_seconds", 0.0)), time.monotonic())
    if state["rng"]["world_size"] == world:
        restore_rng_state(state["rng"]["states"][rank])
    else:
        torch.manual_seed(cfg.seed + 1 + rank + progress.update)
    if rank == 0:
        _say(f"[convs2s.train] resumed from update {progress.update} (epoch "
             f"{progress.epoch} done, {progress.batches_in_epoch} batches into the next, "
             f"{progress.seconds_before:.0f} s of training spent)")
    return progress
