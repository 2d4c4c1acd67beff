"""Sweeps of whole workflow runs on Ray Tune: the paper's §5.4-§5.6 analysis as one command.

    python workflows/multi30k_en_de.py --preset cpu --data ../shared/data/multi30k \\
        --sweep paper-5.2 --seeds 2 --max-time 6m

A sweep is a named set of model variants of the workflow's preset (workflows/ablations.py)
times `--seeds` seeds; each (variant, seed) is a *trial*: a whole workflow run (the preset's
data, the variant's model, seed `seed + k`, the same budget as every other trial: train, then
score the best checkpoint on the preset's test sets). Trials run as Ray Tune trials (Ray Train
V2's pattern: a Tune function trial that launches the run's own `TorchTrainer`), as many at
once as the cluster has room for (`concurrency`; one at a time on a 2-CPU machine), each
training run placed with its own resources by Ray Train. A trial that a local Ray (no
RAY_ADDRESS) cannot hold at all is refused before the first; a cluster may still add nodes.

Where it goes (`--storage-path`, `--run-name`, default `<sweep>-<date>-<time>`):

    <storage>/preprocessed/...                 the data, prepared once before the trials
    <storage>/<sweep run>/<variant>-seed<s>/   each trial's workflow run (train/, eval/, ...)
                          .../trial.json       written when the trial finished
    <storage>/<sweep run>/tune/                Ray Tune's experiment folder
    <storage>/<sweep run>/summary.md, .json    the table below

MLflow: one run for the sweep (named `--run-name`, tag `convs2s.sweep`), and under it each
trial's workflow run with `sweep.variant`, `sweep.seed` and `sweep.changes` (the settings the
variant changed) as params beside the whole run spec, and its scores; the sweep run holds the
summary as an artifact and per-variant means and spreads as metrics (workflows/sweep_summary.py:
`<variant>/valid_ppl_mean`, `<variant>/<test set>_bleu_sd`, `<variant>/n`).
Selecting the trials in MLflow's runs table and pressing Compare lines them up.

Rerunning the same sweep (same --run-name and --storage-path) skips every trial whose
trial.json matches its settings, budget and test sets, continues an interrupted one from its
latest checkpoint (the workflow run's own resume), and runs the rest; a failed trial is reported
and the others go on. A larger budget continues every trial. A finished trial whose test sets
changed (one added with --test-set, a test file edited) runs again: its training is kept and
only the test sets not scored on that text yet are scored (the workflow run's own resume).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from dataclasses import dataclass, field

from storage.signals import callers_signal_handlers, sigterm_as_ctrl_c
from storage.ray_join import never_grows
from convs2s.metrics.task_kinds import task_kind
from storage import location, write_whole
from storage.lease import RunLease
from convs2s.config import keep_explicit_dropout
from workflows.ablations import (CUSTOM, SweepError, Variant, custom_variants,
                                 trial_owned_problem, variants_for)
from workflows.cluster import no_room, workers_fit
from workflows.engine import check, check_inputs, prepare, run_stages, source_tags, training_figures
from workflows.run_spec import RunSpec, resolve
from workflows.run_state import budgets, changed_settings, digest, result_settings, reuse_problem
from workflows.run_tree import RunTree
from workflows.sweep_summary import budget_text, log_summary, summary_table, sweep_params
from workflows.workflow_config import EnsembleConfig, RunOptions, WorkflowConfig

log = logging.getLogger("workflows")

# What a trial's driver (the Tune actor that runs the workflow's stages) reserves: memory for
# the workflow's state, no CPU. Its training workers and evaluation tasks ask for their own
# CPUs / GPUs; a CPU held by the driver would leave a 2-CPU node unable to place a 2-thread
# training worker. (A Tune trial needs some resource: an all-zero request is refused.)
TRIAL_DRIVER_MEMORY = 256 * 2**20
SCORED_JOB = "best"  # each trial scores its best checkpoint (the paper compares single models)


@dataclass(frozen=True)
class Trial:
    name: str  # "<variant>-seed<seed>": the trial's run folder and MLflow run name
    variant: Variant
    seed: int
    spec: RunSpec  # the trial's whole workflow run
    # the settings the trial runs with otherwise than the preset, its seed aside
    # ("<section>.<field>": value)
    changes: dict[str, str]

    @property
    def key(self) -> str:
        """What makes a finished trial the same: its run's settings and budget."""
        return digest({"settings": result_settings(self.spec), "budgets": budgets(self.spec)})

    @property
    def keys_before(self) -> tuple[str, ...]:
        """The key as trials recorded it before 2026-12-07, where it differs: with a hub
        dataset's revision name among the settings (a finished trial of then stays finished)."""
        if self.spec.data.source != "hub":
            return ()
        return (digest({"settings": result_settings(self.spec, named_revision=True),
                        "budgets": budgets(self.spec)}),)

    @functools.cached_property
    def tests(self) -> dict[str, str]:
        """{test set name: digest of its input's identity (a hub commit, or each file's path,
        size and modification time, as preprocessing resolves them)}: what the trial scores.
        Test sets are not in `key` (the run's settings leave them out: evaluation re-scores an
        edited one). Read once, before the trial runs (the driver's copy travels to Ray Tune):
        a file edited while the trial scores is scored again on the next rerun."""
        from preprocessing.sources import resolve_split

        return {name: digest(resolve_split(self.spec.data, split).fingerprint)
                for split, name in self.spec.test_sets.items()}

    @property
    def record(self):
        return self.spec.run_dir / "trial.json"

    def recorded(self) -> dict | None:
        """trial.json when the trial finished under the same settings and budget, else None."""
        if not self.record.is_file():
            return None
        rec = json.loads(self.record.read_text())
        if rec.get("key") in (self.key, *self.keys_before):
            return rec
        # the same settings but for a field only one side names (one a newer version of the
        # code added, with the earlier behaviour as its default: the key changed with it, and
        # every finished trial ran again after a code update), and the same budget
        if isinstance(rec.get("settings"), dict) and rec.get("budgets") == budgets(self.spec) \
                and not changed_settings(rec["settings"], result_settings(self.spec)):
            return rec
        return None

    @property
    def scoring(self) -> int:
        """The version of its task kind's scoring (convs2s/metrics/task_kinds.py)."""
        from convs2s.metrics.task_kinds import task_kind

        return task_kind(self.spec.task_kind).scoring_for(self.spec.data.tgt_lang)

    def finished(self) -> dict | None:
        """The trial's recorded result when it finished under the same settings and budget and
        scored the same test sets (names and inputs) with this scoring, drawing as many
        attention pictures as asked (--attention; a larger one re-scores), else None. (A record
        from before test sets were recorded does not say what it scored, nor one of another
        scoring how: the trial runs again, which only scores what its run has not scored on
        that text with this scoring.)"""
        tests = self.tests  # read (and kept) with or without a record: what it will name
        rec = self.recorded()
        return rec if rec is not None and rec.get("tests") == tests \
            and rec.get("scoring", 1) == self.scoring \
            and rec.get("attention", 0) >= self.spec.attention else None

    def write_record(self, metrics: dict) -> None:
        """trial.json: the trial finished with `metrics` under its settings, budget and test
        sets."""
        # Whole or not at all (a trial is finished or not): renamed over on a local disk, one
        # PUT in a bucket, where no file can be renamed.
        write_whole(self.record, json.dumps(
            {"key": self.key, "tests": self.tests, "trial": self.name, "scoring": self.scoring,
             "attention": self.spec.attention, "metrics": metrics,
             "settings": result_settings(self.spec), "budgets": budgets(self.spec)},
            indent=1).encode())


