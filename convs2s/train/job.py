"""A training job and its result (no torch, no Ray: cheap to import).

`TrainJob` says what to train (a `ModelConfig` with a `TrainConfig` recipe, convs2s.config) on what
data, where (storage, workers) and how it is tracked; `TrainResult` is what
`convs2s.train.launch.fit(job)` returns; `STOP_REASONS` names why training stopped. A workflow
builds them in Python:

    from convs2s.config import PRESETS, TrainConfig
    from convs2s.train.job import TrainJob
    job = TrainJob(model=PRESETS["tiny"](), train=TrainConfig(max_epochs=5),
                   train_data=out.batches["train"], valid_data=out.batches["valid"],
                   spm_model=out.spm_model, vocab_size=out.vocab_size,
                   storage_path="/abs/runs", run_name="demo", num_workers=2)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from convs2s.config import ModelConfig, TrainConfig

# Why a training run stopped: TrainResult.metrics["stop_reason"], the train run's MLflow tag
# `convs2s.stop_reason`, and the words the logs use for it.
STOP_REASONS = {"max_updates": "update limit reached", "max_time": "time budget spent",
                "max_epochs": "epoch limit reached", "min_lr": "lr fell below min_lr"}

@dataclass(frozen=True)
class TrainJob:
    """One training run: model, recipe, data, where to store it, how many workers, tracking."""

    model: ModelConfig
    train: TrainConfig
    train_data: str  # batches/train dir of the preprocessing output (absolute or relative)
    valid_data: str  # batches/valid dir
    spm_model: str  # sentencepiece model, copied into every checkpoint ("" if none)
    vocab_size: int  # joint BPE vocabulary: source and target size (source with tgt_vocab_size)
    storage_path: str  # Ray Train storage (shared for multi-node); the run lives in <it>/<name>
    run_name: str  # same name + storage_path = resume (Ray Train and the MLflow run)
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    max_failures: int = 3  # worker-group restarts from the latest checkpoint
    # None: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db. Not in the job's repr (a
    # server's password may be in it; Ray Train can record a run's config by its repr).
    tracking_uri: str | None = field(default=None, repr=False)
    experiment_name: str = "convs2s"
    parent_run_id: str | None = None  # make the training run a child of a workflow's run
    # The MLflow run to train into, made by the caller (a workflow's run tree); None: `fit`
    # finds or creates it from tracking_uri, experiment_name and parent_run_id (keyed by the
    # run folder, as every run of the project).
    run_id: str | None = None
    data_manifest: dict = field(default_factory=dict)  # counts etc., flattened into params
    datasets: tuple = ()  # convs2s.tracking.runs.DatasetRecord: MLflow dataset inputs of the run
    tags: dict = field(default_factory=dict)  # extra MLflow run tags
    # Seconds between samples of each node's CPU / memory / GPU utilization, logged to the
    # training run as system/<node>/... (convs2s.tracking.system_metrics); 0: no sampling.
    system_metrics_s: float = 10.0
    # Fine-tuning: start from this checkpoint directory's weights (trained here or imported
    # with `python -m convs2s import-fairseq`) instead of random ones; `model` must be its
    # architecture (the dropout may differ) and the data encoded with its vocabulary.
    init_from: str | None = None
    tgt_vocab_size: int = 0  # the target vocabulary of a model with one per language (0: joint)
    # The files of a fixed vocabulary (a checkpoint's text pipeline), copied into every
    # checkpoint so that it translates, scores and serves on its own.
    text_files: tuple[str, ...] = ()
    # With use_gpu: every worker on nodes with this GPU model (ScalingConfig.accelerator_type,
    # e.g. "A100"), so a data-parallel group never mixes models; None: any GPU.
    accelerator_type: str | None = None
    # How long Ray Train may try to place the workers again after a loss (a dead node whose
    # replacement the autoscaler has not brought yet) before the run stops, resumable; None
    # tries without end. In tries of RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s).
    placement_wait_s: float | None = 900.0
    # The run folder's lease (storage.lease.LeaseRef) held by the command that started the
    # run (a workflow, `python -m convs2s train`): rank 0 checks it is still that command's as
    # it starts and before each checkpoint it writes, and stops (LeaseLost) where another
    # command took the run over. None: no check (a caller that holds no lease).
    lease: object = None

    def replace(self, **changes) -> TrainJob:
        return dataclasses.replace(self, **changes)


class RunRefused(ValueError):
    """A training run refused before it starts, for its name, its data or its folder: the
    message is the one line to print, naming what and the fix (a workflow's `error:` line,
    exit 2)."""


class Diverged(ValueError):
    """Training stopped because its numbers are no longer numbers: a gradient norm or the
    validation loss was NaN or infinite (the reference stops on the same). Nothing after the
    last checkpoint was saved; the message says where and what to change."""


class WorkersNotPlaced(RuntimeError):
    """Ray Train could not place the run's workers within `TrainJob.placement_wait_s` (a lost
    node not replaced, a cluster too small); the run stopped at its latest checkpoint and the
    same job resumes from there."""


@dataclass
class TrainResult:
    """What `fit` returns; checkpoint paths are directories holding checkpoint.pt."""

    run_id: str | None  # MLflow run (None when the tracking server was unreachable)
    run_dir: str  # <storage_path>/<run_name>: Ray Train state, checkpoints, metrics.jsonl
    best_checkpoint: str | None  # <run_dir>/best: lowest validation loss so far
    last_checkpoint: str | None  # the latest reported checkpoint
    checkpoints: list[str]  # kept checkpoints (the last keep_last), oldest first
    metrics: dict  # final metrics of rank 0 (train/valid loss, ppl, lr, update, epoch, ...)
