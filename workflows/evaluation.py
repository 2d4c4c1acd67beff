"""Parallel evaluation and ensembling jobs on Ray, each scored result an MLflow child run.

One call evaluates every (checkpoint, ensemble or averaged checkpoint) x (test set) pair as its own
Ray task with its own resources (CPUs, or a GPU fraction so several jobs share a GPU). The driver
creates one child run per pair under the training (or workflow) run and, as each task finishes, logs
its metrics (its task kind's, `convs2s.metrics.task_kinds`: bleu, bleu_tokenized, chrf, length_ratio
or rouge*; and sentences_per_second), its hypotheses file and its attention pictures.

    from workflows.evaluation import EvalJob, TestSet, evaluate_all, evaluation_jobs
    test = TestSet("test", src=".../text/test.en", ref=".../text/test.fr", tgt_lang="fr")
    jobs = [EvalJob("best", (result.best_checkpoint,), test)]
    jobs = evaluation_jobs([run_a, run_b, run_c], [test], average_last=5)  # + an ensemble
    results = evaluate_all(jobs, tracking_uri, parent_run_id=result.run_id, out_dir="eval")
    results[0].metrics["bleu"], results[0].run_id, results[0].hyp_path

Run (on a cluster of several nodes, --out, the runs and the test sets in folders all see):
    python -m workflows.evaluation --run-dir runs/a runs/b --last-n 5 \\
        --test test PREP/text/<hash>/test.en PREP/text/<hash>/test.fr fr --parent-run-id <id>
    (PREP: a preprocessing output, <storage>/preprocessed/<task>/<key>)

Jobs: a single checkpoint; an ensemble (several checkpoints, probabilities averaged: the
paper's ensembles of several training runs, §5.2); or `average=True`, the mean of the
checkpoints' weights (the last N checkpoints of one run: not the paper's, which averages no
weights; the reference implementation's `average_checkpoints.py`).
Summarization test sets (`task_kind="summarization"`) are scored with ROUGE; give them a search
with a minimum output length (`summarization_search()`, paper §4.1).
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # `python -m workflows.evaluation`: Ctrl-C and SIGTERM are handled
    # before the heavy imports below (torch's among them), and main() runs from the module as
    # it is imported elsewhere (what its Ray tasks unpickle). Its parser lives in
    # workflows/evaluation_command.py, which imports this module: named by string here, so
    # that imports flow one way.
    import importlib

    from storage.signals import command_signals, sigterm_as_ctrl_c

    try:
        with command_signals(), sigterm_as_ctrl_c():
            sys.exit(importlib.import_module("workflows.evaluation_command").main())
    except KeyboardInterrupt:  # before the jobs began
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)

import dataclasses
import hashlib
import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from convs2s.io.checkpoint import best_checkpoint, list_checkpoints, pick_checkpoints
from convs2s.config import SearchConfig
from convs2s.metrics.task_kinds import RUN_METRICS, task_kind
from convs2s.tracking.runs import (DatasetRecord, describe_run, end_run, experiment_of_run,
                                   find_or_create_run, log_artifacts, log_final_metrics,
                                   resolve_tracking_uri, run_key, set_tags, stopped_status)
from convs2s.tracking.redact import redact_text, redact_uri
from workflows.placement import _check_room, _free_cpus_per_node, share_cpus
from storage import StorageError, local_copy, location, ray_join, worker_path, write_whole

log = logging.getLogger("workflows.evaluation")


@dataclass(frozen=True)
class TestSet:
    __test__ = False  # not a pytest test class (its name starts with "Test")

    name: str  # e.g. "newstest2014"; names the child run and the hypotheses file
    src: str  # source text, one sentence per line
    ref: str  # references, line-aligned with src
    # The references' language: tokenized BLEU's Moses rules, Romanian normalization, the
    # scoring by base language (no default: a default scored every other pair as French)
    tgt_lang: str
    task_kind: str = "translation"  # how it is scored (convs2s.metrics.task_kinds)


@dataclass(frozen=True)
class EvalJob:
    name: str  # e.g. "best", "ensemble_3", "avg_last5"
    checkpoints: tuple[str, ...]  # one: single model; several: an ensemble (or averaged)
    test_set: TestSet
    search: SearchConfig = field(default_factory=SearchConfig)
    average: bool = False  # average the checkpoints' weights into one model first
    num_cpus: float = 1.0  # Ray resources of the task; torch uses that many threads
    num_gpus: float = 0.0  # a GPU fraction, e.g. 0.25 lets four jobs share one GPU
    attention_sentences: int = 0  # per-layer attention PNGs for the first N test sentences
    model_id: str | None = None  # the MLflow logged model of these weights: scores link to it
    # The files that are scored and logged (`stage_weights`): one folder per model, an
    # averaging job's average already computed. Empty: the checkpoints as they are.
    staged: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        if self.average and len(self.checkpoints) > 1:
            return "average"
        return "ensemble" if len(self.checkpoints) > 1 else "single"


@dataclass
class EvalResult:
    job: EvalJob
    metrics: dict[str, float]  # scores + sentences_per_second, seconds
    hyp_path: str  # the hypotheses file written on the driver (also an MLflow artifact)
    run_id: str | None  # the MLflow child run (None when tracking was unreachable)
    attention_pngs: list[str] = field(default_factory=list)


# --- one job (runs inside a Ray task; also callable without Ray) ---------------------------------


def evaluate_job(job: EvalJob) -> dict:
    """Translate and score one job: {"hypotheses", "metrics", "signatures", "pngs", "served"};
    "served": the precision and device it translated with, decided on its node (float32
    where the asked precision cannot run there and `precision_fallback` allows it; int8 on a
    GPU job's CPU)."""
    import torch

    from convs2s.inference.attention_plot import plot_attention
    from convs2s.metrics.scoring import read_lines
    from convs2s.inference.translate import load_for_inference
    from convs2s.precision import runs_on_gpus

    torch.set_num_threads(max(1, int(job.num_cpus)))
    # (int8 weights run on PyTorch's quantized CPU kernels: a GPU job searches on its CPU)
    use_cuda = job.num_gpus > 0 and torch.cuda.is_available() \
        and runs_on_gpus(job.search.precision)
    test = job.test_set
    # A bucket's files and model folders: their local copies, fetched once per node.
    src, refs = read_lines(local_copy(test.src)), read_lines(local_copy(test.ref))
    if len(src) != len(refs):
        raise ValueError(f"test set {test.name}: {test.src} has {len(src)} lines but "
                         f"{test.ref} has {len(refs)}; they must be line-aligned")
    if job.kind == "average" and not job.staged:
        raise ValueError(f"job {job.name}: an averaging job scores its staged average; stage "
                         "it first (stage_weights, which evaluate_all does)")
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(local_copy(p)) for p in job.staged or job.checkpoints]
        translator = load_for_inference(paths, job.search,
                                        "cuda" if use_cuda else "cpu")
        t0 = time.perf_counter()
        hyps = translator.translate(src)
        if use_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        served = {"precision": translator.search.precision,
                  "device": "cuda" if use_cuda else "cpu"}
        pngs = {}
        if job.attention_sentences:
            for p in plot_attention(translator, src[: job.attention_sentences], tmp):
                pngs[p.name] = p.read_bytes()
    kind = task_kind(test.task_kind)
    metrics, signatures = kind.score(hyps, refs, test.tgt_lang), kind.signatures(test.tgt_lang)
    metrics.update(seconds=seconds, sentences_per_second=len(src) / max(seconds, 1e-9),
                   sentences=float(len(src)))
    return {"hypotheses": hyps, "metrics": metrics, "signatures": signatures, "pngs": pngs,
            "served": served}


