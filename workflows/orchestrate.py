"""Shared orchestration of the paper-task workflows: preprocess -> train -> parallel evaluation
(-> ensemble), tracked as one MLflow parent run with one child run per stage.

A workflow file (workflows/wmt14_en_fr.py, ...) only declares its settings: `paper()` and
`smoke()` return a `WorkflowConfig` (workflows/workflow_config.py), and its `__main__` calls

    sys.exit(main({"paper": paper, "smoke": smoke}, __doc__))

which parses the run-level flags (`--preset --data --num-workers --use-gpu --max-epochs
--max-updates --storage-path --tracking-uri --experiment --run-name`), resolves them with the
preset once (`workflows.run_spec.resolve` -> `RunSpec`), calls `run_workflow(spec)` and prints
the scores and where to look in MLflow.

Ray: with RAY_ADDRESS set (`ray job submit`, or a driver on a cluster node) `ray.init()` joins
that cluster; otherwise it starts a local Ray on this machine.

Where stages write (`--storage-path`, default ./runs; made absolute, Ray workers run elsewhere):

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
named and found by `workflows.run_tree`. Every eval
child logs the same param keys and `bleu` (or `rouge*`), so MLflow's compare view lines them up.
The runs carry their datasets as inputs, each evaluated set of weights is a logged model its
scores link to, and the best is registered as `models:/<task>-<test set>@champion`, moved only
by a better model on the same test data (workflows/lineage.py).

Rerunning with the same `--run-name` (and storage path) resumes: preprocessing stages are
skipped by their manifests, a finished training run is skipped (an interrupted one resumes from
its latest checkpoint; a larger --max-epochs continues it), and a (job, test set) pair is not
scored again while its checkpoints are unchanged and its child run holds metrics.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from convs2s.task_kinds import task_kind
from convs2s.tracking import (
    code_version,
    experiment_id,
    log_final_metrics,
)
from convs2s.train_job import STOP_REASONS, WorkersNotPlaced
from workflows.run_spec import RunSpec, SpecError, resolve
from workflows.run_state import StageContext, record_settings, reuse_problem
from workflows.run_tree import RunTree
from workflows.stages import EvalScore, evaluate_stage, preprocess_stage, train_stage
from workflows.sweep import SweepResult, resolve_sweep, run_sweep
from workflows.workflow_config import RunOptions, WorkflowConfig, parse_args

log = logging.getLogger("workflows")

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


# --- the workflow --------------------------------------------------------------------------------


def run_workflow(spec: RunSpec) -> WorkflowResult:
    """Preprocess, train (each ensemble member), evaluate in parallel; all tracked in MLflow."""
    prepare(spec)
    return run_stages(spec)


def prepare(spec: RunSpec) -> None:
    """What a driver checks and starts before any stage: the run name's settings, the data
    sources and GPUs (errors in seconds, before Ray), then Ray and the cluster's GPUs."""
    if problem := reuse_problem(spec):  # a run name reused with other settings: before anything
        raise SpecError(problem)
    _check_sources(spec)  # a missing corpus or an unreachable hub fails here, before Ray
    _check_local_gpus(spec)  # this machine's GPUs against the request, before Ray
    _start_ray(spec.use_gpu, small_data=spec.data.source == "demo")
    _await_cluster_gpus(spec)  # a cluster's GPUs (the autoscaler may be adding nodes)


