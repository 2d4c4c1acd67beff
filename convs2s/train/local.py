"""Training without Ray: the same loop (`convs2s.train.trainer.run_loop`) in one process, or in
each rank of a torchrun world, on preprocessed batches. For a machine that has PyTorch, pyarrow
and sentencepiece but not Ray or MLflow (a lent GPU box), a quick look at a recipe, or a debugger.

    from convs2s.train.local import fit_local
    result = fit_local(job)                 # a TrainJob, as for convs2s.train.launch.fit
    result = fit_local(job, device="cuda")  # the default: this rank's GPU if any, else the CPU

    # PREP: a preprocessing output; CUT: its batches for one token budget, PREP/batches/<hash>
    python -m convs2s train --train-data CUT/train --valid-data CUT/valid \
        --spm-model PREP/spm.model --model small --storage-path runs --run-name demo \
        --max-updates 1000 [--max-time 10m --precision bf16 --update-freq 8 --device cuda]
    torchrun --nproc-per-node 8 -m convs2s train ...   # one rank per GPU (nccl)

Checkpoints, `best/` and `metrics.jsonl` land in `<storage_path>/<run_name>` as under Ray Train,
so the same command resumes an interrupted run, and a run started here resumes under Ray Train
(`convs2s.train.launch.fit`, the same job) and back. MLflow is used only when the job names a
tracking URI (or a run id); `num_workers`, `cpus_per_worker`, `use_gpu` and the placement
settings are Ray's and unused here.
"""

from __future__ import annotations

import contextlib
import os

from convs2s.console import worker_line as _say
from convs2s.io.checkpoint import (
    BEST_DIR,
    META_FILE,
    list_checkpoints,
)
from convs2s.config import TRAINING_PRECISIONS
from convs2s.tracking.redact import Hidden
from convs2s.train.data import preflight
from convs2s.train.job import TrainJob, TrainResult
from convs2s.train.runtime import LocalRuntime
from convs2s.train.faults import CrashInjection
from convs2s.train.resume import initial_weights
from convs2s.train.trainer import run_loop
from storage import location
from storage.checks import run_name_problem
from storage.lease import LeaseHeld, RunLease


def fit_local(job: TrainJob, device=None) -> TrainResult:
    """Train `job` in this process (one rank of a torchrun world when WORLD_SIZE is set);
    resumes from `<storage_path>/<run_name>`'s latest checkpoint when there is one."""
    run_dir = location(job.storage_path) / job.run_name
    runtime = LocalRuntime(run_dir, job.train.keep_last, device)
    files, valid_files = preflight(job, runtime.world_size)  # (on every rank alike)
    if runtime.rank == 0:
        _say(update_line(job, runtime.world_size))
    # One command per run folder (storage.lease): a second one on the same --run-name
    # resumed from the same checkpoint, and each one's keep_last deleted the other's.
    with _run_lease(run_dir, runtime, job) as lease:
        if lease is not None:  # (rank 0's): checked before each checkpoint it writes
            job = job.replace(lease=lease.ref())
        result = _fit(job, files, valid_files, run_dir, runtime)
    # The process group it started (torchrun): its resources, and no exit warning. Only after
    # success: destroying it is a collective shutdown, and a rank that failed alone would wait
    # there for peers that wait for it, instead of exiting so that torchrun stops them.
    runtime.close()
    return result


def update_line(job: TrainJob, world: int) -> str:
    """The console's line of the update this run trains: ranks x micro-batches x the batches'
    token budget (their manifest's max_tokens) = tokens an update, so that a run on fewer GPUs
    than its recipe's says what it trains (the paper's En-Fr update is 8 x 3,000 tokens:
    `--update-freq 8` on one GPU keeps it; a workflow plans it from its preset)."""
    from convs2s.train.data import read_manifest

    freq, budget = job.train.update_freq, read_manifest(job.train_data).get("max_tokens")
    size = f"{world} rank(s) x {freq} micro-batch(es)"
    if budget:
        size += f" x {budget:,} tokens = {world * freq * budget:,} tokens an update (at most)"
    return f"[convs2s.train] update: {size}"