def stage_weights(jobs: list[EvalJob], folder: str | Path) -> list[EvalJob]:
    """Each job's weights staged once under `<folder>/<job>` (`convs2s.io.staging`: slim copies,
    an averaging job's average computed there, reused while the checkpoints are unchanged);
    returns the jobs with `staged` set. One staging per job name: it recurs once per test set."""
    from convs2s.io.staging import stage_models

    staged: dict[str, tuple[str, ...]] = {}
    out = []
    for job in jobs:
        if job.name not in staged:
            staged[job.name] = stage_models(job.checkpoints, job.kind == "average",
                                            location(folder) / job.name)
        out.append(dataclasses.replace(job, staged=staged[job.name]))
    return out


# --- the driver: child runs, Ray tasks, logging as results arrive --------------------------------


class EvaluationFailed(RuntimeError):
    """Jobs of an evaluation failed: one line each (their runs are marked FAILED)."""


def short_path(path: str) -> str:
    """The last two parts of a path (train/best, text/test.en): readable in MLflow's compare
    view, where absolute paths are too long to tell runs apart."""
    return "/".join(Path(path).parts[-2:])


def _job_params(job: EvalJob) -> dict:
    """The same keys for every job, so MLflow's compare view lines the runs up. Not the
    resources it was given: tags (convs2s.eval.num_cpus / num_gpus, beside its speed), which a
    rescore on others updates (params kept the first scoring's, and warned they differed)."""
    return {
        "eval": {"job": job.name, "kind": job.kind, "n_checkpoints": len(job.checkpoints),
                 "checkpoints": ",".join(map(short_path, job.checkpoints))},
        "test": {"name": job.test_set.name, "src": short_path(job.test_set.src),
                 "ref": short_path(job.test_set.ref), "tgt_lang": job.test_set.tgt_lang,
                 "task_kind": job.test_set.task_kind},
        "search": job.search.to_dict()}


