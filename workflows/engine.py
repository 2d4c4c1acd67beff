"""The workflow engine: one workflow run's stages, preprocess -> train -> parallel evaluation
(-> ensemble), tracked as one MLflow parent run with one child run per stage.

    result = run_workflow(spec)  # check, then with the run's lease held: prepare, run_stages
    check(spec)                # the run name's settings, sources, GPUs: no write, no Ray
    prepare(spec)              # then Ray and the cluster's GPUs (workflows.cluster)
    result = run_stages(spec)  # the stages (a sweep's trials call this alone)

`spec` is the `RunSpec` that `workflows.run_spec.resolve` made from a preset and the flags;
the command line around it is `workflows.orchestrate`, a sweep's trials run `run_stages` as a
child of the sweep's run (`workflows.sweep`).

Where stages write (`--storage-path`, default ./runs; made absolute, Ray workers run elsewhere;
or a bucket URI, s3://BUCKET/PREFIX, kept a URI: docs/storage.md):

    <storage>/preprocessed/<task>/<key>/<stage>/  preprocessing output, keyed by its settings
                                              and inputs; a rerun skips stages whose manifest
                                              matches (shared by runs on the same data)
    <storage>/<run name>/train[_k]/           Ray Train run: checkpoint_*/, best/, metrics.jsonl
    <storage>/<run name>/eval/<job>/<test>.*  hypotheses (and MLflow artifacts)
    <storage>/<run name>/workflow.json        finished training runs and scored (job, test) pairs

MLflow (`--tracking-uri`, default $MLFLOW_TRACKING_URI, else sqlite:///./mlflow.db with the
artifacts in ./mlartifacts): experiment `--experiment` (default: the task name), one parent run
named `--run-name` with the resolved run spec as params and the final scores as metrics; child
runs `preprocess`, `train` (`train_2`, ... for an ensemble) and `eval/<job>/<test set>`, all
named and found by `workflows.run_tree`. Every eval child logs the same param keys and `bleu`
(or `rouge*`), so MLflow's compare view lines them up. The runs carry their datasets as inputs,
each evaluated set of weights is a logged model its scores link to, and the best on the
validation split (scored like the test sets; a model is never chosen on a test set) is
registered as `models:/<task>-<test set>@champion`, moved only by a better model on the same
validation data (workflows/lineage.py).

Rerunning with the same `--run-name` (and storage path) resumes: preprocessing stages are
skipped by their manifests, a finished training run is skipped (an interrupted one resumes from
its latest checkpoint; a larger --max-epochs continues it), and a (job, test set) pair is not
scored again while its checkpoints and its test text are unchanged and its child run holds
metrics. A rerun whose settings, update size or input data changed is refused
(workflows/run_state.py); one command at a time holds a run (storage/lease.py).
"""

from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass

from storage.signals import sigterm_as_ctrl_c
from convs2s.metrics.task_kinds import task_kind
from convs2s.tracking.runs import code_version, log_final_metrics, stopped_status
from convs2s.tracking.redact import redact_uri
from storage import is_uri, location
from storage.lease import RunLease
from workflows.cluster import (await_cluster_gpus, check_local_eval_room, check_local_gpus,
                               check_local_room, check_shared_storage, start_ray)
from workflows.errors import SpecError
from workflows.run_spec import RunSpec
from workflows.run_state import StageContext, record_settings, reuse_problem, train_names
from workflows.run_tree import RunTree
from workflows.steps import EvalScore, evaluate_stage, preprocess_stage, train_stage

log = logging.getLogger("workflows")

__all__ = ["EvalScore", "WorkflowResult", "prepare", "run_stages", "run_workflow",
           "parent_metrics", "source_tags", "training_figures"]


@dataclass
class WorkflowResult:
    parent_run_id: str | None
    experiment: str
    tracking_uri: str
    run_dir: str
    train: list  # [convs2s.train_job.TrainResult]
    scores: list[EvalScore]
    skipped: list[str]  # stages skipped because an earlier invocation finished them
    champion: object = None  # workflows.lineage.Champion: the registered best model, or None


