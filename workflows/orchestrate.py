"""The command line of the paper-task workflows, and what it prints.

A workflow file (workflows/wmt14_en_fr.py, ...) only declares its settings: `paper()` and
`smoke()` return a `WorkflowConfig` (workflows/workflow_config.py), and its `__main__` calls

    sys.exit(main(PRESETS, __doc__))    # PRESETS = {"paper": paper, "smoke": smoke, ...}

which parses the run-level flags (`workflows.workflow_config.parse_args`: the README's flag
table; `--help` lists them all), resolves them with the preset once
(`workflows.run_spec.resolve` -> `RunSpec`, or `workflows.sweep.resolve_sweep` with `--sweep`),
runs it (`workflows.engine`) and prints the
scores and where to look in MLflow. Exit status: 0 done, 1 a sweep trial failed, 2 a bad
setting or input (one `error:` line), 3 training workers not placed (resumable), 130
interrupted (resumable).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from convs2s.metrics.task_kinds import task_kind
from convs2s.tracking.runs import experiment_id
from convs2s.tracking.redact import redact_uri
from storage.redact import redact_text
from convs2s.train.job import STOP_REASONS, WorkersNotPlaced
from storage import StorageError, is_uri
from storage.lease import LeaseHeld
from workflows.engine import WorkflowResult, run_workflow
from workflows.errors import SpecError
from workflows.run_spec import RunSpec, check_locations, resolve
from workflows.sweep import SweepResult, resolve_sweep, run_sweep
from workflows.workflow_config import RunOptions, WorkflowConfig, parse_args

log = logging.getLogger("workflows")


def main(presets: dict[str, Callable[[], WorkflowConfig]], doc: str | None = None,
         argv: list[str] | None = None, filter_console: bool | None = None) -> int:
    """Command-line entry of a workflow file: parse flags, run, print scores and MLflow links.
    With `filter_console` (default: when run as a command, argv None) Ray's known harmless
    console lines stay in its log files (workflows/console.py)."""
    opts = parse_args(argv, presets, doc)
    if not (argv is None if filter_console is None else filter_console):
        return _run_main(presets, opts)  # in-process (tests, notebooks): stderr as it is
    from storage.signals import command_signals
    from workflows.console import harmless_ray_lines_dropped

    # Both streams: Ray prints the raylet's pushed errors on stdout, its logs on stderr. A
    # Ctrl-C inside an import (torch's, Ray's) waits for it to end; one that lands in a
    # finalizer is sent again, not dropped.
    try:
        with harmless_ray_lines_dropped(2), harmless_ray_lines_dropped(1), command_signals():
            return _run_main(presets, opts)
    except KeyboardInterrupt:  # before the run began (its settings resolving): nothing to keep
        print("\ninterrupted", file=sys.stderr)
        return 130


def _run_main(presets: dict[str, Callable[[], WorkflowConfig]], opts: RunOptions) -> int:
    from preprocessing.errors import PreprocessError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    try:
        cfg = presets[opts.preset]() if opts.config is None else _load_config(opts, presets)
        if opts.dry_run and opts.format == "yaml":  # the run's settings: a --config file
            text = config_yaml(cfg, opts)
            if left := [f"--{f.replace('_', '-')}" for f in _given(opts) if f not in IN_FILE]:
                one = len(left) == 1
                print(f"note: {', '.join(left)} {'is' if one else 'are'} not in the file "
                      f"(run-level): give {'it' if one else 'them'} with --config as usual",
                      file=sys.stderr)
            print(redact_text(text), end="", flush=True)  # (a --set URI's credentials)
            return 0
        # Named now: an interrupted run is told how to resume.
        spec = resolve_sweep(cfg, opts) if opts.sweep else resolve(cfg, opts)
    except (SpecError, StorageError) as e:  # a bad --storage-path URI (credentials redacted;
        # a --set value quoted as given is redacted here)
        print(f"error: {redact_text(str(e))}", file=sys.stderr)
        return 2
    except PreprocessError as e:  # a sweep's rerun reads its trials' data sources
        return _data_error(e, cfg)
    if opts.dry_run:
        what = [t.spec.describe() for t in spec.trials] if opts.sweep else spec.describe()
        # (settings are shown as given: a URI with credentials in a --set, which a run refuses,
        # is shown without them)
        print(redact_text(json.dumps(what, indent=1, default=str)), flush=True)
        if not opts.sweep and (note := reuse_note(spec)):
            print(note, file=sys.stderr, flush=True)
        if not opts.sweep and (note := inputs_note(spec)):
            print(note, file=sys.stderr, flush=True)
        return 0
    _warn_if_job_tmp(opts)
    t0 = time.monotonic()
    try:
        check_locations(spec)  # unreachable buckets, missing credentials: before Ray starts
        if opts.sweep:
            result = run_sweep(spec)
            print(sweep_summary(result, time.monotonic() - t0), flush=True)
            return 1 if result.failed else 0
        result = run_workflow(spec)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (LeaseHeld, StorageError) as e:  # another command holds this run; no lease there
        print(f"error: {e}", file=sys.stderr)
        return 2
    except WorkersNotPlaced as e:  # a lost node not replaced: stopped, resumable
        print(f"error: {e}{restart_hint(opts)}", file=sys.stderr)
        return 3
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C; SIGTERM (Ray's driver handler exits)
        # Every stage writes whole files or none (manifests last), so what is on disk is
        # complete: the same run name picks up from there.
        where = spec.base.storage if opts.sweep else spec.storage
        print(f"\ninterrupted: finished stages are kept under {where}; resume with "
              f"the same --run-name {spec.run_name} and --storage-path {opts.storage_path}"
              f"{restart_hint(opts)}", file=sys.stderr, flush=True)
        return 130
    except PreprocessError as e:
        return _data_error(e, cfg)
    print(summary(spec, result, time.monotonic() - t0), flush=True)
    return 0


def inputs_note(spec) -> str | None:
    """What the dry run says of a run's local files (a --data folder's splits, a search
    dictionary or shortlist) the run would stop at before Ray starts, or None: a new language
    pair's folder checked by --dry-run passed, and the run then exited 2 (a wrong --tgt code, a
    test file missing). Files only: a hub or a bucket is not asked (a dry run contacts
    nothing)."""
    from preprocessing.errors import PreprocessError
    from workflows.engine import check_search_files, check_sources

    checks = [check_sources] if spec.data_flag not in ("hub", "demo") \
        and not is_uri(spec.data.source) else []
    if not any(is_uri(f) for f in (spec.search.dictionary, spec.search.shortlist) if f):
        checks.append(check_search_files)
    try:
        for check in checks:
            check(spec)
    except (SpecError, PreprocessError, StorageError) as err:
        return f"note: the run would stop before Ray starts: {redact_text(str(err))}"
    return None


def reuse_note(spec) -> str | None:
    """What the dry run says of a run name that exists already: the real run would resume or
    continue it, set it aside (--restart), or be refused (and why). None for a new run name.
    (Its record is read; a hub's inputs are resolved, as the run would: a failure is said, not
    raised.)"""
    from workflows.run_state import reuse_problem

    try:
        exists = (spec.run_dir / "workflow.json").is_file()
    except Exception as err:  # noqa: BLE001 - (an unreachable bucket: said, not raised)
        return (f"note: could not tell whether run {spec.run_name!r} exists (its storage did "
                f"not answer: {err}); the run checks it before Ray starts")
    if not exists:
        return None
    try:
        if spec.restart:
            return (f"note: run {spec.run_name!r} exists: --restart sets its training and "
                    "scores aside and trains it over")
        problem = reuse_problem(spec)
    except Exception as err:  # noqa: BLE001 - a dry run starts nothing, fails on nothing
        return f"note: run {spec.run_name!r} exists; its record could not be compared: {err}"
    if problem:
        return f"note: this command would be refused: {problem}"
    return (f"note: run {spec.run_name!r} exists with these settings: this command goes on "
            "with it (finished stages skipped, training resumed or continued)")


def restart_hint(opts) -> str:
    """What a resume line adds after a --restart run stopped: the same command again would
    set the training this run made aside and train from update 0 (--restart always starts
    over, whatever the settings)."""
    return ("; leave out --restart, which would set this run's training aside again and "
            "start over" if opts.restart else "")


def _data_error(e: Exception, cfg: WorkflowConfig) -> int:
    """A data source that cannot be read: one error line and the workflow's --data hint, exit
    2. (The preprocessing CLI's fixes name its own flags, --source, --split: this command's
    are in the hint.)"""
    from preprocessing.errors import unwrap_ray_error
    from preprocessing.sources import NO_HUB_HINT

    found = unwrap_ray_error(e) or e
    text = getattr(found, "fact", None) or str(found)
    print(f"error: {text.replace(NO_HUB_HINT, '').strip()}", file=sys.stderr)
    print("hint: this workflow reads its data with --data: `--data demo` runs on the "
          "embedded demo corpus (no network); `--data DIR` reads a local folder with "
          f"{_stems(cfg)} (text files <stem>.<lang>, .tsv, .jsonl or hub-like parquet).",
          file=sys.stderr)
    return 2


@dataclass(frozen=True)
class MlflowLinks:
    """Where a run is seen in the MLflow UI: a local sqlite store through `mlflow ui` on port
    5000 (the command to start it first), a tracking server at its own address."""

    tracking_uri: str
    experiment_id: str | None
    ML = "?workflowType=machine_learning"  # the UI's "Model training" side, not GenAI

    @property
    def base(self) -> str:
        if self.tracking_uri.startswith("sqlite:///"):
            return "http://127.0.0.1:5000"
        return redact_uri(self.tracking_uri).rstrip("/")

    def command(self) -> list[str]:
        """The `mlflow ui` line for a local store, nothing for a server."""
        if self.tracking_uri.startswith("sqlite:///"):
            return [f"  mlflow ui --backend-store-uri {self.tracking_uri} --port 5000"]
        return []

    def page(self, what: str) -> str:  # "runs" | "models" of the experiment
        return f"{self.base}/#/experiments/{self.experiment_id}/{what}{self.ML}"

    def run(self, run_id: str) -> str:
        return f"{self.base}/#/experiments/{self.experiment_id}/runs/{run_id}{self.ML}"

    def compare(self, run_ids: list[str]) -> str:
        return (f"{self.base}/#/compare-runs?runs={json.dumps(run_ids, separators=(',', ':'))}"
                f"&experiments={json.dumps([self.experiment_id])}")


def sweep_summary(r: SweepResult, seconds: float) -> str:
    """The sweep's table, what was skipped or failed, and where to compare the trials."""
    s = r.sweep
    lines = ["", f"==== sweep {s.run_name} ({s.sweep} on {s.base.workflow} {s.base.preset}) "
                 f"done in {seconds / 60:.1f} min ====", r.table]
    if r.skipped:
        lines.append(f"skipped (finished earlier): {', '.join(r.skipped)}")
    if r.failed:
        lines.append(f"{len(r.failed)} trial(s) failed; rerun the same command to run them "
                     "again (finished trials are skipped)")
    lines.append(f"outputs: {s.folder} (summary.md, one folder per trial)")
    if r.run_id is None:
        lines.append(f"MLflow: tracking at {redact_uri(r.tracking_uri)} was unavailable")
        return "\n".join(lines)
    exp_id = experiment_id(r.tracking_uri, s.base.experiment)
    lines.append(f"MLflow: experiment {s.base.experiment!r}, sweep run {s.run_name!r} (id "
                 f"{r.run_id}) with one child run per trial; select them and press Compare")
    ui = MlflowLinks(r.tracking_uri, exp_id)
    lines += ui.command()
    if exp_id is not None:
        lines.append(f"  sweep:   {ui.run(r.run_id)}")
        ids = [m["run_id"] for t in s.trials if (m := r.results.get(t.name)) and m.get("run_id")]
        if ids:  # every finished trial's workflow run, side by side
            lines.append(f"  compare: {ui.compare(ids)}")
    return "\n".join(lines)