@dataclass(frozen=True)
class SweepSpec:
    sweep: str  # the sweep's name in workflows.ablations.SWEEPS
    run_name: str
    base: RunSpec  # the preset's run: data, budget, resources; each trial varies it
    variants: list[Variant]
    seeds: list[int]
    trials: list[Trial]
    concurrency: int | None = None  # trials at once; None: as many as the cluster fits

    @property
    def folder(self):  # a Path, or an ObjectPath in a bucket
        return location(self.base.storage) / self.run_name


@dataclass
class SweepResult:
    sweep: SweepSpec
    run_id: str | None  # the sweep's MLflow run
    tracking_uri: str
    results: dict[str, dict] = field(default_factory=dict)  # trial name -> metrics
    skipped: list[str] = field(default_factory=list)  # finished by an earlier invocation
    failed: dict[str, str] = field(default_factory=dict)  # trial name -> error
    table: str = ""


# --- resolving: every trial decided before Ray starts -------------------------------------------


def resolve_sweep(cfg: WorkflowConfig, opts: RunOptions) -> SweepSpec:
    """The sweep `opts` asks of the preset `cfg`; a SweepError names the flag to fix."""
    if opts.seeds < 1:
        raise SweepError(f"--seeds {opts.seeds}: give the number of seeds per variant (>= 1)")
    if opts.init_from:
        raise SweepError("--init-from fixes the model's architecture, which a sweep varies; "
                         "sweep from random weights (leave --init-from out)")
    if opts.restart:
        raise SweepError("--restart applies to one workflow run; give the sweep a new "
                         "--run-name to run it over")
    from workflows import overrides

    # The ensemble settings each trial runs with are the sweep's (below): shown as applied
    # and replaced unseen otherwise
    if problem := trial_owned_problem(opts.sweep, [*opts.config_settings,
                                                   *overrides.parse(opts.set)]):
        raise SweepError(problem)
    run_name = opts.run_name or f"{opts.sweep}-{time.strftime('%Y%m%d-%H%M%S')}"
    # (the trials' ensemble from the start: the preset's average of 5 refused a --set
    # train.keep_last=2, which no trial averages)
    cfg = cfg.replace(ensemble=EnsembleConfig(runs=1, average_last=0))
    base = resolve(cfg, dataclasses.replace(opts, run_name=run_name))
    # Seeds are the sweep's; each trial scores its best checkpoint (single models, as the
    # paper's tables): no ensemble members or averages inside a trial.
    base = base.replace(ensemble=EnsembleConfig(runs=1, average_last=0),
                        register_champion=False)
    if opts.sweep == CUSTOM:
        variants = custom_variants(opts.variant)
    else:
        variants = variants_for(opts.sweep, base.model, opts.variants or None)
    seeds = [base.train.seed + k for k in range(opts.seeds)]
    folder = location(base.storage) / run_name
    if (folder / "workflow.json").is_file():
        raise SweepError(f"{folder} holds a workflow run named {run_name!r}, not a sweep: give "
                         "the sweep another --run-name")
    trials = []
    for v in variants:
        vbase = base
        if v.sets:  # --set lists: the preset with the sweep's own --set and the variant's
            vbase = resolve(cfg, dataclasses.replace(
                opts, run_name=run_name, set=[*opts.set, *v.sets])).replace(
                ensemble=base.ensemble, register_champion=False)
            changes = _changed(base, vbase)
            if not changes:
                raise SweepError(f"--variant {v.name}: {v.label} changes nothing in the "
                                 f"preset; drop it or change another setting")
        for seed in seeds:
            name = f"{v.name}-seed{seed}"
            model = v.apply(vbase.model)
            train = keep_explicit_dropout(vbase.train.replace(seed=seed),
                                          vbase.model.dropout, model.dropout)
            spec = vbase.replace(model=model, train=train, run_name=name,
                                 storage=str(folder))
            # every setting the trial runs with otherwise than the preset, the seed aside (a
            # named variant's dropout also drops the preset's dropout_by_passes, which the
            # trial's params, log line and summary left out: recorded only by a custom one)
            changes = _changed(base, spec.replace(train=train.replace(seed=base.train.seed),
                                                  run_name=base.run_name,
                                                  storage=base.storage))
            trials.append(Trial(name, v, seed, spec, changes))
    same: dict = {}  # two variants that run the same settings: the second's trials wasted
    for t in trials:
        other = same.setdefault(tuple(sorted(t.changes.items())), t.variant.name)
        if other != t.variant.name:
            raise SweepError(f"--variant {t.variant.name} runs the same settings as "
                             f"{other} ({'; '.join(f'{k}={v}' for k, v in t.changes.items())}"
                             "): drop one of them")
    for t in trials:  # a trial folder holding a run under other settings: before anything
        if problem := reuse_problem(t.spec, trial=True):
            raise SweepError(f"sweep {run_name!r}, trial {t.name}: {problem}")
    if opts.concurrent_trials is not None and opts.concurrent_trials < 1:
        raise SweepError(f"--concurrent-trials {opts.concurrent_trials}: give a positive number")
    return SweepSpec(opts.sweep, run_name, base, variants, seeds, trials,
                     opts.concurrent_trials)