def run_workflow(spec: RunSpec) -> WorkflowResult:
    """Preprocess, train (each ensemble member), evaluate in parallel; all tracked in MLflow.
    The run folder's lease is held from the first write to the end: a second command on the
    same run name and storage stops at once (storage.lease.LeaseHeld)."""
    check(spec)  # writes nothing: a refused run leaves no folder behind
    # (outer: a --storage-path that another command holds as its run folder, a sweep's, whose
    # trials are folders in it that only the sweep's lease covers; inner: a `convs2s train`
    # by hand in this run's train/)
    with RunLease(spec.run_dir, command=f"{spec.workflow} {spec.preset}",
                  outer=spec.storage, inner=True) as lease:
        prepare(spec)
        with sigterm_as_ctrl_c():  # (after Ray's start, which installs Ray's own handler)
            return run_stages(spec, lease=lease.ref())


def check(spec: RunSpec, sweep: bool = False) -> None:
    """The checks that need neither Ray nor a write: the run name's settings, the data
    sources and this machine's GPUs (errors in seconds). `sweep`: `spec` is a sweep's base,
    its run folder the sweep's."""
    if problem := reuse_problem(spec, sweep):  # a run name reused with other settings: first
        raise SpecError(problem)
    check_inputs(spec)


def check_inputs(spec: RunSpec) -> None:
    """What `check` asks of a run's inputs and this machine (a sweep asks it of each variant:
    a custom variant's --set may name other files)."""
    check_sources(spec)  # a missing corpus or an unreachable hub fails here, before Ray
    check_search_files(spec)  # evaluation's files: not found only after the whole training
    check_local_gpus(spec)  # this machine's GPUs against the request, before Ray


def check_search_files(spec: RunSpec) -> None:
    for name in ("dictionary", "shortlist"):
        path = getattr(spec.search, name)
        if path and not location(path).is_file():
            raise SpecError(f"--set search.{name}={path}: no such file (evaluation would stop "
                            "at it after the whole training run); give the file's path")


def prepare(spec: RunSpec, sweep: bool = False) -> None:
    """What a driver checks and starts before any stage, the lease held: the run name's
    settings again (another command may have changed them since `check`), then Ray and the
    cluster's GPUs."""
    if problem := reuse_problem(spec, sweep):
        raise SpecError(problem)
    start_ray(spec.use_gpu, small_data=spec.data.source == "demo")
    if not sweep:  # (a sweep counts the trials that fit: `sweep.concurrency`)
        check_local_room(spec)  # workers a local Ray cannot place
    else:  # its trials' evaluation tasks (a trial's driver cannot tell a local Ray's size)
        check_local_eval_room(spec)
    await_cluster_gpus(spec)  # a cluster's GPUs (the autoscaler may be adding nodes)
    # a node-local folder on a cluster of several nodes: after the GPU nodes came (on a
    # cluster whose worker types start at 0 nodes, only the head was there to look before)
    check_shared_storage(spec.storage, spec.tracking_uri)