def dataset_of(test: TestSet) -> DatasetRecord:
    """The test set as an MLflow dataset: its digest covers the source and reference bytes."""
    src_path, ref_path = location(test.src), location(test.ref)
    src, ref = src_path.read_bytes(), ref_path.read_bytes()
    digest = hashlib.sha256(src + b"\0" + ref).hexdigest()[:16]
    sentences = src.count(b"\n") + (1 if src and not src.endswith(b"\n") else 0)
    return DatasetRecord(test.name, digest, str(src_path.parent),
                         {"sentences": sentences, "src": src_path.name,
                          "ref": ref_path.name}, "evaluation")


def _experiment_name(uri: str, parent_run_id: str | None, default: str) -> str:
    if not parent_run_id:
        return default
    try:
        return experiment_of_run(uri, parent_run_id)
    except Exception as err:  # noqa: BLE001 - the scores still come back without tracking
        log.warning("cannot read parent run %s at %s (%s); child runs go to experiment %r",
                    parent_run_id, redact_uri(uri), redact_text(str(err).splitlines()[0])[:200],
                    default)
        return default


# Tag of an evaluation run: the scoring version its scores were computed by
# (TaskKind.scoring_for; the champion compares only scores of one version, workflows/lineage.py)
SCORING_TAG = "convs2s.scoring_version"
IDENTITY_TAG = "convs2s.eval.identity"  # what a job scored (`_identity`)


def _log_result(uri: str, run_id: str | None, job: EvalJob, out: dict,
                dataset: DatasetRecord) -> None:
    """The scores on the child run, each also a metric of the job's logged model on the test
    set's dataset (MLflow's Models view ranks by them); the speed only on the run; what it was
    served with as tags (the `search.precision` param is what was asked: a node without int8
    or bf16 kernels serves float32 under `precision_fallback`)."""
    from convs2s.tracking.runs import model_metrics, run_metrics

    m = out["metrics"]
    # (a pair scored again into its run, for the pictures or a new scoring version: an
    # unchanged score had a second value at step 0, on its model too)
    had, on_model = run_metrics(uri, run_id), model_metrics(uri, job.model_id, dataset)
    log_final_metrics(uri, run_id, {k: v for k, v in m.items() if k not in RUN_METRICS and (
        had.get(k) != v or (job.model_id and on_model.get(k) != v))},
                      model_id=job.model_id, dataset=dataset)
    log_final_metrics(uri, run_id, {k: v for k, v in m.items() if k in RUN_METRICS})
    scoring = task_kind(job.test_set.task_kind).scoring_for(job.test_set.tgt_lang)
    set_tags(uri, run_id, {**{f"signature.{k}": v for k, v in out["signatures"].items()},
                           **{f"convs2s.served.{k}": v for k, v in out["served"].items()},
                           SCORING_TAG: str(scoring)})


