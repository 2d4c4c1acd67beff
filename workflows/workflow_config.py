"""Typed configuration of a paper-task workflow, and its run-level command-line flags.

A workflow file declares its task as plain functions returning a `WorkflowConfig` (torchtune /
torchtitan style: the settings are read in the file, not assembled from flags):

    def paper() -> WorkflowConfig: ...      # the reproduction settings (GPU cluster)
    def smoke() -> WorkflowConfig: ...      # the embedded demo corpus, small model, CPU

The command line only carries run-level options (`RunOptions`: preset, data source, workers,
GPUs, epoch / update limits, storage, tracking, names); `workflows.run_spec.resolve` folds them
into the preset once, giving the `RunSpec` that `workflows.orchestrate` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from convs2s.config import (
    TRAINING_PRECISIONS,
    ModelConfig,
    SearchConfig,
    TrainConfig,
    duration,
)
from preprocessing.config import PreprocessConfig


@dataclass(frozen=True)
class EnsembleConfig:
    """What is evaluated besides each run's best checkpoint (paper §5.2, Table 2 ensembles)."""

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
    task_kind: str = "translation"  # how outputs are scored (convs2s.metrics.task_kinds)
    search: SearchConfig = field(default_factory=SearchConfig)
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    num_workers: int = 1  # Ray Train workers (one GPU each with use_gpu)
    use_gpu: bool = False
    cpus_per_worker: float = 1.0  # CPUs (torch threads) per training worker
    # The tokens of one update the recipe states (GPUs x tokens per GPU): every run
    # keeps it whatever --num-workers, with micro-batches per update = update_tokens / (workers
    # x preprocess.max_tokens) (workflows.run_spec.update_plan); 0: one micro-batch a worker.
    update_tokens: int = 0
    # For a recipe whose batches are a number of sentences (Gigaword, §5.7: "batch size 128" on
    # one GPU, its token budget set so high that it does not bind; En-Ro, §4.2's 64, where the
    # token budget still cuts batches of long sentences smaller, so 64 is an upper bound): the
    # sentences of one update, kept as update_tokens is, over preprocess.max_sentences. At most
    # one of the two is set.
    update_sentences: int = 0
    # The batch budget (preprocess.max_tokens) for a run that trains in float32 on CPUs, what
    # `--precision auto` picks on a CPU without native bf16: an hour passes the data a third as
    # often there, and smaller batches (twice the updates) scored higher on val
    # (docs/benchmarks.md, Multi30k). 0: the preprocess's budget everywhere. `--set
    # data.max_tokens` overrides it. Decided on the driver's CPU, before the batches are cut.
    float32_cpu_max_tokens: int = 0
    # CPUs (torch threads) per evaluation task, at least: on an idle cluster, fewer tasks than
    # CPUs share them out (workflows.evaluation.share_cpus)
    eval_cpus: float = 1.0
    eval_gpus: float = 0.25  # GPU fraction per evaluation task when use_gpu (4 share a GPU)
    # Seconds between samples of each training node's CPU / memory / GPU utilization in the
    # train run's MLflow metrics (system/<node>/...); 0 (--no-system-metrics): none.
    system_metrics_s: float = 10.0

    def __post_init__(self) -> None:
        # The task as a run names it (a generic workflow's name takes the languages)
        task = self.name.replace("{src}", self.preprocess.src_lang).replace(
            "{tgt}", self.preprocess.tgt_lang)
        for split in self.test_sets:
            if split == "train":
                raise ValueError(f"{task}: the train split is no test set (test_sets)")
        # (first: the valid split is also scored, to choose the champion on, engine.champion_sets)
        # (workflow.local_splits: checked where --data names a folder, run_spec.resolve)
        if problem := self.split_problem("data.splits", self.preprocess.splits):
            raise ValueError(problem)
        # Refused here, before anything runs: a typo in task_kind failed only in evaluation,
        # after the whole training run; num_workers=0 divided by zero.
        from convs2s.metrics.task_kinds import task_kind

        task_kind(self.task_kind)  # (a ValueError naming the kinds)
        if self.num_workers < 1 or self.cpus_per_worker <= 0 or self.eval_cpus <= 0:
            raise ValueError(f"{task}: num_workers >= 1, cpus_per_worker > 0 and "
                             f"eval_cpus > 0, got {self.num_workers}, {self.cpus_per_worker}, "
                             f"{self.eval_cpus}")
        if self.search.nbest != 1:  # (evaluation scores, and a logged model serves, one)
            raise ValueError(f"{task}: search.nbest {self.search.nbest}: a workflow scores one "
                             "translation a sentence; n-best lists are `python -m convs2s "
                             "translate --nbest N`'s")
        if self.ensemble.average_last > self.train.keep_last:  # (it averaged the kept ones
            # and was logged as avg_last<average_last>)
            raise ValueError(f"{task}: ensemble.average_last {self.ensemble.average_last} "
                             "averages more checkpoints than the run keeps (train.keep_last "
                             f"{self.train.keep_last}): raise train.keep_last to "
                             f"{self.ensemble.average_last}, or lower ensemble.average_last")
        if self.update_tokens and self.update_sentences:
            raise ValueError(f"{task}: an update is stated in tokens (update_tokens) or "
                             "in sentences (update_sentences), not both: set the other to 0 "
                             "(--set workflow.update_tokens=0)")
        if self.update_sentences and not self.preprocess.max_sentences:
            raise ValueError(f"{task}: an update of {self.update_sentences} sentences "
                             "(workflow.update_sentences) needs batches cut by sentences "
                             "(data.max_sentences), or --set workflow.update_sentences=0 for "
                             "an update of tokens")
        if not 0 <= self.eval_gpus <= 1 or self.update_tokens < 0 or self.update_sentences < 0 \
                or self.float32_cpu_max_tokens < 0 or self.system_metrics_s < 0:
            raise ValueError(f"{task}: eval_gpus in [0, 1] (a GPU fraction), and "
                             "update_tokens, update_sentences, float32_cpu_max_tokens, "
                             "system_metrics_s >= 0")

    def split_problem(self, key: str, splits: dict[str, str]) -> str | None:
        """Why `splits` (setting `key`) cannot serve the run, or None: it lacks a split the
        run validates on or scores."""
        task = self.name.replace("{src}", self.preprocess.src_lang).replace(
            "{tgt}", self.preprocess.tgt_lang)
        for split in ("valid", *self.test_sets):
            if split not in splits:
                why = "training validates on" if split == "valid" else "the run scores"
                return (f"{task}: {key} has no {split!r} split, which {why}: keep the name and "
                        f"map it to the data's, e.g. {key}="
                        f"{_renamed(splits, split, self.test_sets)}")
        return None

    def replace(self, **changes) -> "WorkflowConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain data (a `--config` file's content): every section as its settings' dict."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d.update(preprocess=_plain(self.preprocess.to_dict()), model=self.model.to_dict(),
                 train=_plain(self.train.to_dict()), search=_plain(self.search.to_dict()),
                 ensemble=dataclasses.asdict(self.ensemble))
        return _plain(d)

    @classmethod
    def from_dict(cls, d: dict) -> "WorkflowConfig":
        """A `to_dict` document back (a `--config` file); a ValueError names the first key
        that no setting has (with the closest names), or a value of another type than its
        setting's, checked as `--set` checks one (storage.settings.check_fields: an lr
        of "abc", or a warmup_updates of "200", is refused here, not in a training worker)."""
        from storage.settings import check_fields

        sections = {"preprocess": PreprocessConfig, "model": ModelConfig, "train": TrainConfig,
                    "search": SearchConfig, "ensemble": EnsembleConfig}
        # (--set's section names are not the file's: data.* settings are under preprocess:,
        # the workflow.* ones at the top level)
        if isinstance(d.get("data"), dict):
            raise ValueError("data: is the data source (--data: hub, demo or a folder); the "
                             "data settings (--set data.*) go under preprocess:")
        if isinstance(d.get("workflow"), dict):
            raise ValueError("workflow: the workflow settings (--set workflow.*) sit at the "
                             "top level of the file, not under workflow:")
        d = check_fields(cls, d)
        for name in ("preprocess", "model", "train"):
            if name not in d:
                raise ValueError(f"{name}: missing (a mapping of its settings)")
        made = {}
        for name, cls_ in sections.items():
            part = d.pop(name, None) or {}
            if not isinstance(part, dict):
                raise ValueError(f"{name}: give a mapping of its settings, not {part!r}")
            if cls_ is TrainConfig:  # a file written before a field was removed still loads
                part = TrainConfig.upgrade(part)
            try:
                made[name] = cls_(**check_fields(cls_, part, f"{name}."))
            except TypeError as err:  # a required setting left out
                raise ValueError(f"{name}: {err}") from None
            except ValueError as err:
                raise ValueError(str(err) if str(err).startswith(f"{name}.")
                                 else f"{name}: {err}") from None
        return cls(**made, **d)