def run_stages(spec: RunSpec, within: str | None = None, tags: dict | None = None,
               params: dict | None = None) -> WorkflowResult:
    """The stages of a prepared run (`prepare`), its MLflow parent run a child of run
    `within` when given (a sweep's trial, with the sweep's `tags` and `params`)."""
    from convs2s.tracking import end_run, resolve_tracking_uri
    from workflows.lineage import data_inputs, register_champion, registered_name

    t0 = time.monotonic()
    pre, run_dir = spec.data, spec.run_dir
    uri = resolve_tracking_uri(spec.tracking_uri)
    source = _source_tags(spec)  # the runs table's Source column: the workflow file and commit
    tree = RunTree.open(uri, spec.experiment, run_dir, spec.run_name,
                        tags={"convs2s.workflow": spec.workflow, "convs2s.preset": spec.preset,
                              "convs2s.data": pre.source, **source, **(tags or {})},
                        within=within)
    parent = tree.parent
    log.info("MLflow run %r (id %s) in experiment %r at %s", spec.run_name, parent,
             spec.experiment, uri)
    ctx = StageContext(tree)
    try:
        tree.describe(parent, {**spec.params(), **(params or {})})
        record_settings(ctx, spec)  # --restart sets earlier work aside; a continuation is noted
        out = preprocess_stage(ctx, pre, spec.init_from)
        datasets = data_inputs(out, pre.source, pre.task)  # the runs' Dataset column
        tree.describe(parent, datasets=datasets)
        trained = train_stage(ctx, spec, out, datasets, source)
        scores, models = evaluate_stage(ctx, spec, out, trained)
        log_final_metrics(uri, parent, _parent_metrics(spec, trained, scores,
                                                       time.monotonic() - t0))
        champion = None
        # The task's main metric on its main (first) test set; a sweep's trials never register.
        if scores and models and spec.register_champion:
            main_test = scores[0].test_set  # only scores on one test set compare
            champion = register_champion(uri, registered_name(spec.workflow, main_test), scores,
                                         models, main_test, task_kind(spec.task_kind).headline)
    except BaseException as err:
        end_run(uri, parent, "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED")
        raise
    end_run(uri, parent, "FINISHED")
    return WorkflowResult(parent, spec.experiment, uri, str(run_dir), trained, scores,
                          ctx.skipped, champion)


def _source_tags(spec: RunSpec) -> dict:
    return {"mlflow.source.name": f"workflows/{spec.workflow}.py", "mlflow.source.type": "LOCAL",
            "mlflow.source.git.commit": code_version()}


# --- helpers -------------------------------------------------------------------------------------


def _check_sources(spec: RunSpec) -> None:
    """Resolve every split's input now (files exist, the hub answers, small line-aligned files
    pair up): errors in seconds, before Ray starts."""
    from preprocessing.errors import PreprocessError
    from preprocessing.sources import resolve_split

    pre = spec.data
    for stem in spec.added_test_sets:  # named on the command line: say which flag is wrong
        folder = Path(pre.source)
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


def _quiet_console() -> None:
    """The console shows the project's stage lines, training progress and results; Ray
    Data's per-dataset INFO lines go only to ray-data.log in Ray's log folder, and its
    progress bars (carriage-return redraws) only appear on a terminal. Set before Ray starts:
    a local Ray's workers inherit the environment."""
    os.environ.setdefault("RAY_DATA_LOGGING_CONFIG",
                          str(Path(__file__).with_name("ray_data_logging.yaml")))
    if not sys.stdout.isatty():  # a file or a pipe: no redraws, no colour codes
        os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    # MLflow's INFO lines (store set-up): its own env var for a fresh import, the level for an
    # MLflow already imported.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def _start_ray(use_gpu: bool, small_data: bool) -> None:
    _quiet_console()
    import ray

    if small_data:  # the embedded corpus: a few parquet files, no need for footer actors
        os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
    if not ray.is_initialized():
        # RAY_ADDRESS set (job submission): join that cluster, no resource arguments
        # (reference-facts §8); otherwise a local Ray on this machine. Ray's own INFO
        # banner stays out of the console (its logs are in the session folder, named below).
        if not os.environ.get("RAY_ADDRESS"):
            _local_ray_auth()
        ray.init(logging_level=logging.WARNING)
    cpus, gpus = ray.cluster_resources().get("CPU", 0), ray.cluster_resources().get("GPU", 0)
    address = os.environ.get("RAY_ADDRESS")
    log.info("Ray: %s, %g CPUs, %g GPUs; Ray's own logs: %s",
             f"cluster {address}" if address else "local instance", cpus, gpus, _ray_log_dir())