def run_stages(spec: RunSpec, within: str | None = None, tags: dict | None = None,
               params: dict | None = None, lease=None) -> WorkflowResult:
    """The stages of a prepared run (`prepare`), its MLflow parent run a child of run
    `within` when given (a sweep's trial, with the sweep's `tags` and `params`). `lease`: the
    run folder's lease the command holds (storage.lease.LeaseRef), which training checks."""
    from convs2s.tracking.runs import artifacts_beside, end_run, run_has_metrics, run_metrics
    from workflows.lineage import data_inputs, register_champion, registered_name

    t0 = time.monotonic()
    pre, run_dir = spec.data, spec.run_dir
    uri = spec.tracking_uri
    source = source_tags(spec)  # the runs table's Source column: the workflow file and commit
    if is_uri(spec.storage):  # a local store's MLflow artifacts go to the bucket as well
        where = artifacts_beside(uri, spec.experiment, spec.storage)
        if where is not None and not where.startswith(spec.storage.split("://")[0] + "://"):
            log.warning("experiment %r keeps its MLflow artifacts in %s (it was created "
                        "before this run); give a new --experiment to keep them in %s",
                        spec.experiment, where, spec.storage)
    tree = RunTree.open(uri, spec.experiment, run_dir, spec.run_name,
                        tags={"convs2s.workflow": spec.workflow, "convs2s.preset": spec.preset,
                              "convs2s.data": pre.source, **source, **(tags or {})},
                        within=within, restarting=spec.restart)
    ctx = StageContext(tree, lease=lease)
    parent, minutes_logged = tree.parent, False
    try:
        # --restart sets earlier work aside, and the parent run with it (a new one is made);
        # a continuation is noted
        record_settings(ctx, spec)
        parent = tree.parent
        log.info("MLflow run %r (id %s) in experiment %r at %s", spec.run_name, parent,
                 spec.experiment, redact_uri(uri))
        tree.describe(parent, {**spec.params(), **(params or {})})
        out = preprocess_stage(ctx, pre, spec.init_from)
        datasets = data_inputs(out, pre.source, pre.task)  # the runs' Dataset column
        tree.describe(parent, datasets=datasets)
        # The GPU nodes again: preprocessing (hours on the hub's corpora) leaves them idle,
        # and an autoscaler ends idle nodes; asked for again, not waited for by Ray Train's
        # placement alone (which gives up after CONVS2S_PLACEMENT_WAIT_S)
        if not within:  # (a sweep's trials: the sweep counts what fits)
            await_cluster_gpus(spec)
            check_shared_storage(spec.storage, spec.tracking_uri)
        trained = train_stage(ctx, spec, out, datasets, source)
        scores, models = evaluate_stage(ctx, spec, out, trained)
        # A rerun that trained and scored nothing anew keeps the parent's figures (logged
        # again, each score would have a second value and workflow_minutes would become the
        # minutes of this call's skipping), as the preprocess run keeps its own. One that
        # trained on and scored nothing anew (a continued run whose best/ did not move, the
        # only weights scored) logs its training figures: its updates, epochs and minutes grew
        trained_now = any(n not in ctx.skipped for n in train_names(spec.ensemble.runs))
        if trained_now or not (scores and all(s.skipped for s in scores)  # (None: unknown,
                               and run_has_metrics(uri, parent) is not False):  # kept)
            # (a rerun that did some work: only the figures that changed are logged again,
            # each score else had a second value at step 0; the minutes are every call's)
            log_final_metrics(uri, parent, figures_to_log(
                parent_metrics(spec, trained, scores, time.monotonic() - t0),
                run_metrics(uri, parent)))
            minutes_logged = True  # (a stop after this: not counted twice)
        champion = None
        # The task's main metric on its validation split chooses the model; its main test set
        # names the registered model and reports the chosen one's score (never chooses it).
        # A sweep's trials never register.
        if scores and models and spec.register_champion:
            chosen_on, main_test = champion_sets(spec.test_sets)
            if chosen_on is None or main_test is None:
                log.warning("no champion registered: the run scores no %s split (test_sets "
                            "%s); a model is chosen on validation data, never on a test set",
                            "validation" if chosen_on is None else "test", spec.test_sets)
            else:
                champion = register_champion(
                    uri, registered_name(spec.workflow, main_test), scores, models, chosen_on,
                    task_kind(spec.task_kind).headline, report_on=main_test,
                    scoring=task_kind(spec.task_kind).scoring_for(spec.data.tgt_lang))
    except BaseException as err:
        # the parent and any stage's run the stop left open (an evaluation's, a training's);
        # then the call's minutes count, stopped or failed too (a 10-hour call that crashed
        # added nothing to workflow_minutes)
        tree.end_open(stopped_status(err))
        if tree.parent is not None and not minutes_logged:
            had = run_metrics(uri, tree.parent)
            log_final_metrics(uri, tree.parent, {"workflow_minutes": (
                time.monotonic() - t0) / 60 + had.get("workflow_minutes", 0.0)})
        raise
    end_run(uri, parent, "FINISHED")
    return WorkflowResult(parent, spec.experiment, uri, str(run_dir), trained, scores,
                          ctx.skipped, champion)


def champion_sets(test_sets: dict[str, str]) -> tuple[str | None, str | None]:
    """(the set the champion is chosen on, the test set it is reported on and named after)
    from a run's {evaluation split: set name}: the `valid` split's set, and the `test` split's
    (else the first other one). None where the run scores no such split."""
    chosen_on = test_sets.get("valid")
    main_test = test_sets.get("test") or next(
        (name for split, name in test_sets.items() if split != "valid"), None)
    return chosen_on, main_test