def _renamed(splits: dict[str, str], split: str, test_sets) -> str:
    """`splits` with the missing `split` in it, written as a --set value: the data's split
    that the run does not use (the one it was renamed to, likely) mapped to it, else NAME."""
    spare = [k for k in splits if k not in ("train", "valid", *test_sets)]
    fixed = {(split if spare and k == spare[0] else k): v for k, v in splits.items()}
    fixed.setdefault(split, "NAME")
    return "{" + ", ".join(f"{k}: {v}" for k, v in fixed.items()) + "}"


def _plain(x):
    """Tuples as lists, recursively: what YAML and JSON write."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


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
    precision: str | None = None  # training precision: auto | bf16 | fp32 (convs2s.precision)
    update_freq: int | None = None  # micro-batches per update (default: what keeps the preset's)
    test_set: list[str] = field(default_factory=list)  # extra test sets: file stems in --data
    attention: int = 0  # attention pictures of the first N sentences of each test set
    storage_path: str = "runs"
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    system_metrics: bool = True  # sample each training node's utilization into MLflow
    restart: bool = False  # train this run name over under new settings (earlier work set aside)
    init_from: str | None = None  # fine-tune: start from this checkpoint directory's weights
    accelerator_type: str | None = None  # every training worker on nodes with this GPU model
    sweep: str | None = None  # run a sweep of model variants (workflows/ablations.py) instead
    seeds: int = 1  # seeds per variant of a sweep
    variants: list[str] = field(default_factory=list)  # a subset of the sweep's variants
    variant: list[str] = field(default_factory=list)  # --sweep custom: NAME:SETTING;SETTING
    concurrent_trials: int | None = None  # a sweep's trials at once (default: what fits)
    set: list[str] = field(default_factory=list)  # --set section.field=value (workflows.overrides)
    src: str | None = None  # --src LANG: the source language (file suffix, hub column)
    tgt: str | None = None  # --tgt LANG: the target language
    split: list[str] = field(default_factory=list)  # --split SPLIT=STEM: local file stems
    config: str | None = None  # --config FILE.yaml: the preset as a file (replaces --preset's)
    # Set by --config's loader (workflows.orchestrate): the preset the file names (`preset:`),
    # and the file's settings that count as set on purpose (those that differ from that preset
    # and those it lists under `explicit:`), applied as --set changes (workflows.overrides).
    config_preset: str | None = None
    config_settings: tuple = ()
    preset_flag: str | None = None  # --preset as given (None: left out), checked with --config's
    # the preset the --config file starts from, as built: what names the run's evaluation sets
    # (a set read from other files or hub data than the preset's is named after them)
    config_base: object | None = field(default=None, repr=False)
    dry_run: bool = False  # print the resolved run and exit, starting nothing
    format: str = "json"  # --dry-run's output: json (the resolved run) or yaml (a --config file)



def _default_data(cfg: WorkflowConfig) -> str:
    """A preset's default --data, as --help says it: the hub dataset and pair, or demo."""
    p = cfg.preprocess
    return (f"hub {p.hub_repo} {p.hub_config} {p.src_lang}->{p.tgt_lang}" if cfg.data == "hub"
            else cfg.data)