def evaluate_all(jobs: list[EvalJob], tracking_uri: str | None = None,
                 parent_run_id: str | None = None, out_dir: str = "eval",
                 experiment_name: str = "convs2s", raise_on_error: bool = True,
                 run_ids: dict[tuple[str, str], str | None] | None = None,
                 on_result=None, lease=None) -> list[EvalResult]:
    """Run every job as a Ray task and log each as a child run of `parent_run_id`.

    Hypotheses go to `<out_dir>/<job>/<test>.<tgt_lang>` on the driver. Rerunning the same
    evaluation (job, test set, checkpoints, search) into the same `out_dir` reuses its child
    runs; another one under the same names gets runs of its own, the old ones set apart
    (`_run_of`). A failed job marks its run FAILED; with `raise_on_error` a RuntimeError
    naming every failed job follows once the others are logged (else failed jobs are left out
    of the results). `run_ids` ({(job name, test set name): run id}, a workflow's run tree
    made them) are the child runs to log into. `on_result(result)` is called as each job's
    result is logged, before the others end: a workflow records each score then, so that one
    failed or stopped pair does not take the finished ones' records with it (they would be
    scored again, into the same runs). `lease` (storage.lease.LeaseRef of the folder written)
    is checked before each file written: a command that lost the folder to another stops there
    (LeaseLost), as a workflow stops before its records."""
    import ray  # here: the job and test-set types above load without Ray

    if not ray.is_initialized():
        log.info(ray_join.start_or_join(submit="python -m workflows.evaluation ..."))
    _check_room([(f"{j.name} on {j.test_set.name}", j.num_cpus, j.num_gpus) for j in jobs],
                ray.nodes())
    names = [(j.name, j.test_set.name) for j in jobs]
    if len(set(names)) != len(names):
        raise ValueError("two jobs share a (job name, test set name); the child runs and "
                         "hypotheses files are named after them")
    # An averaging job scores its average, computed once on the driver (the workflows stage
    # every job before, into the run's weights/ folder; here what is left goes to out_dir).
    unstaged = [j for j in jobs if j.kind == "average" and not j.staged]
    if unstaged:
        if lease is not None:
            lease.check("staging the averaged weights in weights/")
        done = {j.name: j for j in stage_weights(unstaged, location(out_dir) / "weights")}
        jobs = [dataclasses.replace(j, staged=done[j.name].staged) if j in unstaged else j
                for j in jobs]
    jobs = share_cpus(jobs, _free_cpus_per_node())  # idle CPUs go to the jobs there are
    uri = resolve_tracking_uri(tracking_uri)
    given = run_ids or {}
    exp = None if len(given) == len(jobs) else \
        _experiment_name(uri, parent_run_id, experiment_name)
    run_ids, datasets = {}, {}
    ended: set[EvalJob] = set()  # jobs whose run is ended (FINISHED, FAILED) here
    pending: dict = {}  # task -> job, for the tasks not read yet
    try:
        for job in jobs:
            pair = (job.name, job.test_set.name)
            if pair in given:
                run_ids[job] = given[pair]
                set_tags(uri, given[pair], {"convs2s.eval.kind": job.kind})
            else:  # keyed by where its hypotheses go (<out_dir>/<job>/<test>, as the run tree)
                run_ids[job] = _run_of(uri, exp, job, out_dir, parent_run_id)
            if job.test_set not in datasets:
                datasets[job.test_set] = dataset_of(job.test_set)
            describe_run(uri, run_ids[job], _job_params(job), [datasets[job.test_set]],
                         [job.model_id] if job.model_id else [])
            set_tags(uri, run_ids[job], {"convs2s.eval.num_cpus": str(job.num_cpus),
                                         "convs2s.eval.num_gpus": str(job.num_gpus)})
        # Scheduled on the cluster, never inside the caller's placement group: a sweep's trial
        # (a Ray Tune actor) captures its child tasks into its own group, which has no CPU for them.
        task = ray.remote(evaluate_job)
        pending = {task.options(num_cpus=job.num_cpus, num_gpus=job.num_gpus,
                                scheduling_strategy="DEFAULT").remote(_for_task(job)): job
                   for job in jobs}
        results, failures = [], []
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ref)
            try:
                out = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - log the failure, keep collecting the others
                first = redact_text(str(err).strip().splitlines()[-1])[:500] if str(err) \
                    else type(err).__name__
                failures.append(f"{job.name}/{job.test_set.name}: {first}")
                end_run(uri, run_ids[job], "FAILED")
                ended.add(job)
                continue
            if lease is not None:
                lease.check(f"writing {job.name}/{job.test_set.name}'s hypotheses")
            results.append(_finish(uri, run_ids[job], job, out, location(out_dir),
                                   datasets[job.test_set]))
            ended.add(job)
            if on_result is not None:
                on_result(results[-1])
    except BaseException as err:
        # Ctrl-C (`python -m workflows.evaluation` has no run_stages to end its runs), a stop,
        # or an error while logging a result: every run opened here and not ended yet is ended
        # as the rest of the code ends a stopped run (KILLED / FAILED), never left RUNNING
        status = stopped_status(err)
        for ref in pending:  # the tasks still going: nobody will read them
            ray.cancel(ref)
        for job, run_id in run_ids.items():
            if job not in ended:
                end_run(uri, run_id, status)
        raise
    if failures and raise_on_error:
        raise EvaluationFailed("evaluation jobs failed:\n  " + "\n  ".join(failures))
    order = {job: i for i, job in enumerate(jobs)}
    return sorted(results, key=lambda r: order[r.job])