def source_tags(spec: RunSpec) -> dict:
    """The run's source: the workflow file, and its git commit where one is known (a cluster's
    copy of the code has no .git: CONVS2S_CODE_VERSION says it, `code_version`), else the
    version said as convs2s.code_version only (MLflow's Source column showed 0.1.0 as a
    commit)."""
    version = code_version()
    tags = {"mlflow.source.name": f"workflows/{spec.workflow}.py", "mlflow.source.type": "LOCAL",
            "convs2s.code_version": version}
    if re.fullmatch(r"[0-9a-f]{7,40}", version):
        tags["mlflow.source.git.commit"] = version
    return tags


def check_sources(spec: RunSpec) -> None:
    """Resolve every split's input now (files exist, the hub answers, small line-aligned files
    pair up): errors in seconds, before Ray starts."""
    from preprocessing.errors import PreprocessError
    from preprocessing.sources import resolve_split

    pre = spec.data
    for stem in spec.added_test_sets:  # named on the command line: say which flag is wrong
        folder = location(pre.source)  # a folder, or a bucket prefix
        if not folder.is_dir():  # (the --data folder itself: the splits' own check says so)
            break
        sides = [f"{stem}.{lang}" for lang in (pre.src_lang, pre.tgt_lang)]
        if not any((folder / f"{n}{gz}").is_file() for n in sides for gz in ("", ".gz")):
            langs = {pre.src_lang, pre.tgt_lang}
            stems = sorted({p.name.split(".")[0] for p in folder.iterdir()
                            if len(p.name.split(".")) > 1 and p.name.split(".")[1] in langs})
            raise PreprocessError(
                f"--test-set {stem}: neither {folder / sides[0]} nor {folder / sides[1]} "
                f"(nor .gz) exists; give a stem of a line-aligned pair in {folder} "
                f"(found: {', '.join(stems) or 'none'})")
    for split in pre.splits:
        resolve_split(pre, split)


def figures_to_log(figures: dict, had: dict) -> dict:
    """Of a call's parent figures, what to log on a parent run that `had` these: the figures
    that changed (logged again, an unchanged score had a second value at step 0) and the
    workflow's minutes, summed over its calls (they became the minutes of the last one): every
    call that did some work, or was stopped or failed (a call that skipped every stage keeps
    the figures as they were)."""
    out = {k: v for k, v in figures.items() if had.get(k) != v}
    out["workflow_minutes"] = figures["workflow_minutes"] + had.get("workflow_minutes", 0.0)
    return out


def parent_metrics(spec: RunSpec, trained: list, scores: list[EvalScore],
                   seconds: float) -> dict:
    """The main scores unprefixed (the test set the run reports on, `champion_sets`, of the
    first job: the first run's best checkpoint) so parent runs of different workflow runs
    compare by the same keys (a run whose test_sets listed `valid` first gave its validation
    scores as `bleu`); every score as eval/<job>/<test>/<metric>, named like the child run
    that holds it."""
    keys = task_kind(spec.task_kind).metrics
    out = {"workflow_minutes": seconds / 60}
    if scores:
        main = champion_sets(spec.test_sets)[1]
        main_score = next((s for s in scores if s.test_set == main), scores[0])
        out.update({k: main_score.metrics[k] for k in keys if k in main_score.metrics})
    for s in scores:
        out.update({f"eval/{s.job}/{s.test_set}/{k}": s.metrics[k] for k in keys
                    if k in s.metrics})
    if trained:
        out.update(training_figures(trained))
    return out


def training_figures(trained: list) -> dict:
    """The first training run's figures, as a workflow's parent run and a sweep's trial table
    show them: validation perplexity of the best checkpoint (`best/`, the one scored: the last
    validation's was beside its BLEU before), updates, epochs (as the validation metrics count
    them: a fraction after a mid-epoch stop) and minutes of training (None where it did not
    say)."""
    m = trained[0].metrics if trained else {}
    seconds = m.get("train_seconds")
    best = m.get("best_val_loss")
    ppl = math.exp(min(best, 50.0)) if isinstance(best, (int, float)) and math.isfinite(best) \
        else m.get("val_ppl")
    return {"valid_ppl": ppl, "epochs": m.get("epochs", m.get("epoch")),
            "updates": m.get("update"), "train_minutes": None if seconds is None else seconds / 60}