# --- command line --------------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose refusals are one line, as every other refusal of a workflow
    (argparse's own print the whole usage first: 24 lines of the workflows' flags before the
    one that says what is wrong)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None, presets: dict[str, Callable[[], WorkflowConfig]],
               doc: str | None) -> RunOptions:
    name = Path(sys.argv[0]).name if argv is None else "workflow"
    lines = (doc or "").strip().splitlines()
    p = OneLineParser(prog=f"python workflows/{name}", description=lines[0] if lines
                                else None, epilog="\n".join(lines[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(presets), default=None,
                   help=f"{', '.join(sorted(presets))} (default: smoke); the description "
                        "below says what each is")
    p.add_argument("--data", help="hub (Hugging Face), demo (embedded corpus) or a local folder "
                                  "(default: the preset's: " + "; ".join(
                                      f"{name}={_default_data(preset())}"
                                      for name, preset in sorted(presets.items())) + ")")
    p.add_argument("--num-workers", type=int, help="Ray Train workers (default: the preset's)")
    p.add_argument("--use-gpu", action=argparse.BooleanOptionalAction, default=None,
                   help="one GPU per training worker (default: the preset's)")
    p.add_argument("--max-epochs", type=int, help="stop after this many epochs")
    p.add_argument("--max-updates", type=int,
                   help="stop after this many updates; alone, without the preset's epoch limit "
                        "(--set train.max_updates=N keeps it: whichever comes first)")
    p.add_argument("--max-time", type=duration, metavar="DURATION",
                   help="training wall-clock budget: seconds, or with a unit (90s, 60m, 1.5h); "
                        "training stops after the update that spends it, validates, "
                        "checkpoints, and the workflow evaluates; a resumed run counts the "
                        "time already spent")
    p.add_argument("--precision", choices=TRAINING_PRECISIONS,
                   help="training precision: bf16 autocast or float32; auto (the presets' "
                        "default) picks bf16 where every node multiplies bf16 natively (GPUs, "
                        "CPUs with AVX-512 BF16 or AMX) and says which in the log and MLflow")
    p.add_argument("--update-freq", type=int, metavar="N",
                   help="micro-batches each worker accumulates per update (default: as many as "
                        "keep the preset's update, its tokens or sentences, with this many "
                        "workers; 1 where the preset states none)")
    p.add_argument("--max-tokens", type=int, metavar="N",
                   help="tokens per batch, each worker's micro-batch (as --set "
                        "data.max_tokens=N: a new budget reuses the cleaned, BPE and encoded "
                        "data and cuts only the batches again)")
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
    p.add_argument("--restart", action="store_true",
                   help="the --run-name exists with other settings: train it over under these "
                        "(its earlier training and scores are set aside in its folder, and "
                        "its MLflow runs say so); without it such a rerun is refused")
    p.add_argument("--accelerator-type", metavar="TYPE",
                   help="with --use-gpu: place every training worker on nodes with this GPU "
                        "model (Ray's accelerator types: A100, H100, A10G, ...), so that one "
                        "data-parallel group never mixes GPU models of different speed and "
                        "memory (infra/cluster-aws.yaml has two GPU node types)")
    p.add_argument("--init-from", metavar="CKPT_DIR",
                   help="fine-tune: start training from this checkpoint directory's weights (a "
                        "run's checkpoint, or a reference model imported with `python -m convs2s "
                        "import-fairseq`) instead of random ones; the run keeps its "
                        "architecture and vocabulary (the data is encoded with its sentencepiece "
                        "model or Moses + BPE pipeline) and takes the preset's recipe and "
                        "dropout")
    from workflows.ablations import CUSTOM, SWEEPS

    p.add_argument("--sweep", choices=sorted([*SWEEPS, CUSTOM]), metavar="NAME",
                   help="instead of one run: a sweep of model variants of the preset (the "
                        "paper's sections 5.4-5.6: table4 = position embeddings, table5 = "
                        "attention layers, paper-5.2 = both, depth, kernel), each variant x "
                        "--seeds a whole workflow run with the same budget, on Ray Tune, "
                        "compared in one MLflow sweep run; the same --run-name resumes it; "
                        "custom: the variants given with --variant. Choices: "
                        + ", ".join(sorted([*SWEEPS, CUSTOM])))
    p.add_argument("--variant", action="append", default=[], metavar="NAME:SETTING;...",
                   help="with --sweep custom: one variant as --set settings (repeatable), e.g. "
                        "--variant 'lr-half:train.lr=0.125' --variant "
                        "'small:model.dropout=0.3;data.vocab_size=4000'")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="with --sweep: runs per variant, seeds seed, seed+1, ... (default 1)")
    p.add_argument("--variants", type=lambda s: [v for v in s.split(",") if v], default=[],
                   metavar="A,B", help="with --sweep: only these variants (names as the "
                                       "sweep's table prints them, e.g. baseline,no-pos)")
    p.add_argument("--concurrent-trials", type=int, metavar="N",
                   help="with --sweep: trials at once (default: as many as the cluster's "
                        "CPUs, or GPUs with --use-gpu, fit)")
    p.add_argument("--src", metavar="LANG",
                   help="the source language: the suffix of its files (STEM.LANG) or its key in "
                        "the hub rows (default: the preset's)")
    p.add_argument("--tgt", metavar="LANG", help="the target language (default: the preset's)")
    p.add_argument("--split", action="append", default=[], metavar="SPLIT=STEM",
                   help="with --data DIR: the file stem of a split (train, valid, test; "
                        "repeatable), e.g. --split valid=dev; STEM[a:b] cuts lines a to b-1 of "
                        "one corpus, e.g. --split 'train=corpus[:9000]' --split "
                        "'valid=corpus[9000:9500]' --split 'test=corpus[9500:]'")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="change one setting of the preset (repeatable): sections model, train, "
                        "search, data, ensemble, workflow; e.g. --set model.dropout=0.3 --set "
                        "train.lr=0.5 (a value is read as YAML: numbers, true/false, lists)")
    p.add_argument("--config", metavar="FILE.yaml",
                   help="a preset from a YAML (or JSON) file, as `--dry-run --format yaml` "
                        "writes one (a setting it leaves out is that of the preset it names); "
                        "--set applies on top, the run-level flags as usual")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved run (every setting, the workers and tokens per "
                        "update, the data source, test sets, run folder, tracking URI and "
                        "experiment) and exit, starting nothing")
    p.add_argument("--format", choices=["json", "yaml"], default="json",
                   help="with --dry-run: json, the resolved run (default); yaml, its settings "
                        "as a --config file (the preset with --set, --data, --src, --tgt, "
                        "--split, --num-workers, --use-gpu, the limits, --precision and "
                        "--update-freq applied; the other flags are given with it as usual)")
    p.add_argument("--system-metrics", action=argparse.BooleanOptionalAction, default=True,
                   help="log each training node's CPU, memory and GPU utilization to the "
                        "train run in MLflow (system/<node>/...; default: on)")
    a = p.parse_args(argv)
    for flag in ("num_workers", "max_epochs", "max_updates", "update_freq", "max_tokens"):
        if getattr(a, flag) is not None and getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(a, flag)}: give a positive integer")
    if a.attention < 0:
        p.error(f"--attention {a.attention}: give a number of sentences (0: none)")
    if a.sweep is None:
        for flag, value, unset in (("--seeds", a.seeds, 1), ("--variants", a.variants, []),
                                   ("--variant", a.variant, []),
                                   ("--concurrent-trials", a.concurrent_trials, None)):
            if value != unset:
                p.error(f"{flag} applies to a sweep: add --sweep NAME")
    elif a.seeds < 1:
        p.error(f"--seeds {a.seeds}: give the number of seeds per variant (>= 1)")
    elif a.concurrent_trials is not None and a.concurrent_trials < 1:
        p.error(f"--concurrent-trials {a.concurrent_trials}: give a positive number")
    elif a.variant and a.sweep != CUSTOM:
        p.error(f"--variant gives the variants of --sweep {CUSTOM}, not of --sweep {a.sweep} "
                "(pick among those with --variants A,B)")
    elif a.variants and a.sweep == CUSTOM:
        p.error(f"--variants picks among a named sweep's variants: --sweep {CUSTOM} runs its "
                "--variant list")
    for item in a.split:
        name, eq, stem = item.partition("=")
        if not eq or not name or not stem:
            p.error(f"--split {item!r}: write SPLIT=STEM (e.g. valid=newstest2013)")
    if a.format != "json" and not a.dry_run:
        p.error("--format applies to --dry-run")
    from convs2s.tracking.runs import tracking_uri_problem

    if problem := tracking_uri_problem(a.tracking_uri):
        p.error(problem)
    opts = vars(a)
    opts["preset_flag"], opts["preset"] = a.preset, a.preset or "smoke"
    if (tokens := opts.pop("max_tokens")) is not None:  # a --set of its own, given last: a
        # run-level flag applies on top of --set (it lost to a --set data.max_tokens)
        opts["set"] = [*opts["set"], f"data.max_tokens={tokens}"]
    return RunOptions(**opts)
