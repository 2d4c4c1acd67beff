"""Typed configuration of a paper-task workflow, and its run-level command-line flags.

A workflow file declares its task as plain functions returning a `WorkflowConfig` (torchtune /
torchtitan style: the settings are read in the file, not assembled from flags):

    def paper() -> WorkflowConfig: ...      # the reproduction settings (GPU cluster)
    def smoke() -> WorkflowConfig: ...      # the embedded demo corpus, small model, CPU

The command line only carries run-level options (`RunOptions`: preset, data source, workers,
GPUs, epoch / update limits, storage, tracking, names); `apply_options` folds them into the
config and picks the preprocessing config that `--data` names. `workflows.orchestrate` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from convs2s.config import ModelConfig
from convs2s.train_config import TrainConfig
from convs2s.translate import SearchConfig
from preprocessing.config import PreprocessConfig


@dataclass(frozen=True)
class EnsembleConfig:
    """What is evaluated besides each run's best checkpoint (paper §5.2 Table 1 ensembles)."""

    runs: int = 1  # independent training runs (seeds seed, seed+1, ...); >1 adds their ensemble
    average_last: int = 0  # also score the weight average of each run's last N checkpoints

    def __post_init__(self) -> None:
        if self.runs < 1 or self.average_last < 0:
            raise ValueError("EnsembleConfig: runs >= 1 and average_last >= 0")


@dataclass(frozen=True)
class WorkflowConfig:
    """One paper task, end to end: data, model, optimization, evaluation."""

    name: str  # the task; default MLflow experiment
    preprocess: PreprocessConfig  # real data: `--data hub` or `--data DIR` change its source
    demo: PreprocessConfig  # the embedded corpus, used for `--data demo`
    data: str  # default --data: "hub" | "demo" | a folder
    model: ModelConfig
    train: TrainConfig
    test_sets: dict[str, str]  # eval split -> test set name (e.g. {"test": "newstest2014"})
    local_splits: dict[str, str]  # split -> file stem in a `--data DIR` folder
    task: Literal["translation", "summarization"] = "translation"
    search: SearchConfig = field(default_factory=SearchConfig)
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    num_workers: int = 1  # Ray Train workers (one GPU each with use_gpu)
    use_gpu: bool = False
    eval_cpus: float = 1.0  # per evaluation task
    eval_gpus: float = 0.25  # GPU fraction per evaluation task when use_gpu (4 share a GPU)

    def __post_init__(self) -> None:
        for split in self.test_sets:
            if split not in self.preprocess.eval_splits or split not in self.demo.eval_splits:
                raise ValueError(f"{self.name}: test split {split!r} is not an evaluation split "
                                 "of the preprocess / demo configs")
        if "valid" not in self.preprocess.splits or "valid" not in self.demo.splits:
            raise ValueError(f"{self.name}: training validates on a 'valid' split; add one")

    def replace(self, **changes) -> "WorkflowConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"name": self.name, "task": self.task, "data": self.data,
                "preprocess": self.preprocess.to_dict(), "model": self.model.to_dict(),
                "train": self.train.to_dict(), "search": self.search.to_dict(),
                "ensemble": dataclasses.asdict(self.ensemble), "test_sets": self.test_sets,
                "num_workers": self.num_workers, "use_gpu": self.use_gpu}


@dataclass
class RunOptions:
    """Run-level settings (the command-line flags); None keeps the preset's value."""

    preset: str = "smoke"
    data: str | None = None
    num_workers: int | None = None
    use_gpu: bool | None = None
    max_epochs: int | None = None
    max_updates: int | None = None
    storage_path: str = "runs"
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None



def apply_options(cfg: WorkflowConfig, opts: RunOptions) -> tuple[WorkflowConfig,
                                                                  PreprocessConfig]:
    """The config with the run-level overrides, and the preprocessing config `--data` picks."""
    train_changes = {k: v for k, v in (("max_epochs", opts.max_epochs),
                                       ("max_updates", opts.max_updates)) if v is not None}
    if "max_updates" in train_changes and "max_epochs" not in train_changes:
        train_changes["max_epochs"] = 0  # --max-updates alone: stop on the update count only
    cfg = cfg.replace(
        train=cfg.train.replace(**train_changes),
        num_workers=opts.num_workers or cfg.num_workers,
        use_gpu=cfg.use_gpu if opts.use_gpu is None else opts.use_gpu)
    data = opts.data or cfg.data
    root = str(Path(opts.storage_path).expanduser().resolve() / "preprocessed")
    if data == "demo":
        pre = cfg.demo
    elif data == "hub":
        pre = cfg.preprocess.replace(source="hub")
    else:  # a local folder: the task's file stems, absolute (Ray tasks read it elsewhere)
        pre = cfg.preprocess.replace(source=str(Path(data).expanduser().resolve()),
                                     splits=dict(cfg.local_splits))
    return cfg, pre.replace(root=root)


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None, presets: dict[str, Callable[[], WorkflowConfig]],
               doc: str | None) -> RunOptions:
    name = Path(sys.argv[0]).name if argv is None else "workflow"
    lines = (doc or "").strip().splitlines()
    p = argparse.ArgumentParser(prog=f"python workflows/{name}", description=lines[0] if lines
                                else None, epilog="\n".join(lines[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(presets), default="smoke",
                   help="paper: the reproduction settings (GPU cluster); smoke: the embedded demo "
                        "corpus, a small model, CPU, minutes (default)")
    p.add_argument("--data", help="hub (Hugging Face), demo (embedded corpus) or a local folder "
                                  "(default: the preset's: paper=hub, smoke=demo)")
    p.add_argument("--num-workers", type=int, help="Ray Train workers (default: the preset's)")
    p.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=None,
                   help="one GPU per training worker (default: the preset's)")
    p.add_argument("--max-epochs", type=int, help="stop after this many epochs")
    p.add_argument("--max-updates", type=int, help="stop after this many updates (quick checks)")
    p.add_argument("--storage-path", default="runs",
                   help="preprocessing output and training runs; on a cluster a path every node "
                        "shares (default: ./runs)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, "
                                          "else sqlite:///mlflow.db in the working directory)")
    p.add_argument("--experiment", help="MLflow experiment (default: the task name)")
    p.add_argument("--run-name", help="name of this workflow run; the same name resumes it "
                                      "(default: <preset>-<date>-<time>)")
    a = p.parse_args(argv)
    for flag in ("num_workers", "max_epochs", "max_updates"):
        if getattr(a, flag) is not None and getattr(a, flag) < (1 if flag == "num_workers"
                                                                else 0):
            p.error(f"--{flag.replace('_', '-')} must be positive")
    return RunOptions(**vars(a))
