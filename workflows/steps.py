"""The three stages of a paper-task workflow, each tracked as an MLflow child run of the
workflow's parent run: preprocess (Ray Data), train (Ray Train, one run per ensemble member)
and evaluate (parallel Ray tasks, one per (weights, test set) pair). Each stage skips what an
earlier invocation of the same run finished (workflows/run_state.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass

from convs2s.config import TrainConfig
from convs2s.io.staging import weights_stamp
from convs2s.tracking.runs import log_final_metrics, run_has_metrics
from preprocessing.config import PreprocessConfig
from storage import location, write_whole
from workflows.errors import SpecError
from workflows.run_spec import RunSpec, preprocess_params, schedule_note
from workflows.run_state import HOW_NOT_WHAT, StageContext, digest, train_names

log = logging.getLogger("workflows")

# How long training may wait to place its workers again after losing some (a node lost and
# not yet replaced by the autoscaler) before the run stops, resumable (TrainJob).
PLACEMENT_WAIT_S = float(os.environ.get("CONVS2S_PLACEMENT_WAIT_S", 900))


@dataclass
class EvalScore:
    job: str
    test_set: str
    metrics: dict[str, float]
    run_id: str | None
    hyp_path: str
    skipped: bool = False  # scored by an earlier invocation of the same run


def preprocess_stage(ctx: StageContext, pre: PreprocessConfig, init_from: str | None = None):
    """Every preprocessing stage as Ray Data jobs (finished stages are skipped by manifest).
    Fine-tuning (`init_from`, a checkpoint directory) encodes with that model's vocabulary
    instead of learning a BPE."""
    from convs2s.io.text_codec import CheckpointVocabulary
    from convs2s.tracking.runs import end_run, log_artifacts, stopped_status
    from preprocessing.pipeline import run_pipeline

    vocabulary = CheckpointVocabulary(init_from) if init_from else None
    run_id = ctx.tree.child("preprocess", "preprocess")
    params = {"preprocess": preprocess_params(pre)}
    if vocabulary is not None:
        params["vocabulary"] = {"from": vocabulary.folder, "kind": vocabulary.kind,
                                "fingerprint": vocabulary.fingerprint}
    ctx.tree.describe(run_id, params)
    log.info("== preprocess: %s -> %s/%s%s", pre.source, pre.root, pre.task,
             f" with the vocabulary of {init_from}" if init_from else "")
    t0 = time.monotonic()
    try:
        out = run_pipeline(pre, vocabulary=vocabulary,
                           revision_names=(ctx.state().get("data_keyed_by"),))
    except BaseException as err:
        end_run(ctx.tree.uri, run_id, stopped_status(err))
        raise
    metrics = {"vocab_size": out.vocab_size, "seconds": time.monotonic() - t0}
    for split in out.batches:
        clean, batches = out.manifests[f"clean/{split}"], out.manifests[f"batches/{split}"]
        metrics.update({f"{split}.rows_in": clean["rows_in"],
                        f"{split}.rows_kept": batches["rows_kept"],
                        f"{split}.batches": batches["batches"],
                        f"{split}.padding_efficiency": batches["padding_efficiency"],
                        f"{split}.src_tokens": batches["tokens"]["src_tokens"],
                        f"{split}.tgt_tokens": batches["tokens"]["tgt_tokens"]})
    # Resumed with every stage up to date: the run keeps the figures of the call that made
    # the data (logged again, its `seconds` became the time of this call's skipping)
    if out.ran or run_has_metrics(ctx.tree.uri, run_id) is False:
        log_final_metrics(ctx.tree.uri, run_id, metrics)
    manifests = ctx.run_dir / "preprocess_manifests.json"  # a file, or an object in a bucket
    write_whole(manifests, json.dumps(out.manifests, indent=1, default=str).encode())
    log_artifacts(ctx.tree.uri, run_id, str(manifests), "manifests")
    end_run(ctx.tree.uri, run_id, "FINISHED")
    return out


def train_stage(ctx: StageContext, spec: RunSpec, out, datasets: list = (),
                tags: dict | None = None) -> list:
    """One Ray Train run per ensemble member; a run finished with the same settings is skipped.
    `datasets` (convs2s.tracking.runs.DatasetRecord) are logged as each run's MLflow inputs, `tags`
    set on each run."""
    from convs2s.train.data import check_updates_fill
    from convs2s.train.job import Diverged, RunRefused, TrainJob, TrainResult
    from convs2s.train.launch import fit
    from convs2s.train.memory_fit import BudgetTooLarge

    results = []
    for k, name in enumerate(train_names(spec.ensemble.runs)):
        train = spec.train.replace(seed=spec.train.seed + k)  # members differ only in the seed
        b = out.manifests["batches/train"]
        key, identity = train_key(spec, train, b), train_identity(spec, train, b)
        state = ctx.state()
        done = state["train"].get(name)
        if done and (done["key"] in (key, train_key(spec, train, b, recorded_before=True))
                     or same_training(done.get("identity"), identity)) \
                and location(done["result"]["run_dir"]).is_dir():
            log.info("== %s: finished earlier with the same settings, skipped", name)
            ctx.skipped.append(name)
            results.append(TrainResult(**done["result"]))
            ctx.tree.adopt(done["result"].get("run_id"))
            continue
        log.info("== %s: %d worker(s)%s, %s, %s", name, spec.num_workers,
                 " with a GPU each" if spec.use_gpu
                 else f" on CPU ({spec.cpus_per_worker:g} threads each)",
                 _update(spec, train), _limits(train))
        if spec.update_note:
            log.warning("%s: %s", name, spec.update_note)
        if note := schedule_note(train):
            log.warning("%s: %s", name, note)
        if note := sentences_fill_note(spec, b):
            log.warning("%s: %s", name, note)
        try:  # the same check fit makes, as the command line's one line (exit 2)
            check_updates_fill(out.manifests["batches/train"]["batches"], spec.num_workers,
                               train.update_freq)
        except ValueError as err:
            raise SpecError(f"{name}: {err}") from None
        train_tags = {**(tags or {}), "convs2s.stage": "train"}
        job = TrainJob(model=spec.model, train=train, train_data=out.batches["train"],
                       valid_data=out.batches["valid"], spm_model=out.spm_model,
                       vocab_size=out.vocab_size, storage_path=str(ctx.run_dir), run_name=name,
                       num_workers=spec.num_workers, use_gpu=spec.use_gpu,
                       cpus_per_worker=spec.cpus_per_worker, tracking_uri=ctx.tree.uri,
                       experiment_name=ctx.tree.experiment, parent_run_id=ctx.tree.parent,
                       run_id=ctx.tree.child(name, "train", train_tags),
                       data_manifest=_data_summary(out),
                       datasets=tuple(datasets), tags=train_tags,
                       system_metrics_s=spec.system_metrics_s, init_from=spec.init_from,
                       tgt_vocab_size=out.tgt_vocab_size, text_files=out.text_files,
                       accelerator_type=spec.accelerator_type,
                       placement_wait_s=PLACEMENT_WAIT_S, lease=ctx.lease)
        try:
            result = fit(job)
        except (BudgetTooLarge, RunRefused, Diverged) as err:  # a GPU cannot hold the
            # batches, the data or run folder is not what the run can train from, or training
            # diverged: one line, exit 2
            raise SpecError(f"{name}: {err}") from None
        if result.best_checkpoint is None:
            raise RuntimeError(f"{name}: training finished without a checkpoint in "
                               f"{result.run_dir}; see its metrics.jsonl and the Ray logs")
        state = ctx.state()
        state["train"][name] = {"key": key, "identity": identity,
                                "result": dataclasses.asdict(result)}
        # The scores and logged models of the weights before (a continued run's) are kept:
        # `evaluate_stage` compares each pair's weights stamp, sets apart the run of a pair
        # whose weights changed and scores it in a new one (dropped here, the pair was scored
        # again into its old run: a second value of each metric beside params naming the old
        # weights), and skips a pair whose weights did not (a best/ the new updates kept).
        ctx.save_state(state)
        results.append(result)
    return results



def train_key(spec: RunSpec, train: TrainConfig, batches: dict,
              recorded_before: bool = False) -> str:
    """What a finished training run was trained as: the model, the optimization with its
    budgets, the update's size as micro-batches over all workers, the data and the weights it
    started from. Not how it trained (HOW_NOT_WHAT), nor how the update's micro-batches were
    shared out: a rerun that only checkpoints more often, or runs on 4 GPUs accumulating 2
    micro-batches each where 8 did one, finds the run finished (which fit would have opened,
    placed its workers for and ended at once, its final validation figures lost).
    `recorded_before`: the key as runs recorded it before (every training setting, the
    update_freq alone), which a finished run of then still matches."""
    if recorded_before:
        return digest({"model": spec.model.to_dict(), "train": train.to_dict(),
                       "data": [batches["config_hash"], batches["input_fingerprint"]],
                       **({"init_from": spec.init_from} if spec.init_from else {})})
    return digest(train_identity(spec, train, batches))


def train_identity(spec: RunSpec, train: TrainConfig, batches: dict) -> dict:
    """What `train_key` digests, as workflow.json records it beside the key (`same_training`)."""
    t = train.to_dict()
    for k in HOW_NOT_WHAT:
        if k.startswith("train."):
            t.pop(k.removeprefix("train."))
    t["micro_batches"] = spec.num_workers * t.pop("update_freq")
    return {"model": spec.model.to_dict(), "train": t,
            "data": [batches["config_hash"], batches["input_fingerprint"]],
            **({"init_from": spec.init_from} if spec.init_from else {})}


def same_training(recorded, identity: dict) -> bool:
    """Whether a finished run's recorded `train_identity` is `identity`, a model or training
    field only one of them has aside: one a newer version of the code added, with the earlier
    behaviour as its default (the key changed with it, and every finished run of a sweep or a
    workflow trained again after a code update), or retired. (--init-from on one side only is
    a change.)"""
    if not isinstance(recorded, dict):
        return False
    now = json.loads(json.dumps(identity, default=str))  # (as recorded: tuples are lists)
    if set(recorded) != set(now):
        return False
    for k, value in now.items():
        was = recorded[k]
        if isinstance(was, dict) and isinstance(value, dict):
            if any(was[f] != value[f] for f in was.keys() & value.keys()):
                return False
        elif was != value:
            return False
    return True


def evaluate_stage(ctx: StageContext, spec: RunSpec, out,
                   trained: list) -> tuple[list[EvalScore], dict[str, str]]:
    """Score every (checkpoint | average | ensemble) x test set as parallel Ray tasks, each set
    of weights an MLflow logged model that its scores link to. Returns the scores and
    {job name: logged model id}."""
    from convs2s.metrics.task_kinds import task_kind
    from workflows.evaluation import (TestSet, dataset_of, evaluate_all, evaluation_jobs,
                                      stage_weights)
    from workflows.lineage import log_job_models

    tests = []
    for split, test_name in spec.test_sets.items():
        src, ref = out.text[split]
        tests.append(TestSet(test_name, src, ref, tgt_lang=spec.data.tgt_lang,
                             task_kind=spec.task_kind))
    search = spec.search
    if search.shortlist is None and spec.data.shortlist_per_source and out.shortlist:
        # the lexical table the run's data.shortlist_per_source asked for: searched with
        # (it was built, and scoring searched the whole vocabulary)
        search = search.replace(shortlist=out.shortlist)
        log.info("== evaluate: vocabulary selection with the run's lexical table (%s)",
                 out.shortlist)
    jobs = evaluation_jobs([r.run_dir for r in trained], tests, spec.ensemble.average_last,
                           search, spec.attention, num_cpus=spec.eval_cpus,
                           num_gpus=spec.eval_gpus)
    # Each job's weights (a checkpoint's inference copy, an average, ensemble members) are
    # written once under the run folder: the evaluation tasks score those files and the
    # logged model is made from them.
    if ctx.lease is not None:  # (a command that lost the folder writes nothing there)
        ctx.lease.check("staging the weights in weights/")
    jobs = stage_weights(jobs, ctx.run_dir / "weights")
    source_runs = {j.name: _source_run(j.checkpoints, trained, ctx.tree.parent) for j in jobs}
    state = ctx.state()
    models = {}
    if ctx.tree.parent is not None:  # tracking answers: one logged model per set of weights
        models = log_job_models(ctx.tree.uri, jobs, source_runs, ctx.run_dir.name,
                                search.to_dict(), state["models"],
                                on_logged=lambda: ctx.save_state(state))
        jobs = [dataclasses.replace(j, model_id=models.get(j.name)) for j in jobs]
    done, todo = [], []
    # A score stands while its weights and its test text are the ones scored (the text by
    # content: an edited source or reference file is scored again), and the scoring that
    # computed it is this one (the task kind's scoring_version: ROUGE's records stand when
    # BLEU's tokenization changes), and it drew the attention pictures asked for now (a rerun
    # with a larger --attention scores the pair again, drawing them).
    texts = {t.name: dataset_of(t).digest for t in tests}
    scoring = task_kind(spec.task_kind).scoring_for(spec.data.tgt_lang)
    for job in jobs:
        rec = state["eval"].get(f"{job.name}/{job.test_set.name}")
        stamp, text = weights_stamp(job.checkpoints), texts[job.test_set.name]
        # (a tracking server that does not answer keeps the score: its run is not known to
        # be gone, and beam searches of hours were made again at every rerun during an outage)
        if score_stands(rec, stamp, text, scoring, job.attention_sentences, job.model_id) \
                and (ctx.tree.parent is None
                     or run_has_metrics(ctx.tree.uri, rec["run_id"]) is not False):
            done.append(EvalScore(job.name, job.test_set.name, rec["metrics"], rec["run_id"],
                                  rec["hyp_path"], skipped=True))
            ctx.tree.adopt(rec["run_id"])
            continue
        if rec and rec.get("run_id") and (rec["stamp"] != stamp or rec.get("text") != text):
            # Its run describes other weights (a continued run's new average under the same
            # job name) or another test text: it keeps those params, scores and hypotheses,
            # set apart, and the pair is scored in a run of its own (scored again in the same
            # run, its params would still name the old checkpoints).
            ctx.tree.supersede(rec["run_id"], f"eval/{job.name}/{job.test_set.name}",
                               "other weights" if rec["stamp"] != stamp else "another test text")
        todo.append(job)
    if done:
        log.info("== evaluate: %d (job, test set) pairs scored earlier, skipped", len(done))
        ctx.skipped += [f"eval/{s.job}/{s.test_set}" for s in done]
    if todo:
        log.info("== evaluate: %d jobs as parallel Ray tasks (%s)", len(todo),
                 ", ".join(f"{j.name}/{j.test_set.name}" for j in todo))
        # The tree makes their runs: eval/<job>/<test set>, keyed by where the hypotheses go.
        run_ids = {(j.name, j.test_set.name): ctx.tree.child(f"eval/{j.name}/{j.test_set.name}",
                                                             "eval")
                   for j in todo}

        def record(r) -> None:
            """Each score in workflow.json as it is logged: a pair that fails, or a stop,
            leaves the finished pairs recorded (recorded at the end, a rerun scored them all
            again, each metric a second time in the same run)."""
            state = ctx.state()
            state["eval"][f"{r.job.name}/{r.job.test_set.name}"] = {
                "stamp": weights_stamp(r.job.checkpoints), "run_id": r.run_id,
                "text": texts[r.job.test_set.name], "scoring": scoring,
                "attention": r.job.attention_sentences, "model_id": r.job.model_id,
                "metrics": r.metrics, "hyp_path": r.hyp_path}
            ctx.save_state(state)

        results = evaluate_all(todo, ctx.tree.uri, parent_run_id=ctx.tree.parent,
                               out_dir=str(ctx.run_dir / "eval"),
                               experiment_name=ctx.tree.experiment, run_ids=run_ids,
                               on_result=record, lease=ctx.lease)
        done += [EvalScore(r.job.name, r.job.test_set.name, r.metrics, r.run_id, r.hyp_path)
                 for r in results]
    order = {(j.name, j.test_set.name): i for i, j in enumerate(jobs)}
    return sorted(done, key=lambda s: order[(s.job, s.test_set)]), models


def score_stands(rec: dict | None, stamp, text: str, scoring: int, attention: int,
                 model_id: str | None = None) -> bool:
    """Whether an evaluation record (workflow.json's `eval` entry) is still the score of these
    weights (`stamp`) on this test text (its digest), by this scoring version, with at least
    `attention` sentences' pictures drawn, logged on the logged model `model_id` (a model
    logged again, its first one deleted, has none of its scores: the champion would have
    nothing to compare). (Records from before a key existed: scoring 1, no pictures, any
    model.)"""
    return bool(rec) and rec["stamp"] == stamp and rec.get("text") == text \
        and rec.get("scoring", 1) == scoring and rec.get("attention", 0) >= attention \
        and (model_id is None or rec.get("model_id", model_id) == model_id)


def _source_run(checkpoints, trained: list, parent: str | None) -> str | None:
    """The training run whose folder holds all the checkpoints; for an ensemble of several
    runs, the workflow's parent run."""
    owners = {r.run_id for r in trained for c in checkpoints
              if location(c).parent == location(r.run_dir)}
    return owners.pop() if len(owners) == 1 else parent