def _changed(base: RunSpec, other: RunSpec) -> dict[str, str]:
    """{"<section>.<field>": value} of every setting `other` runs with another value than
    `base` (what a custom variant's --set changed), as the trial's run shows them."""
    from convs2s.tracking.runs import flatten_params

    a = flatten_params(base.params()["workflow"])
    b = flatten_params(other.params()["workflow"])
    return {k: b[k] for k in sorted(b) if b[k] != a.get(k) and k != "overrides"}


def concurrency(sweep: SweepSpec, nodes: list[dict], todo: int | None = None,
                warn: bool = True) -> int:
    """Trials at once: how many trials' training workers the cluster's alive nodes
    (`ray.nodes()`) hold side by side (`--concurrent-trials` decides when given), at least 1:
    on a cluster (RAY_ADDRESS, or one this process joined) its autoscaler may add the nodes a
    trial waits for. A local Ray (`ray_join.never_grows`) cannot grow: where not even one
    trial fits, a SweepError names the need and the fix (each
    trial would wait CONVS2S_PLACEMENT_WAIT_S for its workers, then fail)."""
    b = sweep.base
    todo = len(sweep.trials) if todo is None else todo  # the trials still to run
    fit = workers_fit(b, nodes) // b.num_workers
    if not fit and never_grows():
        raise SweepError(_no_trial_fits(sweep, nodes))
    if sweep.concurrency and never_grows() and min(sweep.concurrency, todo) > fit:
        raise SweepError(
            f"--concurrent-trials {sweep.concurrency}: this machine's Ray holds the training "
            f"workers of {fit} trial(s) at a time ({b.num_workers} worker(s) each; a local "
            f"Ray never grows: the others would wait {_placement_wait_s():.0f} s for room, "
            f"then fail); give --concurrent-trials {fit}, or leave it out")
    if sweep.concurrency:
        return sweep.concurrency
    n = int(max(1, min(fit, todo)))
    if warn and n < todo and not never_grows():  # (Ray Tune's waiting trials ask its autoscaler
        # for nothing: the trials run n at a time however far the cluster could grow)
        log.warning("the cluster holds the training workers of %d trial(s) now, so the %d "
                    "trials run %d at a time; --concurrent-trials N runs N at once (the "
                    "autoscaler then adds the nodes they wait for)", fit, todo, n)
    return n