def _run_lease(run_dir, runtime: LocalRuntime, job: TrainJob):
    """Rank 0's lease of the run folder (a context), the refusal raised on every rank alike
    (the others would wait at their first collective for a rank 0 that stopped)."""
    lease, refusal = None, None
    if runtime.rank == 0:
        try:
            # (outer: --storage-path may be a workflow's run folder, training in <it>/train)
            lease = RunLease(run_dir, command=f"convs2s train ({job.run_name})",
                             outer=job.storage_path).acquire()
        except LeaseHeld as err:
            refusal = str(err)
        except Exception as err:  # noqa: BLE001 - a storage error: every rank stops with it
            if runtime.world_size == 1:
                raise
            refusal = f"{run_dir}: the run folder's lease could not be taken: {err}"
    refusal = runtime.comm.broadcast_object(refusal)
    if refusal is not None:
        raise LeaseHeld(refusal)
    return lease if lease is not None else contextlib.nullcontext()


def _fit(job: TrainJob, files, valid_files, run_dir, runtime: LocalRuntime) -> TrainResult:
    # MLflow only when the job names a tracking URI or a run (rank 0 opens it, as on Ray)
    tracked = bool(job.tracking_uri or job.run_id) and runtime.rank == 0
    if tracked:
        from convs2s.train.tracked import open_train_run

        uri, run_id = open_train_run(job, run_dir, files,
                                     {"launcher": "local", "world_size": runtime.world_size},
                                     tags={"convs2s.launcher": "local"})
    else:
        uri, run_id = None, None
        if job.init_from:  # a checkpoint that does not fit fails here, before the loop
            initial_weights(job)
    # rank 0's logger needs the run; the others get it too
    uri, run_id = runtime.comm.broadcast_object((uri, run_id))
    config = {"job": job, "run_dir": str(run_dir), "tracking_uri": Hidden(uri),
              "run_id": run_id,
              "train_files": files, "valid_files": valid_files,
              "crash": CrashInjection.from_env()}
    try:
        final = run_loop(config, runtime)
    except BaseException as err:
        if tracked:
            from convs2s.train.tracked import fail_train_run

            fail_train_run(uri, run_id, err)
        raise
    if tracked:
        from convs2s.train.tracked import close_train_run

        close_train_run(uri, run_id, final, run_dir)
    has_best = (run_dir / BEST_DIR / META_FILE).is_file()
    # (rank 0 wrote them; another node's rank may have no such folder: the run's own result
    # is rank 0's, and a listing there failed a multi-node torchrun after training succeeded)
    kept = [i.path for i in list_checkpoints(run_dir)] \
        if runtime.rank == 0 or run_dir.is_dir() else []
    return TrainResult(run_id=run_id, run_dir=str(run_dir),
                       best_checkpoint=str(run_dir / BEST_DIR) if has_best else None,
                       last_checkpoint=kept[-1] if kept else None, checkpoints=kept,
                       metrics=final)


