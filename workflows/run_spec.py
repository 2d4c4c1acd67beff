"""One workflow run, resolved once: `resolve(preset, options) -> RunSpec`.

A workflow file declares its presets (`WorkflowConfig`, workflows/workflow_config.py); the
command line gives run-level options (`RunOptions`). Everything that depends on both is decided
here, in one function, and nowhere else: the data source (`--data hub | demo | DIR`, the demo
corpus bringing its own settings), the splits and every evaluation set with its name (the
preset's test sets, renamed `demo_<split>` on the demo corpus, and each `--test-set STEM` of a
local folder), the training limits, the resources, where outputs go and where runs are tracked.
Stages receive only the spec; a sweep varies it.

    spec = resolve(wmt14_en_fr.smoke(), RunOptions(preset="smoke", max_updates=50))
    spec.data.splits      # {"train": "train", "valid": "validation", "test": "test"}
    spec.test_sets        # {"test": "demo_test"}: evaluation split -> test set name
    spec.run_dir          # <storage>/<run name>

Two words are kept apart: a *task kind* (`task_kind`: translation or summarization, which
decides the metrics, convs2s.metrics.task_kinds) and the preprocessing output's *task* folder
(`data.task`, e.g. "wmt14_en_fr").
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass

from convs2s.config import ModelConfig, SearchConfig, TrainConfig
from convs2s.metrics.task_kinds import task_kind
from preprocessing.config import WMT_SPLITS, PreprocessConfig, with_demo_source
from storage import location
from storage.checks import run_name_problem
from workflows.errors import SpecError  # noqa: F401  (raised here; imported from here too)
from workflows.workflow_config import EnsembleConfig, RunOptions, WorkflowConfig


@dataclass(frozen=True)
class RunSpec:
    """Everything one workflow run does, decided before anything starts."""

    workflow: str  # the workflow's name: default experiment, registered model name
    preset: str
    task_kind: str  # translation | summarization (convs2s.metrics.task_kinds)
    data_flag: str  # what --data said (or the preset's default): hub | demo | a folder
    data: PreprocessConfig  # the one home of the data: source, every split, output root
    # Evaluation split of `data` -> test set name, in scoring order; the first one carries the
    # headline score (parent run, champion).
    test_sets: dict[str, str]
    model: ModelConfig
    train: TrainConfig
    search: SearchConfig
    ensemble: EnsembleConfig
    num_workers: int
    use_gpu: bool
    cpus_per_worker: float
    eval_cpus: float
    eval_gpus: float  # per evaluation task; 0 without --use-gpu
    system_metrics_s: float
    attention: int  # attention pictures of the first N sentences of each test set
    run_name: str
    # Absolute (Ray workers on other nodes read and write there): a shared folder, or a bucket
    # URI (s3://bucket/prefix), kept a URI (storage/, docs/storage.md).
    storage: str
    # Resolved once, here: --tracking-uri, else $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db
    # (absolute: Ray workers run in another working directory).
    tracking_uri: str
    experiment: str
    added_test_sets: tuple[str, ...] = ()  # the --test-set stems (checked for files up front)
    restart: bool = False  # --restart: train the run name over (workflows.run_state)
    # --init-from: fine-tuning starts from this checkpoint directory's weights (absolute), keeps
    # its architecture (`model` is the checkpoint's, with the preset's dropout) and vocabulary.
    init_from: str | None = None
    # --accelerator-type: the GPU model every training worker's node has (Ray Train's
    # ScalingConfig.accelerator_type); None: any GPU.
    accelerator_type: str | None = None
    # Whether a better model moves the task's champion alias; a sweep's trials (ablations) never
    # do: they are compared with each other, not served.
    register_champion: bool = True
    # --set section.field=value as given (workflows.overrides): applied above; kept to show.
    overrides: tuple[str, ...] = ()
    update_tokens: int = 0  # the preset's tokens per update (0: none stated)
    update_sentences: int = 0  # the preset's sentences per update (0: none stated)
    update_note: str = ""  # one line when the run's update is not the preset's

    @property
    def run_dir(self):  # pathlib.Path, or storage.ObjectPath in a bucket
        return location(self.storage) / self.run_name

    def replace(self, **changes) -> "RunSpec":
        return dataclasses.replace(self, **changes)

    def params(self) -> dict:
        """The parent run's params: the whole resolved run, the storage root left out (it only
        tells machines apart in MLflow's compare view). The inputs keep their paths, which say
        what the run was made from: the data source (absolute with --data DIR), --init-from
        (absolute), search files as given."""
        return {"workflow": {
            "name": self.workflow, "preset": self.preset, "task_kind": self.task_kind,
            "data": self.data_flag, "preprocess": preprocess_params(self.data),
            "model": self.model.to_dict(), "train": self.train.to_dict(),
            "search": self.search.to_dict(), "ensemble": dataclasses.asdict(self.ensemble),
            "test_sets": dict(self.test_sets), "num_workers": self.num_workers,
            "use_gpu": self.use_gpu, "cpus_per_worker": self.cpus_per_worker,
            "eval_cpus": self.eval_cpus, "eval_gpus": self.eval_gpus,
            "system_metrics_s": self.system_metrics_s,
            **({"init_from": self.init_from} if self.init_from else {}),
            **({"update_tokens": self.update_tokens} if self.update_tokens else {}),
            **({"update_sentences": self.update_sentences} if self.update_sentences else {}),
            **({"overrides": "; ".join(self.overrides)} if self.overrides else {})}}

    def describe(self) -> dict:
        """The resolved run as `--dry-run` prints it: the parent run's params, the update each
        step trains, where the run goes and what it scores (credentials in the URI hidden)."""
        from convs2s.tracking.redact import redact_uri

        d = self.data
        workers = self.num_workers
        return {**self.params(),
                "update": {"workers": workers, "gpus": workers if self.use_gpu else 0,
                           "max_tokens_per_batch": d.max_tokens,  # a padded-token budget
                           "micro_batches_per_update": self.train.update_freq,
                           "max_tokens_per_update": workers * self.train.update_freq
                           * d.max_tokens,
                           "preset_tokens_per_update": self.update_tokens,
                           **({"max_sentences_per_batch": d.max_sentences,
                               "max_sentences_per_update": workers * self.train.update_freq
                               * d.max_sentences,
                               "preset_sentences_per_update": self.update_sentences}
                              if self.update_sentences else {}),
                           **({"note": self.update_note} if self.update_note else {})},
                **({"schedule_note": note} if (note := schedule_note(self.train)) else {}),
                "run": {"run_name": self.run_name, "storage": self.storage,
                        "run_dir": str(self.run_dir),
                        "tracking_uri": redact_uri(self.tracking_uri),
                        "experiment": self.experiment, "data_source": d.source,
                        "test_sets": dict(self.test_sets),
                        "added_test_sets": list(self.added_test_sets),
                        "accelerator_type": self.accelerator_type,
                        "attention": self.attention,
                        "init_from": self.init_from, "restart": self.restart}}


def schedule_note(train) -> str:
    """One line when the lr schedule cannot do what its settings say within the run: a
    `fixed` schedule that shrinks from an epoch past the run's last (the paper En-De preset
    with --max-epochs 30 trained at lr 0.5 to its end, never annealed); "" otherwise."""
    start = train.anneal_from_epoch
    if train.lr_schedule == "fixed" and start and train.max_epochs and start > train.max_epochs:
        return (f"lr_schedule fixed shrinks the lr from epoch {start}, after the run's last "
                f"(max_epochs {train.max_epochs}): the lr stays {train.lr:g} to the end; "
                f"--set train.anneal_from_epoch=N anneals within the run")
    return ""


def check_locations(spec) -> None:
    """Before Ray starts: every bucket the run reads or writes answers, with credentials that
    may (storage/checks.py), and a tracking server that answers takes its runs (a login, the
    right to write the experiment); a SpecError (one line: the flag, the location, the fix)
    otherwise. `spec` is a RunSpec or a sweep (its base run's locations)."""
    from storage import StorageError, check_storage

    run = getattr(spec, "base", spec)
    try:
        check_storage(run.storage, "--storage-path", write=True)
        if run.data_flag not in ("hub", "demo"):
            check_storage(run.data.source, "--data")
        if run.init_from:
            check_storage(run.init_from, "--init-from")
    except StorageError as err:
        raise SpecError(str(err)) from None
    from convs2s.tracking.runs import tracking_problem

    if problem := tracking_problem(run.tracking_uri, run.experiment):
        raise SpecError(problem)


def preprocess_params(pre: PreprocessConfig) -> dict:
    """Preprocessing settings as params: all but the storage root, an absolute path that only
    tells machines apart in MLflow's compare view (the run's tags keep its folder). A
    `token_map` is one JSON value (its words as param names: `<unk>` is not a name MLflow
    takes, and it refuses the whole batch that holds one), none where unset (as before it
    existed)."""
    out = {k: v for k, v in pre.to_dict().items() if k != "root"}
    if out.get("token_map"):
        out["token_map"] = json.dumps(out["token_map"], sort_keys=True)
    else:
        out.pop("token_map", None)
    return out


# What MLflow takes in a metric or param name (mlflow.utils.validation,
# validate_param_and_metric_name off Windows); it refuses the whole batch that holds another
_MLFLOW_KEY_CHARS = re.compile(r"[\w.\- :]+")


def mlflow_key_part(name: str) -> bool:
    """Whether `name` may be one part of an MLflow metric or param name: MLflow's characters,
    and not a part that a path would resolve away (its path_not_unique: '.', '..')."""
    return bool(_MLFLOW_KEY_CHARS.fullmatch(name)) and name not in (".", "..")


def _key_safe(name: str) -> str:
    """`name` with each character MLflow refuses in a name made '_' (a suggestion)."""
    return re.sub(r"[^\w.\- :]", "_", name).strip(".") or "test"


# A language code (ISO 639: en, fra, zh-Hant), not another name for a side (a column's)
_LANG_CODE = re.compile(r"[a-z]{2,3}([-_][A-Za-z0-9]+)*")


def set_name(stem: str) -> str:
    """The evaluation set's name for a split's file stem (a name of MLflow metrics and params:
    `nc-5k[4750:]`, lines 4750 to the end, is nc-5k_4750-end; `dir/a.en,dir/b.fr`, a file per
    side, a.en_b.fr)."""
    named = ",".join(part.replace("\\", "/").rsplit("/", 1)[-1] for part in stem.split(","))
    ranged = re.sub(r"\[(\d*):(\d*)\]$", lambda m: f"_{m[1] or 0}-{m[2] or 'end'}", named)
    return _key_safe(ranged)


def _tracking_uri(flag: str | None) -> str:
    from convs2s.tracking.runs import resolve_tracking_uri

    try:
        return resolve_tracking_uri(flag)
    except ValueError as err:
        raise SpecError(f"--tracking-uri: {err}") from None


def update_plan(update_size: int, workers: int, per_batch: int, asked: int | None,
                preset_freq: int, asked_by: str | None = None, *, unit: str = "tokens",
                setting: str = "data.max_tokens") -> tuple[int, str]:
    """(micro-batches per update, a note: "" when the update is the preset's). With
    `update_size` (the preset's update: GPUs x `per_batch` tokens, or sentences for a preset
    whose update is a number of sentences, `unit` "sentences", `setting` data.max_sentences)
    the run keeps it on any number of workers by accumulating micro-batches, as the
    reference's --update-freq does; `asked` (--update-freq, or the setting `asked_by` names)
    decides when given."""
    per_pass = workers * per_batch  # one micro-batch on every worker
    if asked is not None:
        freq = asked
    elif update_size:
        freq = max(1, round(update_size / per_pass))
    else:
        return preset_freq, ""
    if not update_size or per_pass * freq == update_size:
        return freq, ""
    got = f"{workers} worker(s) x {freq} micro-batch(es) x {per_batch:,} {unit} = " \
          f"{per_pass * freq:,} {unit} an update"
    if asked is not None:
        return freq, f"{got}, not the preset's {update_size:,} " \
                     f"({asked_by or f'--update-freq {asked}'})"
    return freq, f"{got}: the preset's update is {update_size:,} {unit}, which " \
                 f"{workers} worker(s) cannot keep exactly " \
                 f"({_budgets_that_keep(update_size, workers, per_batch, unit, setting)})"


def _budgets_that_keep(update_size: int, workers: int, per_batch: int, unit: str,
                       setting: str, most_micro: int = 16) -> str:
    """The fix `update_plan` names: the batch budgets (`setting`) with which `workers` keep
    `update_size` exactly (the plan then accumulates update / (workers x budget) micro-batches):
    the largest at most `per_batch` (what fits now) and the smallest above it; where none does
    (4,000 tokens on 3 workers), the one that comes nearest."""
    exact = sorted({update_size // (workers * f) for f in range(1, most_micro + 1)
                    if update_size % (workers * f) == 0})
    below = [b for b in exact if b <= per_batch]
    above = [b for b in exact if b > per_batch]
    picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
    if picks:
        return " or ".join(f"--set {setting}={b} keeps it with "
                           f"{update_size // (workers * b)} micro-batch(es)" for b in picks)
    near = max(1, round(update_size / workers))
    return (f"no budget keeps it exactly on {workers} worker(s); --set {setting}={near} comes "
            f"nearest, {workers * near:,} {unit} an update")


def _shares_training_lines(splits: dict[str, str], added=()) -> str | None:
    """Why an evaluation split of a local folder holds lines the training split holds (the
    same file, ranges that meet: `c[:900]` and `c`, `c[:4750]` and `c[4500:4750]`), or None:
    its scores would be on text the model (and the BPE) learned."""
    from preprocessing.sources import LINE_RANGE

    def lines(spec: str) -> tuple[str, int, float]:
        m = LINE_RANGE.fullmatch(spec)
        return (m[1], int(m[2] or 0), int(m[3]) if m[3] else math.inf) if m else \
            (spec, 0, math.inf)

    name, first, end = lines(splits["train"])
    for split, spec in splits.items():
        other, a, b = lines(spec)
        if split != "train" and other == name and max(first, a) < min(end, b):
            what = f"--test-set {spec}" if split in added else f"split {split} ({spec})"
            return (f"{what} shares lines with the training split "
                    f"({splits['train']}): its scores would be on text the model and its BPE "
                    "learned; give it other lines (NAME[first:end] ranges that do not meet) "
                    "or another file")
    return None


def resolve(cfg: WorkflowConfig, opts: RunOptions) -> RunSpec:
    """The run `opts` asks of the preset `cfg`; a SpecError names a flag that cannot apply."""
    from workflows import overrides

    # --set: the preset changed before anything else; a --config file's settings set on
    # purpose first, as if given with --set (workflows.overrides.file_settings); --src / --tgt
    # / --split on top of them, all checked together once
    sets = overrides.parse(opts.set)
    data_flag = opts.data or cfg.data
    changes = [*opts.config_settings, *sets]
    changes += language_and_split_flags(cfg, opts, data_flag, changes)
    preset_pair = (cfg.preprocess.src_lang, cfg.preprocess.tgt_lang)
    base = opts.config_base or cfg  # (a --config file's preset: the file may change them)
    preset_files = dict(base.local_splits)  # (the files the preset's set names name)
    preset_hub = (base.preprocess.hub_repo, base.preprocess.hub_config,
                  dict(base.preprocess.splits))  # (and the hub splits they name)
    cfg = overrides.apply(cfg, changes)
    storage = location(opts.storage_path)  # a bucket URI stays one: never a folder "s3:"
    test_sets = dict(cfg.test_sets)
    if data_flag == "demo":  # the demo's own languages and settings; test sets named after it
        if extra := [s for s in test_sets if s not in WMT_SPLITS]:  # (a hub's newstest2018)
            raise SpecError(f"test split {extra[0]!r} is not a split of the demo corpus "
                            "(--data demo), which has valid and test: score the demo on those "
                            "(workflow.test_sets)")
        pre = with_demo_source(cfg.preprocess, cfg.task_kind)
        if not _set(changes, "workflow", "test_sets"):  # (unless named on purpose)
            test_sets = {split: f"demo_{split}" for split in test_sets}
    elif data_flag == "hub":
        pre = cfg.preprocess.replace(source="hub")
    else:  # a folder or a bucket prefix: the preset's file stems, absolute (Ray tasks read it
        # elsewhere)
        if problem := cfg.split_problem("workflow.local_splits", cfg.local_splits):
            raise SpecError(problem)
        pre = cfg.preprocess.replace(source=str(location(data_flag)),
                                     splits=dict(cfg.local_splits))
    added: tuple[str, ...] = ()
    if opts.test_set:
        if data_flag in ("hub", "demo"):
            raise SpecError(f"--test-set reads STEM.<src> / STEM.<tgt> from a local folder, "
                            f"but the data is {data_flag!r}: add --data DIR")
        for stem in opts.test_set:
            if not stem or any(c in stem for c in "/\\,") or stem in pre.splits:
                raise SpecError(f"--test-set {stem!r}: give a file stem of the --data folder "
                                "(STEM.<src> / STEM.<tgt>), not a path or a split name")
            if not mlflow_key_part(stem):
                raise SpecError(f"--test-set {stem!r}: the stem names MLflow metrics and "
                                "params (eval/<job>/<stem>/bleu), whose names may only hold "
                                "letters, digits, '_', '-', '.', ' ' and ':' (and not be '.' "
                                f"or '..'): rename its files, e.g. to {_key_safe(stem)}.<src> "
                                f"/ {_key_safe(stem)}.<tgt>")
    pre = overrides.apply_data(pre, changes)  # data.*: on the source --data chose
    if data_flag not in ("hub", "demo") and not _set(changes, "workflow", "test_sets"):
        # A split given another file (--split valid=dev, --set data.splits) is named after
        # that file: its scores, dataset and registered model must not carry the preset's name
        # for other text (newstest2014), nor a split's own (`test`, as the generic
        # translation workflow names its sets: every corpus of a language pair then shared
        # one registered model, models:/translation_de_en-test, whose champion a run on
        # another corpus could never become, its validation data not the model's), unless
        # workflow.test_sets names the sets on purpose (its names were replaced silently)
        for split in test_sets:
            stem = pre.splits.get(split)
            if stem and stem != preset_files.get(split):
                test_sets[split] = set_name(stem)
    elif data_flag == "hub" and not _set(changes, "workflow", "test_sets"):
        # The same on the hub: a split read from another hub split, dataset or configuration
        # than the preset's (--set data.splits / data.hub_repo / data.hub_config) is named
        # after what it reads (wmt15_test), never the preset's name (wmt15's test scored as
        # newstest2014, competing for its registered model), unless workflow.test_sets names
        # the sets on purpose
        repo, config, hub_splits = preset_hub
        for split in test_sets:
            read = pre.splits.get(split)
            if read and (pre.hub_repo, pre.hub_config, read) != \
                    (repo, config, hub_splits.get(split)):
                parts = [pre.hub_repo.rstrip("/").rsplit("/", 1)[-1]]
                parts += [pre.hub_config] if pre.hub_config != config else []
                test_sets[split] = set_name("_".join([*parts, read]))
    if data_flag == "hub" and (m := re.fullmatch(r"([a-z]{2,3})-([a-z]{2,3})", pre.hub_config)) \
            and {m[1], m[2]} != {pre.src_lang, pre.tgt_lang}:
        # (the run refused it only once Ray had started, reading the files' columns)
        pair = sorted((pre.src_lang, pre.tgt_lang), key=lambda lang: lang == "en")
        raise SpecError(f"the hub's {pre.hub_repo} {pre.hub_config} holds {m[1]} and {m[2]}, "
                        f"not {pre.src_lang} -> {pre.tgt_lang}: name the hub's configuration "
                        f"of the pair (--set data.hub_config={'-'.join(pair)}), or give the "
                        "data with --data DIR")
    if opts.test_set:  # after data.* (--split's, --set data.splits'), which set the splits whole
        # A stem that already is one of the evaluation splits is scored already: not twice.
        # (The training split's is added, and refused below: scores on training lines.)
        scored = {spec for split, spec in pre.splits.items() if split != "train"}
        added = tuple(dict.fromkeys(s for s in opts.test_set if s not in scored))
        pre = pre.replace(splits={**pre.splits, **{stem: stem for stem in added}})
        test_sets.update({stem: stem for stem in added})
    shared = data_flag not in ("hub", "demo") and _shares_training_lines(pre.splits, added)
    if shared:
        raise SpecError(shared)
    named: dict[str, list[str]] = {}
    for split, name_ in test_sets.items():
        named.setdefault(name_, []).append(split)
    if clash := next(((n, s) for n, s in named.items() if len(s) > 1), None):
        raise SpecError(f"evaluation sets of splits {' and '.join(clash[1])} are both named "
                        f"{clash[0]!r}: each set's scores, dataset and model are logged under "
                        "its name; give each split its own file (--split, --test-set) and name "
                        "(workflow.test_sets)")
    # Scoring this target must work before the run trains, not fail after (a zh / ja / ko
    # tokenizer's package, convs2s.metrics.scoring)
    if problem := task_kind(cfg.task_kind).language_problem(pre.tgt_lang):
        raise SpecError(f"{problem}, then run again (or choose another --tgt)")
    # The languages are decided: a name with {src} / {tgt} (the generic translation workflow)
    # takes them, --set data.src_lang / tgt_lang included, so each pair has its experiment
    # and registered models
    name = cfg.name.format(src=pre.src_lang, tgt=pre.tgt_lang)
    if "{src}" not in cfg.name and data_flag != "demo" and cfg.task_kind == "translation" \
            and (pre.src_lang, pre.tgt_lang) != preset_pair \
            and all(_LANG_CODE.fullmatch(lang) for lang in (pre.src_lang, pre.tgt_lang)):
        # A paper task run in the other direction (--src fr --tgt en on wmt14_en_fr), or on
        # another pair of language codes, is another task: its own experiment and registered
        # models (wmt14_fr_en, wmt14_de_en), so that its validation data never meets the
        # preset pair's champion. (The demo brings its own languages to every task's smoke
        # run; other names for the sides, a folder's columns `english`, are no codes.)
        ours, theirs = f"_{pre.src_lang}_{pre.tgt_lang}", "_{}_{}".format(*preset_pair)
        name = name.replace(theirs, ours) if theirs in name else name + ours
    limits = {k: v for k, v in (("max_epochs", opts.max_epochs),
                                ("max_updates", opts.max_updates),
                                ("max_time", opts.max_time)) if v is not None}
    if "max_updates" in limits and "max_epochs" not in limits \
            and not _set(changes, "train", "max_epochs"):
        limits["max_epochs"] = 0  # --max-updates alone: stop on the update count only
    if opts.precision is not None:
        limits["precision"] = opts.precision
    use_gpu = cfg.use_gpu if opts.use_gpu is None else opts.use_gpu
    for o in [*opts.config_settings, *sets]:  # set on purpose, for data or devices not used
        if problem := _unused_here(o, data_flag, use_gpu, cfg, pre):
            raise SpecError(f"{o.origin} {o.text}: {problem}: leave it out")
    run_name = opts.run_name or f"{opts.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    _check_run_name(opts.run_name)
    if opts.accelerator_type and not use_gpu:
        raise SpecError(f"--accelerator-type {opts.accelerator_type} places GPU workers; add "
                        "--use-gpu (or leave it out to train on CPUs)")
    model, init_from = cfg.model, None
    if opts.init_from:
        if problem := _decided_by_checkpoint(changes):
            raise SpecError(f"--init-from {opts.init_from}: {problem}")
        init_from, model = _fine_tuned(opts.init_from, cfg.model, pre)
    if pre.max_positions is None:  # sentences the model cannot take: dropped and counted
        pre = pre.replace(max_positions=model.max_positions)
    elif pre.max_positions > model.max_positions:  # (refused by the training, preprocessed)
        raise SpecError(f"data.max_positions {pre.max_positions} keeps sentences longer than "
                        f"the model takes (model.max_positions {model.max_positions}): lower "
                        "it, or raise model.max_positions")
    pre, batch_note = float32_cpu_batches(cfg, pre, changes, use_gpu,
                                          opts.precision or cfg.train.precision)
    workers = opts.num_workers or cfg.num_workers
    # `--set train.update_freq=N` (or a --config file's own) asks as --update-freq does (the
    # plan replaced it silently)
    asked, asked_by = opts.update_freq, None
    if asked is None and _set(changes, "train", "update_freq"):
        asked, asked_by = cfg.train.update_freq, f"train.update_freq={cfg.train.update_freq}"
    if cfg.update_sentences:  # batches cut by sentences (the token budget never binds)
        limits["update_freq"], update_note = update_plan(
            cfg.update_sentences, workers, pre.max_sentences, asked, cfg.train.update_freq,
            asked_by, unit="sentences", setting="data.max_sentences")
    else:
        limits["update_freq"], update_note = update_plan(
            cfg.update_tokens, workers, pre.max_tokens, asked, cfg.train.update_freq, asked_by)
    update_note = "; ".join(n for n in (batch_note, update_note) if n)
    train = cfg.train.replace(**limits)
    for o in changes:  # (the table is read only against a time budget: trainer._probe_passes)
        if o.section == "train" and o.field in ("dropout_by_passes", "passes_probe_updates") \
                and train.dropout_by_passes and not train.max_time:
            raise SpecError(f"{o.origin} {o.text}: the dropout table chooses by the passes a "
                            "time budget will reach, and this run has none: add --max-time "
                            "(e.g. 60m), or set model.dropout instead")
    if train.dropout_by_passes and not train.max_time:  # the preset's own, its budget taken
        train = train.replace(dropout_by_passes=())  # off: the model's dropout, as recorded
    return RunSpec(
        workflow=name, preset=opts.preset, task_kind=cfg.task_kind, data_flag=data_flag,
        data=pre.replace(root=str(storage / "preprocessed")), test_sets=test_sets,
        model=model, train=train, search=cfg.search,
        ensemble=cfg.ensemble, num_workers=workers,
        use_gpu=use_gpu, cpus_per_worker=cfg.cpus_per_worker, eval_cpus=cfg.eval_cpus,
        eval_gpus=cfg.eval_gpus if use_gpu else 0.0,
        system_metrics_s=cfg.system_metrics_s if opts.system_metrics else 0.0,
        attention=opts.attention, run_name=run_name, storage=str(storage),
        tracking_uri=_tracking_uri(opts.tracking_uri), experiment=opts.experiment or name,
        added_test_sets=added, restart=opts.restart, init_from=init_from,
        accelerator_type=opts.accelerator_type, overrides=tuple(o.text for o in sets),
        update_tokens=cfg.update_tokens, update_sentences=cfg.update_sentences,
        update_note=update_note)


def _check_run_name(name: str | None) -> None:
    """A --run-name is one folder directly under the storage path
    (`storage.checks.run_name_problem`); none given: the default, `<preset>-<date>-<time>`."""
    if name and (problem := run_name_problem(name)):
        raise SpecError(problem)


def _unused_here(o, data_flag: str, use_gpu: bool, cfg: WorkflowConfig,
                 pre: PreprocessConfig) -> str | None:
    """Why a setting given on purpose does nothing in this run, or None: each was accepted,
    recorded as the run's param (a later change of it refused as a change of the run), and
    never read. `cfg`, `pre`: the run's settings, --set applied."""
    key = f"{o.section}.{o.field}"
    if key == "workflow.local_splits" and data_flag in ("hub", "demo"):
        return f"{key} names the files of --data DIR, and the data is {data_flag!r}"
    if key in ("data.hub_repo", "data.hub_config", "data.hub_revision") and data_flag != "hub":
        return f"{key} names the hub dataset of --data hub, and the data is {data_flag!r}"
    if key == "data.demo_rows" and data_flag != "demo":  # (and it keyed a new data folder)
        return f"{key} sizes the corpus of --data demo, and the data is {data_flag!r}"
    if key == "workflow.eval_gpus" and not use_gpu:
        return f"{key} is an evaluation task's GPU share with --use-gpu; this run uses CPUs"
    if key in ("search.shortlist_frequent", "search.shortlist_per_source") \
            and not cfg.search.shortlist and not pre.shortlist_per_source:
        return (f"{key} is read only with vocabulary selection, and this run searches the "
                "whole vocabulary: add data.shortlist_per_source=N (a lexical table of the "
                "run's data) or search.shortlist=FILE")
    if key == "train.passes_probe_updates" and not cfg.train.dropout_by_passes:
        return (f"{key} is the probe of the dropout table (train.dropout_by_passes), and "
                "this run has none")
    return None


def _set(changes, section: str, field: str) -> bool:
    """Whether `--set section.field=...` (or a --config file's own setting) is among
    `changes`."""
    return any(o.section == section and o.field == field for o in changes)


def float32_cpu_batches(cfg: WorkflowConfig, pre: PreprocessConfig, changes, use_gpu: bool,
                        precision: str) -> tuple[PreprocessConfig, str]:
    """`pre` with the preset's float32 CPU batch budget when the run will train in float32 on
    CPUs (the precision `precision` resolves to on this machine), and a line saying so; `pre`
    unchanged where the preset has none, on GPUs, in bf16, or under `--set data.max_tokens`
    (or a --config file's own max_tokens)."""
    n = cfg.float32_cpu_max_tokens
    if not n or use_gpu or n == pre.max_tokens or _set(changes, "data", "max_tokens"):
        return pre, ""
    from convs2s.precision import local_precision

    chosen = local_precision(precision, "cpu")  # (decided before torch loads)
    if chosen.name != "fp32":
        return pre, ""
    return pre.replace(max_tokens=n), (
        f"batches of {n:,} tokens, not {pre.max_tokens:,}: training in float32 on CPUs "
        f"({chosen.reason}); --set data.max_tokens=N to choose")


def language_and_split_flags(cfg: WorkflowConfig, opts: RunOptions, data_flag: str,
                             changes) -> list:
    """--src / --tgt / --split as data.* changes that follow `changes` (--set's, a --config
    file's): the flags apply on top. --split SPLIT=STEM changes one file stem of the --data
    DIR folder's splits (the preset's local_splits, or those --set data.splits gave)."""
    from workflows.overrides import Override

    if (opts.src or opts.tgt) and data_flag == "demo":
        raise SpecError("--src / --tgt: the demo corpus is English -> French (or document -> "
                        "summary); give your data with --data DIR (or hub)")
    if data_flag == "demo" and (o := next((o for o in changes if o.section == "data" and o.field
                                           in ("src_lang", "tgt_lang")), None)):
        # (its text would be labelled, cleaned, scored and named as another language)
        raise SpecError(f"{o.origin} {o.text}: the demo corpus is English -> French (or "
                        "document -> summary); give your data with --data DIR (or hub)")
    if opts.split and data_flag in ("hub", "demo"):
        raise SpecError(f"--split names file stems of a --data DIR folder, but the data is "
                        f"{data_flag!r}: add --data DIR")
    out = [Override("data", f"{side}_lang", lang, lang, f"--{side}")
           for side, lang in (("src", opts.src), ("tgt", opts.tgt)) if lang]
    if opts.split:
        # on the folder's splits as the changes before the flags left them: the last of
        # --set data.splits and --set workflow.local_splits (the preset's files when neither)
        given = [o.value for o in changes if (o.section, o.field) in
                 (("data", "splits"), ("workflow", "local_splits"))]
        splits = dict(given[-1] if given and isinstance(given[-1], dict) else cfg.local_splits)
        for item in opts.split:
            name, _, stem = item.partition("=")
            if name not in splits and name not in ("train", "valid", "test"):
                raise SpecError(f"--split {item}: no split {name!r}; the preset's splits are "
                                f"{', '.join(splits)} (add test sets with --test-set STEM)")
            splits[name] = stem
        out.append(Override("data", "splits", splits, " --split ".join(opts.split), "--split"))
    return out


# The BPE settings a fine-tuning run's data never uses: it is encoded with the checkpoint's
# vocabulary, and no BPE is learned (preprocessing.pipeline.run_pipeline)
BPE_SETTINGS = ("vocab_size", "spm_sample_pairs", "spm_seed", "character_coverage")


def _decided_by_checkpoint(changes) -> str | None:
    """Why settings in `changes` (--set, a --config file's) cannot apply with --init-from, or
    None: the checkpoint decides the model's shape (all but its dropout) and the vocabulary,
    so they would be listed as applied and ignored."""
    shape = [o for o in changes if o.section == "model" and o.field != "dropout"]
    bpe = [o for o in changes if o.section == "data" and o.field in BPE_SETTINGS]
    parts = [f"{', '.join(f'{o.origin} {o.text}' for o in shape)}: the model's shape comes "
             "from the checkpoint (of the model only model.dropout may change)"] if shape else []
    parts += [f"{', '.join(f'{o.origin} {o.text}' for o in bpe)}: the data is encoded with "
              "the checkpoint's vocabulary (no BPE is learned)"] if bpe else []
    if not parts:
        return None
    return "; ".join(parts) + f"; leave {'it' if len(shape) + len(bpe) == 1 else 'them'} " \
                              "out, or train from random weights without --init-from"


def _fine_tuned(path: str, preset_model: ModelConfig,
                pre: PreprocessConfig) -> tuple[str, ModelConfig]:
    """--init-from: the checkpoint folder (absolute) and the model to train, its architecture
    with the preset's dropout. Its text pipeline must read the data's languages."""
    from convs2s.io.checkpoint import CHECKPOINT_FILE, CheckpointError, load_checkpoint
    from convs2s.io.text_codec import CheckpointVocabulary, CodecError

    folder = location(path)
    if not (folder / CHECKPOINT_FILE).is_file():
        raise SpecError(f"--init-from {path}: no {CHECKPOINT_FILE} there; give a checkpoint "
                        "directory (a run's best/ or checkpoint_*, or the output of `python -m "
                        "convs2s import-fairseq`)")
    try:
        vocabulary = CheckpointVocabulary(folder)
        state = load_checkpoint(folder)
    except (CodecError, CheckpointError) as err:
        raise SpecError(f"--init-from {path}: {err}") from None
    languages = (pre.src_lang, pre.tgt_lang)
    if vocabulary.languages is not None and vocabulary.languages != languages:
        raise SpecError(f"--init-from {path}: the model translates "
                        f"{'->'.join(vocabulary.languages)} but the data is "
                        f"{'->'.join(languages)}; fine-tune it on data of its own direction")
    model = ModelConfig.from_dict(state["model_config"]).replace(dropout=preset_model.dropout)
    return str(folder), model
