"""Typed configuration of a paper-task workflow, and its run-level command-line flags.

A workflow file declares its task as plain functions returning a `WorkflowConfig` (torchtune /
torchtitan style: the settings are read in the file, not assembled from flags):

    def paper() -> WorkflowConfig: ...      # the reproduction settings (GPU cluster)
    def smoke() -> WorkflowConfig: ...      # the embedded demo corpus, small model, CPU

The command line only carries run-level options (`RunOptions`: preset, data source, workers,
GPUs, epoch / update limits, storage, tracking, names); `apply_options` folds them into the
config and sets the source of its preprocessing config from `--data` (the demo source brings
its own settings: `preprocessing.config.with_demo_source`). `workflows.orchestrate` runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from convs2s.config import ModelConfig, SearchConfig, TrainConfig
from preprocessing.config import PreprocessConfig, with_demo_source


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
    preprocess: PreprocessConfig  # the task's data; `--data hub|demo|DIR` sets its source
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
    cpus_per_worker: float = 1.0  # CPUs (torch threads) per training worker
    # Test sets added by `--test-set STEM` (file stems of a local --data folder): each is its
    # own evaluation split, scored like `test_sets`.
    extra_test_sets: tuple[str, ...] = ()
    eval_cpus: float = 1.0  # per evaluation task
    eval_gpus: float = 0.25  # GPU fraction per evaluation task when use_gpu (4 share a GPU)
    # Seconds between samples of each training node's CPU / memory / GPU utilization in the
    # train run's MLflow metrics (system/<node>/...); 0 (--no-system-metrics): none.
    system_metrics_s: float = 10.0

    def __post_init__(self) -> None:
        demo = with_demo_source(self.preprocess, self.task)  # what `--data demo` runs on
        for split in self.test_sets:
            if split not in self.preprocess.eval_splits or split not in demo.eval_splits:
                raise ValueError(f"{self.name}: test split {split!r} is not an evaluation split "
                                 "of the preprocess config / the demo source")
        if "valid" not in self.preprocess.splits or "valid" not in demo.splits:
            raise ValueError(f"{self.name}: training validates on a 'valid' split; add one")

    @property
    def all_test_sets(self) -> dict[str, str]:
        """Evaluation split -> test set name: the preset's, then the --test-set ones."""
        return {**self.test_sets, **{stem: stem for stem in self.extra_test_sets}}

    def replace(self, **changes) -> "WorkflowConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"name": self.name, "task": self.task, "data": self.data,
                "preprocess": self.preprocess.to_dict(), "model": self.model.to_dict(),
                "train": self.train.to_dict(), "search": self.search.to_dict(),
                "ensemble": dataclasses.asdict(self.ensemble),
                "test_sets": self.all_test_sets,
                "num_workers": self.num_workers, "use_gpu": self.use_gpu,
                "cpus_per_worker": self.cpus_per_worker}


@dataclass
class RunOptions:
    """Run-level settings (the command-line flags); None keeps the preset's value."""

    preset: str = "smoke"
    data: str | None = None
    num_workers: int | None = None
    use_gpu: bool | None = None
    max_epochs: int | None = None
    max_updates: int | None = None
    max_time: float | None = None  # seconds of training
    test_set: list[str] = field(default_factory=list)  # extra test sets: file stems in --data
    attention: int = 0  # attention pictures of the first N sentences of each test set
    storage_path: str = "runs"
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    system_metrics: bool = True  # sample each training node's utilization into MLflow