# --- python -m convs2s train ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """python -m convs2s train: one process (or torchrun rank), no Ray, MLflow only if asked."""
    import argparse
    import sys

    import dataclasses

    from convs2s.config import PRESETS, ModelConfig, TrainConfig, duration, unused_setting
    from storage.signals import sigterm_as_ctrl_c
    from convs2s.io.checkpoint import CheckpointError

    p = argparse.ArgumentParser(
        prog="python -m convs2s train",
        description="Train on preprocessed batches in this process (or each torchrun rank), "
                    "without Ray; rerun the same command to resume.")
    p.add_argument("--train-data", required=True, help="the batches/train folder of a "
                   "preprocessing output (local or a bucket URI)")
    p.add_argument("--valid-data", required=True, help="its batches/valid folder")
    p.add_argument("--spm-model", required=True, help="its joint sentencepiece model")
    p.add_argument("--model", default="small", choices=sorted(PRESETS),
                   help="model preset (convs2s.config.PRESETS; default: small)")
    p.add_argument("--storage-path", required=True, help="the run lives in "
                   "<storage-path>/<run-name>: checkpoints, best/, metrics.jsonl")
    p.add_argument("--run-name", required=True)
    p.add_argument("--max-updates", type=int)
    p.add_argument("--max-epochs", type=int)
    p.add_argument("--max-time", type=duration, metavar="DURATION",
                   help="training budget: seconds, or 90s / 10m / 1.5h")
    p.add_argument("--precision", choices=TRAINING_PRECISIONS)
    p.add_argument("--update-freq", type=int, help="micro-batches accumulated per update")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any TrainConfig field, e.g. --set lr=0.5 --set keep_last=3 (or "
                        "train.lr=0.5), or a field of --model's preset: --set model.dropout=0.3")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: this rank's GPU, else CPU)")
    p.add_argument("--tracking-uri", help="log to this MLflow store too (default: no MLflow)")
    p.add_argument("--experiment", default="convs2s", help="MLflow experiment (with "
                   "--tracking-uri)")
    args = p.parse_args(argv)
    try:
        from storage.settings import Change, apply_changes, read_value

        sets, model_sets = [], []
        train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"--set {item!r}: give KEY=VALUE")
            section, dot, field = key.strip().rpartition(".")
            if not dot and field not in train_fields and field in {
                    f.name for f in dataclasses.fields(ModelConfig)}:
                raise ValueError(f"--set {item}: {field} is a model setting: --set "
                                 f"model.{field}={value}")
            if dot and section not in ("train", "model"):  # (as the workflows write them)
                raise ValueError(f"--set {item}: this command's --set changes the training "
                                 "(train.FIELD, or FIELD) and --model's preset (model.FIELD); "
                                 "the data is the preprocessed batches'")
            (model_sets if section == "model" else sets).append(
                Change(section or "train", field, read_value(value), item))
        flags = {"max_updates": args.max_updates, "max_epochs": args.max_epochs,
                 "max_time": args.max_time,
                 "precision": args.precision, "update_freq": args.update_freq}
        flags = {k: v for k, v in flags.items() if v is not None}
        # Each --set typed and checked as the workflows' are (an lr of "abc" is one line
        # here, not a failure in the loop); the flags before (a budget the --set may rely
        # on) and after them (they decide)
        recipe = apply_changes(TrainConfig().replace(**flags), sets, "train", {})
        recipe = recipe.replace(**flags)
        for change in sets:  # (a setting the run's optimizer or schedule never reads)
            if why := unused_setting(recipe, change.field):
                raise ValueError(f"--set {change.text}: {why}")
            if change.field == "dropout_by_passes" and recipe.dropout_by_passes \
                    and not recipe.max_time:
                raise ValueError(f"--set {change.text}: the dropout table chooses by the passes "
                                 "a time budget will reach: add --max-time (e.g. 60m)")
        model = apply_changes(PRESETS[args.model](), model_sets, "model", {})
        import sentencepiece as spm

        spm_file = location(args.spm_model)
        if not spm_file.is_file():
            raise FileNotFoundError(f"--spm-model {args.spm_model} does not exist")
        try:
            vocab = spm.SentencePieceProcessor(
                model_proto=spm_file.read_bytes()).get_piece_size()
        except RuntimeError as err:
            raise ValueError(f"--spm-model {args.spm_model}: not a sentencepiece model "
                             f"({str(err).splitlines()[0][:200]}); give the spm.model of the "
                             "preprocessing output the batches come from") from None
        job = TrainJob(model=model, train=recipe, train_data=args.train_data,
                       valid_data=args.valid_data, spm_model=args.spm_model, vocab_size=vocab,
                       storage_path=args.storage_path, run_name=args.run_name,
                       tracking_uri=args.tracking_uri, experiment_name=args.experiment)
        # SIGTERM (torchrun stopping its ranks, a machine's shutdown) as Ctrl-C: the run
        # stops between operations, its MLflow run KILLED, and the same command resumes
        with sigterm_as_ctrl_c():
            result = fit_local(job, args.device)
    except (CheckpointError, LeaseHeld, OSError, ValueError, TypeError) as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) != 0:  # (rank 0 says it, once for the world)
            return 130
        run_dir = location(args.storage_path) / args.run_name
        try:
            kept = list_checkpoints(run_dir) \
                if not run_name_problem(args.run_name) and run_dir.is_dir() else []
        except (OSError, KeyboardInterrupt):  # (a bucket that does not answer, a second key)
            kept = None
        if kept is None:
            print(f"\ninterrupted: the same command resumes from the latest checkpoint under "
                  f"{run_dir}, if one was made", file=sys.stderr, flush=True)
            return 130
        print("\ninterrupted: " + (
            f"the checkpoints kept are under {run_dir}; the same command resumes from the "
            f"latest (update {kept[-1].update})" if kept else
            f"before the first checkpoint, nothing under {run_dir} to resume from; the same "
            "command starts the run again (--set checkpoint_interval=N checkpoints every N "
            "updates)"), file=sys.stderr, flush=True)
        return 130
    m = result.metrics
    from convs2s.train.job import STOP_REASONS

    if int(os.environ.get("RANK", "0")) == 0:  # one summary for a torchrun world
        print(f"train: {m['update']:,} updates, {m['epoch']} epochs, "
              f"{m['train_seconds']:.0f} s in {m['precision']}; stopped: "
              f"{STOP_REASONS.get(m['stop_reason'], m['stop_reason'])}; best: "
              f"{result.best_checkpoint}")
    return 0