def _load_config(opts: RunOptions, presets: dict[str, Callable[[], WorkflowConfig]]
                 ) -> WorkflowConfig:
    """--config FILE: the preset from a YAML / JSON file (`config_yaml` writes one), its values
    checked as --set checks one; the run is labelled with the file's stem as its preset. The
    file names the preset it was written from (`preset:`): its settings that differ from it,
    and those it lists under `explicit:`, count as set on purpose, as with --set (in
    `opts.config_settings`, workflows.overrides.file_settings)."""
    import yaml

    from storage.settings import load_yaml, yaml_error
    from workflows import overrides

    path = Path(opts.config).expanduser()
    where = f"--config {opts.config}:"
    try:
        doc = load_yaml(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("the file holds no mapping of settings")
        doc = dict(doc)
        base, explicit = doc.pop("preset", None), doc.pop("explicit", None) or []
        if base in presets:  # a setting the file leaves out is the preset's, not a default's
            doc = _over(presets[base]().to_dict(), doc)
        cfg = WorkflowConfig.from_dict(doc)
    except OSError as err:
        raise SpecError(f"--config {opts.config}: cannot read it ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise SpecError(f"{where} {yaml_error(err)}") from None
    except (ValueError, TypeError, KeyError) as err:
        raise SpecError(f"{where} {str(err).splitlines()[0]}") from None
    if base not in presets:  # (the file could not tell a setting changed on purpose)
        raise SpecError(f"{where} " + (f"preset: {base!r} names no preset of this workflow"
                                       if base is not None else "no preset: line")
                        + f"; name the preset the file starts from ({', '.join(sorted(presets))})"
                        ", as --dry-run --format yaml writes it")
    if opts.preset_flag not in (None, base):  # (the file's preset was run, the flag's ignored)
        raise SpecError(f"--preset {opts.preset_flag} with --config {opts.config}, whose "
                        f"settings start from preset {base!r}: leave --preset out (the file "
                        "names its preset), or run --preset alone")
    opts.config_settings = tuple(overrides.file_settings(cfg, presets[base](), explicit, where))
    opts.config_preset, opts.preset, opts.config_base = base, path.stem, presets[base]()
    return cfg


def _over(preset: dict, doc: dict) -> dict:
    """The preset's settings (`WorkflowConfig.to_dict`) with a --config file's over them,
    section by section: a short file changes what it names and keeps the rest of its preset
    (its left-out settings were the dataclasses' defaults: a Gigaword file without min_len
    searched with 1, not the preset's 14, counted as set on purpose)."""
    from workflows.overrides import FILE_SECTIONS

    out = dict(preset)
    for key, value in doc.items():  # (a mapping setting, test_sets or local_splits: whole, as
        # a --set gives it)
        out[key] = ({**preset[key], **value} if key in FILE_SECTIONS and isinstance(value, dict)
                    and isinstance(preset.get(key), dict) else value)
    return out


# The run-level flags that are settings of the preset, and the setting each is in a --config
# file (--data is the file's `data:`)
FLAG_SETTINGS = {"src": "preprocess.src_lang", "tgt": "preprocess.tgt_lang",
                 "split": "local_splits", "num_workers": "num_workers", "use_gpu": "use_gpu",
                 "max_epochs": "train.max_epochs", "max_updates": "train.max_updates",
                 "max_time": "train.max_time", "precision": "train.precision",
                 "update_freq": "train.update_freq"}
IN_FILE = {*FLAG_SETTINGS, "data", "preset", "config", "set"}


def _given(opts: RunOptions) -> list[str]:
    """The RunOptions fields the command line gave (other than their defaults)."""
    default = RunOptions()
    return [f.name for f in dataclasses.fields(opts)
            if f.name not in ("dry_run", "format", "config_preset", "config_settings",
                              "preset_flag", "config_base")
            and getattr(opts, f.name) != getattr(default, f.name)]


def config_yaml(cfg: WorkflowConfig, opts: RunOptions) -> str:
    """The run `opts` asks of the preset `cfg` (checked as the run is: `resolve`) as the YAML
    file `--config` reads back: --set applied, and the flags that are settings (`--data`,
    FLAG_SETTINGS: languages, splits, workers, limits); the other run-level flags (--run-name,
    --storage-path, --test-set, ...) are given as usual. It names the preset (a --config file's
    own) and lists the settings set on purpose (each --set and flag, and a --config file's
    own), so that it resolves to the same run."""
    import yaml

    from workflows import overrides
    from workflows.run_spec import language_and_split_flags

    spec = resolve(cfg, opts)
    sets = overrides.parse(opts.set)
    changes = [*opts.config_settings, *sets]
    flags = language_and_split_flags(cfg, opts, spec.data_flag, changes)
    if not any((o.section, o.field) == ("data", "splits") for o in changes):
        flags = [o for o in flags if o.field != "splits"]  # the folder's stems: local_splits
    cfg = overrides.apply(cfg, [*sets, *flags])
    limits = {k: getattr(spec.train, k) for k in ("max_epochs", "max_updates", "max_time",
                                                  "precision")}
    cfg = cfg.replace(
        # a paper task in the other direction is named as its run is (wmt14_fr_en)
        name=cfg.name if "{src}" in cfg.name else spec.workflow, data=spec.data.source,
        preprocess=overrides.apply_data(cfg.preprocess, [*sets, *flags]),
        local_splits={**cfg.local_splits, **dict(s.partition("=")[::2] for s in opts.split)},
        # (a split given another file is named after it: the file's local_splits are its)
        test_sets={split: spec.test_sets[split] for split in cfg.test_sets}
        if spec.data_flag != "demo" else cfg.test_sets,
        train=cfg.train.replace(update_freq=opts.update_freq or cfg.train.update_freq, **limits),
        num_workers=spec.num_workers, use_gpu=spec.use_gpu)
    sections = {v: k for k, v in overrides.FILE_SECTIONS.items()}
    given = [f for f in _given(opts) if f in FLAG_SETTINGS or f == "data"]
    explicit = list(dict.fromkeys(
        [f"{sections[o.section]}.{o.field}" if o.section in sections else o.field
         for o in [*opts.config_settings, *sets]]
        + [FLAG_SETTINGS[f] for f in given if f in FLAG_SETTINGS]))
    head = (f"# {spec.workflow}: preset {opts.preset}"
            + (f", with --set {' --set '.join(opts.set)}" if opts.set else "")
            + (f", with {', '.join('--' + f.replace('_', '-') for f in given)}" if given else "")
            + "\n# run it with: --config THIS_FILE; the run-level flags that are not settings "
              "(--run-name,\n# --storage-path, --tracking-uri, --test-set, ...) as usual. A "
              "setting that differs\n# from the preset named here, or is listed under explicit, "
              "counts as set on purpose,\n# as with --set: kept on the demo corpus (--data "
              "demo), over the preset's update plan\n# (update_tokens) and float32 CPU batch "
              "size (float32_cpu_max_tokens)\n")
    doc = {"preset": opts.config_preset or opts.preset, "explicit": explicit, **cfg.to_dict()}
    return head + yaml.safe_dump(doc, sort_keys=False)


def _stems(cfg: WorkflowConfig) -> str:
    return ", ".join(f"{split}={stem}" for split, stem in cfg.local_splits.items())


def _warn_if_job_tmp(opts: RunOptions) -> None:
    """Under `ray job submit` the working directory is a temporary copy of the checkout."""
    if os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") and not is_uri(opts.storage_path) \
            and not Path(opts.storage_path).is_absolute():
        log.warning("running as a Ray job with a relative --storage-path: outputs go to the "
                    "job's temporary working directory %s; give an absolute --storage-path "
                    "and --tracking-uri to keep them", Path.cwd())


def summary(spec: RunSpec, r: WorkflowResult, seconds: float) -> str:
    """Scores per test set and job, then where to look in MLflow."""
    kind = task_kind(spec.task_kind)
    keys = kind.shown
    # Columns as wide as their longest entry (test set names like test_2016_flickr included).
    w_test = max([len("test set")] + [len(s.test_set) for s in r.scores]) + 2
    w_job = max([len("job")] + [len(s.job) for s in r.scores]) + 2
    w_num = max(len(k) for k in keys) + 2
    lines = ["", f"==== {spec.workflow} ({spec.preset}) done in {seconds / 60:.1f} min ====",
             f"{'test set':<{w_test}}{'job':<{w_job}}" + "".join(f"{k:>{w_num}}" for k in keys)]
    for s in r.scores:
        lines.append(f"{s.test_set:<{w_test}}{s.job:<{w_job}}"
                     + "".join(f"{s.metrics.get(k, float('nan')):>{w_num}.2f}" for k in keys)
                     + ("   (scored earlier)" if s.skipped else ""))
    if kind.note:
        lines.append(kind.note)
    if spec.init_from:
        lines.append(f"fine-tuned from {spec.init_from} (its architecture and vocabulary)")
    for t in r.train:
        m = t.metrics
        if m.get("stop_reason"):
            lines.append(f"{Path(t.run_dir).name}: {m.get('update', 0):,} updates, "
                         f"{m.get('epochs', m.get('epoch', 0)):g} epochs, "
                         f"{m.get('train_seconds', 0) / 60:.1f} min of training"
                         + (f" in {m['precision']}" if m.get("precision") else "")
                         + "; stopped: "
                         f"{STOP_REASONS.get(m['stop_reason'], m['stop_reason'])}")
    if r.skipped:
        lines.append(f"skipped (finished earlier): {', '.join(r.skipped)}")
    lines.append(f"outputs: {r.run_dir}")
    if r.parent_run_id is None:  # the tracking server was down: say where everything went
        lines.append(f"MLflow: tracking at {redact_uri(r.tracking_uri)} was unavailable; "
                     "training metrics "
                     f"are in {r.run_dir}/train*/metrics.jsonl and the scores in "
                     f"{r.run_dir}/workflow.json")
        return "\n".join(lines)
    lines.append(f"MLflow: experiment {r.experiment!r}, parent run {Path(r.run_dir).name!r} "
                 f"(id {r.parent_run_id}) with child runs preprocess, train*, eval/*")
    exp_id = experiment_id(r.tracking_uri, r.experiment)
    ui = MlflowLinks(r.tracking_uri, exp_id)
    lines += ui.command()
    if exp_id is not None and r.parent_run_id:
        ids = [r.parent_run_id] + [s.run_id for s in r.scores if s.run_id]
        lines += [f"  runs:    {ui.page('runs')}", f"  models:  {ui.page('models')}",
                  f"  run:     {ui.run(r.parent_run_id)}", f"  compare: {ui.compare(ids)}"]
    c = r.champion
    if c is not None:
        if c.moved:
            test = (f"; {c.reported:.2f} on {c.reported_on}" if c.reported is not None
                    else "")
            lines.append(f"best model: {c.job} ({c.metric} {c.value:.2f} on {c.test_set}, "
                         f"the validation set it is chosen on{test}) is {c.uri} (version "
                         f"{c.version}): {c.reason}; serve it with")
        else:
            lines.append(f"best model: {c.uri} stays version {c.version}: {c.reason}"
                         + ("; serve it with" if c.version != "none" else ""))
        if c.moved or c.version != "none":
            lines.append(f"  MLFLOW_TRACKING_URI={redact_uri(r.tracking_uri)} mlflow models "
                         f"serve -m {c.uri} --env-manager local -p 5001")
            lines.append(f"  or, batching concurrent requests on Ray Serve: python -m convs2s "
                         f"serve --model {c.uri} --tracking-uri {redact_uri(r.tracking_uri)}")
    return "\n".join(lines)