def _for_task(job: EvalJob) -> EvalJob:
    """`job` as its Ray task must be given it: the test set's local files absolute (a task runs
    in the folder its node's `ray start` ran in, not the caller's)."""
    test = job.test_set
    return dataclasses.replace(job, test_set=dataclasses.replace(
        test, src=worker_path(test.src), ref=worker_path(test.ref)))


def _run_of(uri: str, exp: str, job: EvalJob, out_dir, parent_run_id: str | None) -> str | None:
    """The run of `job` keyed by where its hypotheses go (<out_dir>/<job>/<test>, as the run
    tree keys its runs): the same evaluation again logs into its run; a run there that
    describes another one (other checkpoints, search or test files under the same job and test
    names and --out) is set apart first, keeping its params, scores and hypotheses, and this
    one gets a run of its own (logged into the old run, its params would still name the old
    evaluation). The resources a job was given are not what it is."""
    from convs2s.tracking.runs import find_run, flatten_params, params_differ, supersede_run

    key = run_key(location(out_dir) / job.name / job.test_set.name)
    name = f"eval/{job.name}/{job.test_set.name}"
    identity = _identity(job)
    # (looked at as it is before it is reopened: one set apart keeps its status)
    if found := find_run(uri, exp, key):
        differ = params_differ(uri, found[0], flatten_params(_job_params(job)))
        # The params show paths' last two parts (train/best: every run's best model); what
        # the run scored is named in full, with the files' versions, by a tag: another run's
        # checkpoints, or new weights under the same path, are another evaluation
        if (old := _tag_of(uri, found[0], IDENTITY_TAG)) is not None and old != identity:
            differ.append("checkpoints or test files (their paths or versions)")
        if differ:
            supersede_run(uri, found[0], key, name, "other " + ", ".join(differ[:5]),
                          status=found[1])
    run_id = find_or_create_run(uri, exp, run_key=key, run_name=name,
                                parent_run_id=parent_run_id,
                                tags={"convs2s.eval.kind": job.kind})
    set_tags(uri, run_id, {IDENTITY_TAG: identity})
    return run_id


def _identity(job: EvalJob) -> str:
    """A digest of what a job scores: its checkpoints' full paths and versions (size, mtime),
    its test files' full paths and versions."""
    from convs2s.io.staging import weights_stamp
    from storage.paths import stamp

    def version(path):
        try:
            return [str(location(path)), *stamp(path)]
        except (FileNotFoundError, StorageError):
            return [str(path), None, None]

    what = {"weights": weights_stamp([str(location(c)) for c in job.checkpoints]),
            "test": [version(job.test_set.src), version(job.test_set.ref)]}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _tag_of(uri: str, run_id: str | None, key: str) -> str | None:
    """Run `run_id`'s tag `key`, None where it has none or cannot be read."""
    from convs2s.tracking.runs import bounded_http, mlflow_client

    try:
        with bounded_http():
            return mlflow_client(uri).get_run(run_id).data.tags.get(key) if run_id else None
    except Exception:  # noqa: BLE001 - tracking unreachable: nothing is logged either
        return None


def _finish(uri: str, run_id: str | None, job: EvalJob, out: dict, out_dir,
            dataset: DatasetRecord) -> EvalResult:
    """Write the hypotheses and pictures (a folder, or a bucket), log them and the metrics,
    close the child run."""
    job_dir = out_dir / job.name  # (write_whole makes the folders)
    hyp_path = job_dir / f"{job.test_set.name}.{job.test_set.tgt_lang}"
    # whole or not at all: a rescore (a larger --attention) rewrites the file a standing record
    # names, and a kill mid-write must not leave it cut short under that record
    write_whole(hyp_path, "".join(h + "\n" for h in out["hypotheses"]).encode("utf-8"))
    pngs = []
    for name, data in out["pngs"].items():
        png = job_dir / "attention" / f"{job.test_set.name}_{name}"
        write_whole(png, data)
        pngs.append(str(png))
    _log_result(uri, run_id, job, out, dataset)
    log_artifacts(uri, run_id, str(hyp_path), "hypotheses")
    for png in pngs:
        log_artifacts(uri, run_id, png, "attention")
    end_run(uri, run_id, "FINISHED")
    m, headline = out["metrics"], task_kind(job.test_set.task_kind).headline
    log.info("%s/%s: %s %.2f, %.1f sentences/s", job.name, job.test_set.name, headline,
             m[headline], m["sentences_per_second"])
    return EvalResult(job=job, metrics=m, hyp_path=str(hyp_path), run_id=run_id,
                      attention_pngs=pngs)


