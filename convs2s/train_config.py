"""Typed configuration of a training job and its result (no torch, no Ray: cheap to import).

`TrainConfig` holds the optimization recipe (paper §4 / reference-facts §4); `TrainJob` says
what to train on where (model, data, storage, workers, tracking); `TrainResult` is what
`convs2s.train.fit(job)` returns. A workflow builds them in Python:

    from convs2s.config import PRESETS
    from convs2s.train_config import TrainConfig, TrainJob
    job = TrainJob(model=PRESETS["tiny"], train=TrainConfig(max_epochs=5),
                   train_data=out.batches["train"], valid_data=out.batches["valid"],
                   spm_model=out.spm_model, vocab_size=out.vocab_size,
                   storage_path="/abs/runs", run_name="demo", num_workers=2)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from convs2s.config import ModelConfig

# Why a training run stopped: TrainResult.metrics["stop_reason"], the train run's MLflow tag
# `convs2s.stop_reason`, and the words the logs use for it.
STOP_REASONS = {"max_updates": "update limit reached", "max_time": "time budget spent",
                "max_epochs": "epoch limit reached", "min_lr": "lr fell below min_lr"}


@dataclass(frozen=True)
class TrainConfig:
    """Optimization recipe. Defaults are the paper's (§4): NAG 0.99, lr 0.25, clip 0.1."""

    # "nag": Nesterov accelerated gradient (paper §4); "adam": AdamW (decoupled weight decay).
    optimizer: Literal["nag", "adam"] = "nag"
    lr: float = 0.25
    momentum: float = 0.99  # Nesterov accelerated gradient (paper §4)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    clip_norm: float = 0.1  # gradient renormalization threshold (paper §4); 0 disables
    # "plateau": paper §4, lr /= 10 after each epoch whose valid perplexity did not improve.
    # "fixed": reference recipe, lr fixed, then x lr_shrink per epoch from anneal_from_epoch.
    # "cosine" / "linear": from lr down to 0 over the run's budget (the fraction spent of
    # max_time, max_updates or max_epochs, whichever is furthest): a budgeted run ends annealed.
    lr_schedule: Literal["plateau", "fixed", "cosine", "linear"] = "plateau"
    lr_shrink: float = 0.1
    anneal_from_epoch: int | None = None  # "fixed" only: first (1-based) epoch with a shrunk lr
    min_lr: float = 1e-4  # stop once the lr falls below this (paper §4)
    warmup_updates: int = 0  # linear warmup from warmup_init_lr to lr over this many updates
    warmup_init_lr: float = 0.0
    label_smoothing: float = 0.0  # the paper uses none; the reference's WMT recipes use 0.1
    max_epochs: int = 100  # 0 = no epoch limit
    max_updates: int = 0  # 0 = no update limit
    # Wall-clock budget in seconds (0 = none), like the reference's --stop-time-hours: training
    # stops after the first update that ends past it, validates and checkpoints. The clock counts
    # the training loop (validation and checkpoints included, not Ray's start-up) and carries
    # over a resume: a resumed run has the budget left at its latest checkpoint.
    max_time: float = 0.0
    update_freq: int = 1  # gradient accumulation: micro-batches per update and per rank
    checkpoint_interval: int = 0  # also checkpoint every N updates (0: only at epoch ends)
    keep_last: int = 3  # checkpoints kept besides best/ (Ray's CheckpointConfig.num_to_keep)
    log_interval: int = 50  # updates between train metric logs (the only host syncs)
    shuffle_buffer: int = 256  # batch rows in the per-worker shuffle buffer (reshuffled per epoch)
    seed: int = 1
    bf16: bool = True  # bf16 autocast, CUDA only (float32 on CPU: bf16 is very slow there)
    # Fault injection for tests: rank `crash_rank` calls os._exit(1) at update `crash_at_update`
    # once per run (a marker file in the run directory stops the retry from dying again).
    crash_at_update: int = 0
    crash_rank: int = 1

    def __post_init__(self) -> None:
        if self.lr_schedule not in ("plateau", "fixed", "cosine", "linear"):
            raise ValueError("lr_schedule must be 'plateau', 'fixed', 'cosine' or 'linear', "
                             f"got {self.lr_schedule!r}")
        if self.lr_schedule == "fixed" and self.anneal_from_epoch is not None \
                and self.anneal_from_epoch < 1:
            raise ValueError("anneal_from_epoch is 1-based: give an epoch >= 1 or None")
        if self.optimizer not in ("nag", "adam"):
            raise ValueError(f"optimizer must be 'nag' or 'adam', got {self.optimizer!r}")
        object.__setattr__(self, "adam_betas", tuple(self.adam_betas))  # from JSON: a list
        if self.update_freq < 1:
            raise ValueError(f"update_freq must be >= 1, got {self.update_freq}")
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {self.keep_last}")
        if self.log_interval < 1:
            raise ValueError(f"log_interval must be >= 1, got {self.log_interval}")
        if self.max_time < 0:
            raise ValueError(f"max_time is in seconds and must be >= 0, got {self.max_time}")
        if self.max_epochs <= 0 and self.max_updates <= 0 and self.max_time <= 0:
            raise ValueError("give max_epochs, max_updates or max_time (all 0 would train "
                             "forever)")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {sorted(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class TrainJob:
    """One training run: model, recipe, data, where to store it, how many workers, tracking."""

    model: ModelConfig
    train: TrainConfig
    train_data: str  # batches/train dir of the preprocessing output (absolute or relative)
    valid_data: str  # batches/valid dir
    spm_model: str  # sentencepiece model, copied into every checkpoint
    vocab_size: int  # joint BPE vocabulary: source and target size
    storage_path: str  # Ray Train storage (shared for multi-node); the run lives in <it>/<name>
    run_name: str  # same name + storage_path = resume (Ray Train and the MLflow run)
    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    # CPUs each Ray Data read task reserves. 0 by default: reading batch rows is light, and the
    # workers may hold every CPU of the cluster (the 2-CPU test cluster), which would starve
    # the reads and hang training.
    read_cpus: float = 0.0
    max_failures: int = 3  # worker-group restarts from the latest checkpoint
    tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    experiment_name: str = "convs2s"
    parent_run_id: str | None = None  # make the training run a child of a workflow's run
    data_manifest: dict = field(default_factory=dict)  # counts etc., flattened into params
    datasets: tuple = ()  # convs2s.tracking.DatasetRecord: MLflow dataset inputs of the run
    tags: dict = field(default_factory=dict)  # extra MLflow run tags

    def replace(self, **changes) -> TrainJob:
        return dataclasses.replace(self, **changes)


@dataclass
class TrainResult:
    """What `fit` returns; checkpoint paths are directories holding checkpoint.pt."""

    run_id: str | None  # MLflow run (None when the tracking server was unreachable)
    run_dir: str  # <storage_path>/<run_name>: Ray Train state, checkpoints, metrics.jsonl
    best_checkpoint: str | None  # <run_dir>/best: lowest validation loss so far
    last_checkpoint: str | None  # the latest reported checkpoint
    checkpoints: list[str]  # kept checkpoints (the last keep_last), oldest first
    metrics: dict  # final metrics of rank 0 (train/valid loss, ppl, lr, update, epoch, ...)