# How long a workflow on a cluster waits for the GPUs it asks for (the autoscaler adding
# nodes) before it stops with a message, instead of Ray Train waiting without end.
GPU_WAIT_S = float(os.environ.get("CONVS2S_GPU_WAIT_S", 900))


def _gpu_request(spec: RunSpec) -> int:
    """GPUs the training needs at once: one per Ray Train worker (`ScalingConfig`)."""
    return spec.num_workers if spec.use_gpu else 0


def _check_local_gpus(spec: RunSpec) -> None:
    """A local run (no RAY_ADDRESS): the GPUs this machine has against the request, before Ray
    starts; too few is one `error:` line with the fix (exit 2)."""
    need = _gpu_request(spec)
    if not need or os.environ.get("RAY_ADDRESS"):
        return
    import torch

    have = torch.cuda.device_count()
    if have < need:
        raise SpecError(
            f"--use-gpu with {spec.num_workers} worker(s) needs {need} GPU(s) (one per worker), "
            f"but this machine has {have}: " + (f"run with --num-workers {have}" if have
                                                else "run without --use-gpu (CPU)")
            + ", or submit the workflow to a GPU cluster (`ray job submit`)")


def _await_cluster_gpus(spec: RunSpec) -> None:
    """On a cluster: wait (bounded, GPU_WAIT_S) until it has the GPUs the training asks for, as
    an autoscaler adds nodes; then stop with a message instead of a silent hang."""
    import ray

    need = _gpu_request(spec)
    if not need or not os.environ.get("RAY_ADDRESS"):
        return
    kind = spec.accelerator_type
    what = f"{kind} GPU" if kind else "GPU"
    deadline, said = time.monotonic() + GPU_WAIT_S, False
    while (have := gpus_of(ray.nodes(), kind)) < need:
        if time.monotonic() > deadline:
            raise SpecError(
                f"the cluster has {have:g} {what}(s) after {GPU_WAIT_S:.0f} s but training asks "
                f"for {need} ({spec.num_workers} worker(s) x 1 GPU): lower --num-workers to "
                f"{int(have)} or raise the GPU node count the autoscaler may start "
                "(max_workers of its GPU node type, infra/cluster-aws.yaml)" if have else
                f"the cluster has no {what} after {GPU_WAIT_S:.0f} s but --use-gpu asks for "
                f"{need}: check that its config has "
                + (f"a node type with the resource accelerator_type:{kind}" if kind
                   else "GPU worker nodes") + " (infra/cluster-aws.yaml)")
        if not said:
            log.warning("the cluster has %g of the %d %ss training asks for: waiting up to %.0f "
                        "s for the autoscaler to add GPU nodes", have, need, what, GPU_WAIT_S)
            said = True
        time.sleep(10)


def gpus_of(nodes: list[dict], accelerator_type: str | None = None) -> float:
    """GPUs of the alive nodes (`ray.nodes()`), only those of nodes whose GPU model is
    `accelerator_type` when given (Ray's `accelerator_type:<model>` node resource)."""
    return sum(n.get("Resources", {}).get("GPU", 0) for n in nodes if n.get("Alive")
               and (accelerator_type is None
                    or f"accelerator_type:{accelerator_type}" in n.get("Resources", {})))