# --- ensembling jobs (paper §5.2 and the reference's checkpoint averaging) -----------------------


def best_checkpoints(run_dirs: list[str]) -> tuple[str, ...]:
    """The best checkpoint (lowest validation loss) of each training run."""
    bests = []
    for run_dir in run_dirs:
        info = best_checkpoint(run_dir)
        if info is None:
            hint = "; a checkpoint folder goes to --checkpoint NAME=DIR" if (
                location(run_dir) / "checkpoint.pt").is_file() else ""
            raise FileNotFoundError(f"{run_dir} has no best/ checkpoint and no checkpoint with "
                                    f"a validation loss: train it first{hint}")
        if location(info.path).name != "best":  # said, never a silent substitute
            log.warning("%s has no best/: scoring %s (the lowest validation loss kept, %.4f) "
                        "as its best", run_dir, location(info.path).name, info.val_loss)
        bests.append(info.path)
    return tuple(bests)


def last_checkpoints(run_dir: str, last_n: int,
                     epoch_ends_only: bool = False) -> tuple[str, ...]:
    """The last `last_n` kept checkpoints of one run (fewer, with a warning, if it keeps
    fewer)."""
    infos = pick_checkpoints(list_checkpoints(run_dir), last=last_n,
                             epoch_ends_only=epoch_ends_only)
    if not infos:
        raise FileNotFoundError(f"{run_dir} keeps no checkpoint_* directories to average")
    if len(infos) < last_n:
        log.warning("%s keeps %d checkpoints, fewer than last_n=%d: averaging those",
                    run_dir, len(infos), last_n)
    return tuple(i.path for i in infos)


def averaging_job(name: str, run_dir: str, last_n: int, test_set: TestSet,
                  search: SearchConfig | None = None, epoch_ends_only: bool = False,
                  **resources) -> EvalJob:
    """The weight average of the last `last_n` kept checkpoints of one run."""
    return EvalJob(name, last_checkpoints(run_dir, last_n, epoch_ends_only), test_set,
                   search or SearchConfig(), average=True, **resources)


def evaluation_jobs(run_dirs: list[str], test_sets: list[TestSet], average_last: int = 5,
                    search: SearchConfig | None = None, attention_sentences: int = 0,
                    **resources) -> list[EvalJob]:
    """Every job the paper's evaluation asks for, per test set: each run's best checkpoint
    (`best`), the weight average of its last `average_last` checkpoints (`avg_last<n>`, when
    it keeps more than one) and, with several runs, the ensemble of their bests (`ensemble_<k>`,
    paper §5.2). With several runs the per-run jobs are named `run1_best`, `run2_avg_last5`,
    ... (`run_prefix`). The workflows and the command line below both build jobs here."""
    per_run = []  # (name, checkpoints, average): decided once for every test set
    for k, run_dir in enumerate(run_dirs):
        prefix = run_prefix(k, len(run_dirs))
        per_run.append((f"{prefix}best", best_checkpoints([run_dir]), False))
        # (states, not folders: an interval's checkpoint and its epoch end's at one update
        # are one set of weights, whose "average" would be the best model scored again)
        if average_last and len(pick_checkpoints(list_checkpoints(run_dir))) > 1:
            per_run.append((f"{prefix}avg_last{average_last}",
                            last_checkpoints(run_dir, average_last), True))
        elif average_last:
            log.info("%savg_last%d not scored: %s keeps the weights of one update", prefix,
                     average_last, run_dir)
    if len(run_dirs) > 1:
        per_run.append((f"ensemble_{len(run_dirs)}", best_checkpoints(run_dirs), False))
    search = search or SearchConfig()
    return [EvalJob(name, checkpoints, test, search, average=average,
                    attention_sentences=attention_sentences, **resources)
            for test in test_sets for name, checkpoints, average in per_run]


def run_prefix(k: int, n_runs: int) -> str:
    """The job-name prefix of the k-th (from 0) of n training runs: none for a single run."""
    return "" if n_runs == 1 else f"run{k + 1}_"