def apply_options(cfg: WorkflowConfig, opts: RunOptions) -> tuple[WorkflowConfig,
                                                                  PreprocessConfig]:
    """The config with the run-level overrides, and its preprocessing config on the source
    `--data` names."""
    train_changes = {k: v for k, v in (("max_epochs", opts.max_epochs),
                                       ("max_updates", opts.max_updates),
                                       ("max_time", opts.max_time)) if v is not None}
    if "max_updates" in train_changes and "max_epochs" not in train_changes:
        train_changes["max_epochs"] = 0  # --max-updates alone: stop on the update count only
    cfg = cfg.replace(
        train=cfg.train.replace(**train_changes),
        num_workers=opts.num_workers or cfg.num_workers,
        use_gpu=cfg.use_gpu if opts.use_gpu is None else opts.use_gpu,
        system_metrics_s=cfg.system_metrics_s if opts.system_metrics else 0.0)
    data = opts.data or cfg.data
    root = str(Path(opts.storage_path).expanduser().resolve() / "preprocessed")
    if data == "demo":  # the demo's own languages and settings; test sets named demo_<split>
        pre = with_demo_source(cfg.preprocess, cfg.task)
        cfg = cfg.replace(test_sets={split: f"demo_{split}" for split in cfg.test_sets})
    elif data == "hub":
        pre = cfg.preprocess.replace(source="hub")
    else:  # a local folder: the task's file stems, absolute (Ray tasks read it elsewhere)
        pre = cfg.preprocess.replace(source=str(Path(data).expanduser().resolve()),
                                     splits=dict(cfg.local_splits))
    if opts.test_set:
        if data in ("hub", "demo"):
            raise ValueError("--test-set reads STEM.<src> / STEM.<tgt> from a local folder: "
                             "give it with --data DIR")
        extra = tuple(dict.fromkeys(stem for stem in opts.test_set
                                    if stem not in pre.splits.values()))
        bad = [stem for stem in extra if stem in pre.splits or not stem
               or any(c in stem for c in "/\\,")]
        if bad:
            raise ValueError(f"--test-set {bad[0]!r}: give a file stem in the --data folder "
                             "(STEM.<src> / STEM.<tgt>), not a path or a split name")
        pre = pre.replace(splits={**pre.splits, **{stem: stem for stem in extra}})
        cfg = cfg.replace(extra_test_sets=extra)
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
    p.add_argument("--max-time", type=duration, metavar="DURATION",
                   help="training wall-clock budget: seconds, or with a unit (90s, 60m, 1.5h); "
                        "training stops after the update that spends it, validates, "
                        "checkpoints, and the workflow evaluates; a resumed run counts the "
                        "time already spent")
    p.add_argument("--test-set", action="append", default=[], metavar="STEM",
                   help="also score STEM.<src> / STEM.<tgt> (optionally .gz) of the --data "
                        "folder like the preset's test sets (repeatable)")
    p.add_argument("--attention", type=int, default=0, metavar="N",
                   help="also draw each decoder layer's attention for the first N sentences of "
                        "every test set (PNGs in the evaluation runs' artifacts)")
    p.add_argument("--storage-path", default="runs",
                   help="preprocessing output and training runs; on a cluster a path every node "
                        "shares (default: ./runs)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, "
                                          "else sqlite:///mlflow.db in the working directory)")
    p.add_argument("--experiment", help="MLflow experiment (default: the task name)")
    p.add_argument("--run-name", help="name of this workflow run; the same name resumes it "
                                      "(default: <preset>-<date>-<time>)")
    p.add_argument("--system-metrics", action=argparse.BooleanOptionalAction, default=True,
                   help="log each training node's CPU, memory and GPU utilization to the "
                        "train run in MLflow (system/<node>/...; default: on)")
    a = p.parse_args(argv)
    for flag in ("num_workers", "max_epochs", "max_updates"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(a, flag)}: give a positive integer")
    if a.attention < 0:
        p.error(f"--attention {a.attention}: give a number of sentences (0: none)")
    from convs2s.tracking import tracking_uri_problem

    if problem := tracking_uri_problem(a.tracking_uri):
        p.error(problem)
    if a.test_set:
        data = a.data or presets[a.preset]().data
        if data in ("hub", "demo"):
            p.error(f"--test-set reads STEM.<src> / STEM.<tgt> from a local folder, but the "
                    f"data is {data!r}: add --data DIR")
        for stem in a.test_set:
            if not stem or any(c in stem for c in "/\\,") or stem in ("train", "valid"):
                p.error(f"--test-set {stem!r}: give a file stem of the --data folder "
                        "(STEM.<src> / STEM.<tgt>), not a path or a split name")
    return RunOptions(**vars(a))


def duration(text: str) -> float:
    """'3600' or '3600s', '60m', '1.5h' -> seconds (argparse type of --max-time)."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    scale = units.get(t[-1:], None)
    try:
        value = float(t[:-1] if scale else t) * (scale or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give seconds or a "
                                         "number with s, m or h (e.g. 3600, 60m, 1.5h)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the time budget must be positive")
    return value