def _placement_wait_s() -> float:
    """How long Ray Train waits for room for a run's workers (CONVS2S_PLACEMENT_WAIT_S)."""
    from workflows.steps import PLACEMENT_WAIT_S

    return PLACEMENT_WAIT_S


def _no_trial_fits(sweep: SweepSpec, nodes: list[dict]) -> str:
    return no_room(sweep.base, nodes, f"--sweep {sweep.sweep}: each trial trains",
                   "no trial could start (a local Ray never grows; each would wait for room, "
                   "then fail)", "the sweep")


# --- running ------------------------------------------------------------------------------------


def run_sweep(sweep: SweepSpec) -> SweepResult:
    """Prepare the data once, run every trial not finished yet on Ray Tune, then summarize
    (table, MLflow metrics and artifacts). The sweep folder's lease is held throughout."""
    base = sweep.base
    check(base, sweep=True)  # writes nothing: a refused sweep leaves no folder behind
    seen = {digest(base.describe())}  # each variant's inputs too: a custom variant's --set
    for t in sweep.trials:  # may name other files, found missing only after its training
        if (d := digest(t.spec.replace(run_name=base.run_name, storage=base.storage,
                                       train=base.train, model=base.model).describe())) \
                not in seen:
            seen.add(d)
            check_inputs(t.spec)
    # (inner: a workflow run by hand in a trial's folder, or a `convs2s train` in a trial's
    # train/; outer: a --storage-path that is another command's run folder, a workflow's, whose
    # lease covers what is in it)
    with RunLease(sweep.folder, inner=2, outer=base.storage,
                  command=f"{base.workflow} {base.preset} --sweep {sweep.sweep}") as lease:
        prepare(base, sweep=True)  # Ray, storage and GPUs, as for one workflow run
        if todo := sum(t.finished() is None for t in sweep.trials):
            import ray

            # Before the sweep's MLflow run and the data: where no trial fits a local Ray,
            # one line (each trial would otherwise wait for room, then fail)
            concurrency(sweep, ray.nodes(), todo, warn=False)  # (said as it starts them)
        with sigterm_as_ctrl_c():  # (after Ray's start, which installs Ray's own handler)
            return _run_sweep(sweep, lease.ref())