def _update(spec: RunSpec, train: TrainConfig) -> str:
    """What one update trains: workers x micro-batches x tokens per batch (a padded budget),
    or sentences per batch for a preset whose update is a number of sentences."""
    if spec.update_sentences:  # batches cut by sentences (Gigaword)
        n = spec.num_workers * train.update_freq * spec.data.max_sentences
        return (f"update {spec.num_workers} x {train.update_freq} x "
                f"{spec.data.max_sentences:,} = at most {n:,} sentences"
                + (" (the preset's)" if n == spec.update_sentences else ""))
    tokens = spec.num_workers * train.update_freq * spec.data.max_tokens
    return (f"update {spec.num_workers} x {train.update_freq} x {spec.data.max_tokens:,} = "
            f"{tokens:,} tokens" + (" (the preset's)" if tokens == spec.update_tokens else ""))


def sentences_fill_note(spec: RunSpec, batches: dict) -> str | None:
    """For a preset whose update is a number of sentences (`update_sentences`), a line when
    the token budget closes the training batches well before `max_sentences` (a
    `--set data.max_tokens` too small for the documents: Gigaword's default 4,000 held 77 of
    its 128 on average), read from the batches' manifest (`batches/train`); else None."""
    cap, n = spec.data.max_sentences, int(batches.get("batches") or 0)
    if not spec.update_sentences or not cap or not n:
        return None
    mean = int(batches.get("rows_kept") or 0) / n
    if mean >= 0.9 * cap:
        return None
    return (f"the training batches hold {mean:.0f} sentences on average, not the "
            f"{cap:,} of the preset's update: data.max_tokens={spec.data.max_tokens:,} closes "
            "them first (a larger budget keeps the update)")


def _limits(train: TrainConfig) -> str:
    parts = [f"max_epochs={train.max_epochs}"] if train.max_epochs else []
    parts += [f"max_updates={train.max_updates}"] if train.max_updates else []
    parts += [f"max_time={train.max_time:g}s"] if train.max_time else []
    return ", ".join(parts + [f"lr={train.lr}", f"schedule={train.lr_schedule}"])


def _data_summary(out) -> dict:
    m = out.manifests
    return {"vocab_size": out.vocab_size,
            **{f"{s}_rows": m[f"batches/{s}"]["rows_kept"] for s in out.batches},
            **{f"{s}_batches": m[f"batches/{s}"]["batches"] for s in out.batches}}