def _local_ray_auth() -> None:
    """A local Ray this workflow starts uses token authentication (Ray's default for a new
    local instance), chosen explicitly: left unset, Ray picks the same and prints a notice on
    every run. A user's own RAY_AUTH_MODE is kept."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    import ray._raylet

    ray._raylet.Config.initialize("")  # as Ray does after setting it: re-read the setting


def _parent_metrics(spec: RunSpec, trained: list, scores: list[EvalScore],
                    seconds: float) -> dict:
    """The main scores unprefixed (first test set, first run's best checkpoint) so parent runs
    of different workflow runs compare by the same keys; every score as
    eval/<job>/<test>/<metric>, named like the child run that holds it."""
    keys = task_kind(spec.task_kind).metrics
    out = {"workflow_minutes": seconds / 60}
    if scores:
        main_score = scores[0]
        out.update({k: main_score.metrics[k] for k in keys if k in main_score.metrics})
    for s in scores:
        out.update({f"eval/{s.job}/{s.test_set}/{k}": s.metrics[k] for k in keys
                    if k in s.metrics})
    if trained:
        m = trained[0].metrics
        seconds = m.get("train_seconds")
        # Epochs as the validation metrics count them (a fraction after a mid-epoch stop).
        out.update({"valid_ppl": m.get("val_ppl"), "epochs": m.get("epochs", m.get("epoch")),
                    "updates": m.get("update"),
                    "train_minutes": None if seconds is None else seconds / 60})
    return out


# --- command line --------------------------------------------------------------------------------


def main(presets: dict[str, Callable[[], WorkflowConfig]], doc: str | None = None,
         argv: list[str] | None = None, filter_console: bool | None = None) -> int:
    """Command-line entry of a workflow file: parse flags, run, print scores and MLflow links.
    With `filter_console` (default: when run as a command, argv None) Ray's known harmless
    console lines stay in its log files (workflows/console.py)."""
    opts = parse_args(argv, presets, doc)
    if not (argv is None if filter_console is None else filter_console):
        return _run_main(presets, opts)  # in-process (tests, notebooks): stderr as it is
    from workflows.console import harmless_ray_lines_dropped

    # Both streams: Ray prints the raylet's pushed errors on stdout, its logs on stderr.
    with harmless_ray_lines_dropped(2), harmless_ray_lines_dropped(1):
        return _run_main(presets, opts)


def _run_main(presets: dict[str, Callable[[], WorkflowConfig]], opts: RunOptions) -> int:
    from preprocessing.errors import PreprocessError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    cfg = presets[opts.preset]()
    _warn_if_job_tmp(opts)
    try:
        # Named now: an interrupted run is told how to resume.
        spec = resolve_sweep(cfg, opts) if opts.sweep else resolve(cfg, opts)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        if opts.sweep:
            result = run_sweep(spec)
            print(sweep_summary(result, time.monotonic() - t0), flush=True)
            return 1 if result.failed else 0
        result = run_workflow(spec)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except WorkersNotPlaced as e:  # a lost node not replaced: stopped, resumable
        print(f"error: {e}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        # Every stage writes whole files or none (manifests last), so what is on disk is
        # complete: the same run name picks up from there.
        where = spec.base.storage if opts.sweep else spec.storage
        print(f"\ninterrupted: finished stages are kept under {where}; resume with "
              f"the same --run-name {spec.run_name} and --storage-path {opts.storage_path}",
              file=sys.stderr, flush=True)
        return 130
    except PreprocessError as e:
        from preprocessing.errors import unwrap_ray_error
        from preprocessing.sources import NO_HUB_HINT

        # The preprocessing CLI's fixes name its own flags (--source, --split); this command's
        # are in the hint below.
        found = unwrap_ray_error(e) or e
        text = getattr(found, "fact", None) or str(found)
        print(f"error: {text.replace(NO_HUB_HINT, '').strip()}", file=sys.stderr)
        print("hint: this workflow reads its data with --data: `--data demo` runs on the "
              "embedded demo corpus (no network); `--data DIR` reads a local folder with "
              f"{_stems(cfg)} (text files <stem>.<lang>, .tsv, .jsonl or hub-like parquet).",
              file=sys.stderr)
        return 2
    print(summary(spec, result, time.monotonic() - t0), flush=True)
    return 0


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
        lines.append(f"MLflow: tracking at {r.tracking_uri} was unavailable")
        return "\n".join(lines)
    exp_id = experiment_id(r.tracking_uri, s.base.experiment)
    lines.append(f"MLflow: experiment {s.base.experiment!r}, sweep run {s.run_name!r} (id "
                 f"{r.run_id}) with one child run per trial; select them and press Compare")
    if r.tracking_uri.startswith("sqlite:///"):
        lines.append(f"  mlflow ui --backend-store-uri {r.tracking_uri} --port 5000")
        base = "http://127.0.0.1:5000"
    else:
        base = r.tracking_uri.rstrip("/")
    if exp_id is not None:
        ml = "?workflowType=machine_learning"  # the UI's "Model training" side, not GenAI
        lines.append(f"  sweep:   {base}/#/experiments/{exp_id}/runs/{r.run_id}{ml}")
        ids = [m["run_id"] for t in s.trials if (m := r.results.get(t.name)) and m.get("run_id")]
        if ids:  # every finished trial's workflow run, side by side
            lines.append(f"  compare: {base}/#/compare-runs?runs="
                         f"{json.dumps(ids, separators=(',', ':'))}"
                         f"&experiments={json.dumps([exp_id])}")
    return "\n".join(lines)


def _stems(cfg: WorkflowConfig) -> str:
    return ", ".join(f"{split}={stem}" for split, stem in cfg.local_splits.items())


def _warn_if_job_tmp(opts: RunOptions) -> None:
    """Under `ray job submit` the working directory is a temporary copy of the checkout."""
    if os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") and not Path(opts.storage_path).is_absolute():
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
        lines.append(f"MLflow: tracking at {r.tracking_uri} was unavailable; training metrics "
                     f"are in {r.run_dir}/train*/metrics.jsonl and the scores in "
                     f"{r.run_dir}/workflow.json")
        return "\n".join(lines)
    lines.append(f"MLflow: experiment {r.experiment!r}, parent run {Path(r.run_dir).name!r} "
                 f"(id {r.parent_run_id}) with child runs preprocess, train*, eval/*")
    exp_id = experiment_id(r.tracking_uri, r.experiment)
    if r.tracking_uri.startswith("sqlite:///"):
        lines.append(f"  mlflow ui --backend-store-uri {r.tracking_uri} --port 5000")
        base = "http://127.0.0.1:5000"
    else:
        base = r.tracking_uri.rstrip("/")
    if exp_id is not None and r.parent_run_id:
        ids = [r.parent_run_id] + [s.run_id for s in r.scores if s.run_id]
        ml = "?workflowType=machine_learning"  # the UI's "Model training" side, not GenAI
        lines += [f"  runs:    {base}/#/experiments/{exp_id}/runs{ml}",
                  f"  models:  {base}/#/experiments/{exp_id}/models{ml}",
                  f"  run:     {base}/#/experiments/{exp_id}/runs/{r.parent_run_id}{ml}",
                  f"  compare: {base}/#/compare-runs?runs={json.dumps(ids, separators=(',', ':'))}"
                  f"&experiments={json.dumps([exp_id])}"]
    c = r.champion
    if c is not None:
        if c.moved:
            lines.append(f"best model: {c.job} ({c.metric} {c.value:.2f} on {c.test_set}) is "
                         f"{c.uri} (version {c.version}): {c.reason}; serve it with")
        else:
            lines.append(f"best model: {c.uri} stays version {c.version}: {c.reason}"
                         + ("; serve it with" if c.version != "none" else ""))
        if c.moved or c.version != "none":
            lines.append(f"  MLFLOW_TRACKING_URI={r.tracking_uri} mlflow models serve -m "
                         f"{c.uri} --env-manager local -p 5001")
    return "\n".join(lines)


def _ray_log_dir() -> str:
    import ray

    try:
        return str(Path(ray._private.worker._global_node.get_session_dir_path()) / "logs")
    except AttributeError:  # not a node of this process (a client connection)
        return "the Ray dashboard (Logs), or `ray job logs`"