def _run_sweep(sweep: SweepSpec, lease=None) -> SweepResult:
    """The sweep's trials (`lease`: the sweep folder's, which their training checks)."""
    from convs2s.tracking.runs import (end_run, log_artifacts, log_final_metrics, set_tags,
                                       stopped_status)
    from preprocessing.pipeline import run_pipeline

    base = sweep.base
    uri = base.tracking_uri
    # The sweep's run, the root of its trials' run trees (each trial's parent is its child).
    tree = RunTree.open(uri, base.experiment, sweep.folder, sweep.run_name,
                        tags={"convs2s.sweep": sweep.sweep, "convs2s.sweep.run": sweep.run_name,
                              "convs2s.stage": "sweep",
                              "convs2s.workflow": base.workflow, "convs2s.preset": base.preset,
                              **source_tags(base)})
    run_id = tree.parent
    tree.describe(run_id, sweep_params(sweep))  # (a param keeps its first invocation's value)
    set_tags(uri, run_id, {"convs2s.sweep.invocation": (
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}: variants "
        f"{','.join(v.name for v in sweep.variants)}; seeds {','.join(map(str, sweep.seeds))}; "
        f"{budget_text(base)}; the metrics and summary are this invocation's trials")})
    result = SweepResult(sweep, run_id, uri)
    try:
        log.info("== sweep %s (%s): %d variants x %d seeds = %d trials", sweep.run_name,
                 sweep.sweep, len(sweep.variants), len(sweep.seeds), len(sweep.trials))
        rescore = []
        for t in sweep.trials:
            if (rec := t.finished()) is not None:
                result.results[t.name] = rec["metrics"]
                result.skipped.append(t.name)
            elif t.recorded() is not None:
                rescore.append(t.name)
        if result.skipped:
            log.info("== sweep: %d trial(s) finished earlier, skipped: %s",
                     len(result.skipped), ", ".join(result.skipped))
        if rescore:
            log.info("== sweep: %d trial(s) finished earlier on other test sets or test files, "
                     "with fewer attention pictures (--attention) or before test sets were "
                     "recorded, run again to score them (their training is kept): %s",
                     len(rescore), ", ".join(rescore))
        todo = [t for t in sweep.trials if t.name not in result.results]
        if todo:
            # The data once, before the trials: they find it prepared (a custom variant that
            # changes data.* prepares its own in its trials, its seeds maybe at once: each
            # stage is published whole, so that only repeats work).
            run_pipeline(base.data)
            ran, failed = _run_on_tune(sweep, todo, tree, lease)
            result.results.update(ran)
            result.failed.update(failed)
        result.table = summary_table(sweep, result.results, result.failed)
        log_summary(sweep, result, uri, run_id, log_final_metrics, log_artifacts)
    except BaseException as err:
        # the sweep's run, and the runs of any trial stopped before its workflow ended them
        tree.end_open(stopped_status(err))
        raise
    end_run(uri, run_id, "FAILED" if result.failed else "FINISHED")
    return result


def _run_on_tune(sweep: SweepSpec, todo: list[Trial], tree: RunTree,
                 lease=None) -> tuple[dict, dict]:
    """Run `todo` as Ray Tune trials; ({trial: metrics}, {trial: error}). A crashed trial's
    runs are marked FAILED. A sweep that Ray Tune stopped (its handler takes the first Ctrl-C
    and SIGUSR1: it stops the trials, then returns) is raised as KeyboardInterrupt, as a
    Ctrl-C anywhere else in a workflow (exit status 130, the runs marked KILLED, the command
    that resumes), not summarized as if the stopped trials had run."""

    import ray
    from ray import tune

    from convs2s.tracking.redact import redact_text

    n = concurrency(sweep, ray.nodes(), len(todo))
    log.info("== sweep: %d trial(s) on Ray Tune, %d at a time: %s", len(todo), n,
             ", ".join(t.name for t in todo))
    by_name = {t.name: t for t in todo}
    trainable = tune.with_parameters(_trial_main, trials=by_name, sweep_run_id=tree.parent,
                                     sweep_kind=sweep.sweep, sweep_name=sweep.run_name,
                                     lease=lease)
    trainable = tune.with_resources(
        trainable, tune.PlacementGroupFactory([{"CPU": 0, "memory": TRIAL_DRIVER_MEMORY}]))
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search([t.name for t in todo])},
        tune_config=tune.TuneConfig(max_concurrent_trials=n,
                                    trial_name_creator=lambda tr: tr.config["trial"],
                                    trial_dirname_creator=lambda tr: tr.config["trial"]),
        run_config=tune.RunConfig(name="tune", storage_path=str(sweep.folder), verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)))
    placement_groups_before = _job_placement_groups()
    fit_started = time.time()
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log.addFilter(_no_tune_restore_hint)
    try:
        with callers_signal_handlers():  # (Ray Tune leaves its own installed)
            grid = tuner.fit()
    finally:
        tune_log.removeFilter(_no_tune_restore_hint)
    ran, failed = {}, {}
    for r in grid:
        name = (r.config or {}).get("trial")
        if r.error is not None:  # (to the log, the summary and MLflow: no password in it)
            lines = redact_text(str(r.error)).strip().splitlines()
            failed[name] = (lines[-1] if lines else type(r.error).__name__)[:500]
            log.warning("== sweep: trial %s failed: %s", name, failed[name])
        else:
            ran[name] = {k: v for k, v in r.metrics.items() if k in _METRIC_KEYS
                         or "/" in k}
    for name in failed:  # its workflow died with it: its runs are still open
        tree.end_open("FAILED", under=by_name[name].spec.run_dir)
    # A trial ends with trial.json written or with an error; neither: Ray Tune stopped it.
    stopped = [t for t in todo if t.name not in failed and t.finished() is None]
    if stopped:
        # Stopped, whatever a trial's workflow made of its teardown: its actor may live long
        # enough to see its Ray Train run lost and end its runs FAILED.
        for t in stopped:
            tree.end_open("KILLED", under=t.spec.run_dir, also=("FAILED",), since=fit_started)
        _remove_placement_groups_left(placement_groups_before)
        raise KeyboardInterrupt(f"Ray Tune stopped the sweep before "
                                f"{', '.join(t.name for t in stopped)} "
                                "finished (Ctrl-C, SIGTERM or SIGUSR1)")
    return ran, failed


def _job_placement_groups() -> set[str]:
    """The ids of this driver's job's placement groups that are not removed (a placement
    group's id ends with its job's id)."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    return {pg_id for pg_id, info in ray.util.placement_group_table().items()
            if pg_id.endswith(job) and info["state"] != "REMOVED"}


def _train_controllers_alive() -> int:
    """How many of this job's Ray Train controllers are not yet dead: while one lives it may
    still make a placement group. Read from the GCS's actor table (Ray's private
    `ray._private.state`, no dashboard needed); 0 where that API is missing or fails, and the
    caller then watches for `quiet_s` alone."""
    import ray

    try:
        from ray._private import state

        job = ray.get_runtime_context().get_job_id()
        return sum(1 for a in state.actors().values()
                   if a.get("ActorClassName") == "TrainController" and a.get("JobID") == job
                   and a.get("State") != "DEAD")
    except Exception:  # noqa: BLE001 - a private API: without it, the quiet period alone
        return 0


def _remove_placement_groups_left(before: set[str], quiet_s: float = 3.0,
                                  limit_s: float = 60.0) -> list[str]:
    """Removes the placement groups this job made since `before` that a stopped sweep left,
    watching until none has appeared for `quiet_s` and no Ray Train controller of the job is
    alive (at most `limit_s`); their ids.

    Ray Train can leave one behind when Ray Tune stops a trial: its controller, ended while it
    restarted the stopped worker group, made the next group's placement group on its way out,
    and nothing removed it (a test session's Ray kept 1 CPU held for good, and its next
    two-worker run waited for it; docs/benchmarks.md, "Stopping a run"). Ray's GCS removes a
    group once both its job and the actor that made it are dead, but marks the actor's death
    only on the groups registered before it: one registered as its maker died may outlive
    even the job, on a cluster too. In one full test session 1 CPU was still held by a group
    after a stopped sweep (made late, or before the sweep began: not told apart), and the
    session's next runs starved: so the watch also lasts while a controller of the job lives.
    Once the sweep is stopped nothing of it runs, so whatever
    its job made since it began is left over; this assumes the job runs nothing else
    meanwhile (a command's job does not; a notebook running other Ray work beside a sweep
    would lose that work's placement groups)."""
    from ray import PlacementGroupID
    from ray.util import remove_placement_group
    from ray.util.placement_group import PlacementGroup

    removed: list[str] = []
    failed: set[str] = set()
    start = last = time.monotonic()
    while (time.monotonic() - last < quiet_s or _train_controllers_alive()) \
            and time.monotonic() - start < limit_s:
        for pg_id in sorted(_job_placement_groups() - before - set(removed) - failed):
            try:  # (removing a group that is gone meanwhile, Ray Tune's own, is no error)
                remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(pg_id)))
            except Exception as err:  # noqa: BLE001 - it holds its resources; said once
                failed.add(pg_id)
                log.warning("== sweep: could not remove placement group %s its stopped "
                            "trials left (%s); `ray stop` frees it", pg_id,
                            err)
                continue
            removed.append(pg_id)
            last = time.monotonic()
        time.sleep(0.2)
    if removed:
        log.info("== sweep: %d placement group(s) its stopped trials left removed",
                 len(removed))
    return removed


def _no_tune_restore_hint(record: logging.LogRecord) -> bool:
    """Ray Tune's "Resume experiment with: Tuner.restore(...)" after a Ctrl-C names its own
    API; a sweep resumes with the same command (`--run-name`), which the workflow prints."""
    return "Tuner.restore(" not in record.getMessage()


_METRIC_KEYS = ("valid_ppl", "updates", "epochs", "train_minutes", "resumed_from_update",
                "run_id")


def _trial_main(config: dict, trials: dict, sweep_run_id: str | None, sweep_kind: str,
                sweep_name: str, lease=None) -> dict:
    """A Ray Tune trial (runs in a Tune actor): the trial's whole workflow run under the sweep's
    MLflow run; writes trial.json when it finished and returns its metrics to Tune. Its tags
    mean what the sweep run's mean: `convs2s.sweep` the sweep (`table4`), `convs2s.sweep.run`
    its run name, so one filter finds a sweep's run and its trials' runs."""

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    trial: Trial = trials[config["trial"]]
    log.info("== trial %s: %s", trial.name,
             "; ".join(f"{k}={v}" for k, v in trial.changes.items()) or "the preset's model")
    try:
        out = run_stages(trial.spec, within=sweep_run_id,
                         tags={"convs2s.sweep": sweep_kind, "convs2s.sweep.run": sweep_name,
                               "convs2s.variant": trial.variant.name,
                               "convs2s.seed": str(trial.seed)},
                         params={"sweep": {"run": sweep_name, "variant": trial.variant.name,
                                           "seed": trial.seed,
                                           "changes": "; ".join(f"{k}={v}" for k, v in
                                                                trial.changes.items())
                                           or "none"}},
                         lease=lease)
    except Exception as err:
        if (clean := without_credentials(err)) is err:
            raise
        raise clean from None  # (the original's traceback would print its message)
    metrics = trial_metrics(trial.spec, out)
    trial.write_record(metrics)
    return metrics


def without_credentials(err: Exception) -> Exception:
    """`err` as a trial may raise it to Ray Tune, which prints a failed trial's error on the
    console and writes it to the trial's error.txt: where its text quotes a URI with a password
    (MLflow's "API request to http://user:password@host/... failed" when the tracking server is
    down), a RuntimeError of the redacted text instead; else `err` itself."""
    from storage.redact import redact_text

    text = f"{type(err).__name__}: {err}"
    hidden = redact_text(text)
    return err if hidden == text else RuntimeError(hidden)


def trial_metrics(spec: RunSpec, out) -> dict:
    """A finished trial's figures: the best checkpoint's scores per test set
    (`<test set>/<metric>`), the validation perplexity, updates, epochs, minutes, the update
    its training last resumed from (0: it ran in one go), the run id."""
    kind = task_kind(spec.task_kind)
    m = out.train[0].metrics if out.train else {}
    metrics = {f"{s.test_set}/{k}": s.metrics[k] for s in out.scores if s.job == SCORED_JOB
               for k in kind.metrics if k in s.metrics}
    metrics.update(training_figures(out.train))
    metrics.update({"train_minutes": metrics["train_minutes"] or 0,
                    "resumed_from_update": m.get("resumed_from_update", 0),
                    "run_id": out.parent_run_id})
    return metrics
