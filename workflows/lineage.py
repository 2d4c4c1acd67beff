"""What MLflow links together for a workflow run: the datasets each run read, one logged model
per evaluated set of weights (its scores are metrics of that model on each test set), and the
task's registered model whose `champion` alias names the best of them.

    datasets = data_inputs(out, source="demo", task="wmt14_en_fr")  # train + valid batches
    models = log_job_models(uri, jobs, source_runs, run_name, search.to_dict(),
                            state["models"])                 # {job name: model id}
    champion = register_champion(uri, registered_name("wmt14_en_fr", "demo_test"), scores,
                                 models, "demo_valid", "bleu", report_on="demo_test")
    champion.uri     # models:/wmt14_en_fr-demo_test@champion

In the MLflow UI (experiment marked as model training, so it opens on its runs): the runs
table's Dataset column shows train/valid (and each evaluation run's test set), its Models
column the models each training run produced; the experiment's Models tab lists every logged
model with its BLEU per test set; the registry holds `<task>-<test set>` with the alias
`champion`, moved only by a better model on the same validation data: the champion is chosen
on the validation set (scored like a test set), never on the test set it is reported on.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

from convs2s.tracking.runs import (
    DatasetRecord,
    bounded_http,
    flatten_params,
    global_tracking_uri,
    mlflow_client,
)
from convs2s.tracking.redact import redact_text
from storage import local_copy
from storage.settings import env_seconds
log = logging.getLogger("workflows")

CHAMPION = "champion"


def data_inputs(out, source: str, task: str) -> list[DatasetRecord]:
    """The training and validation batches of a preprocessing output (PipelineOutput) as
    MLflow datasets: the digest is the batches stage's identity (its config hash and input
    fingerprint), the profile its counts."""
    records = []
    for split, context in (("train", "training"), ("valid", "validation")):
        m = out.manifests[f"batches/{split}"]
        profile = {"origin": source, "rows": m["rows_kept"], "batches": m["batches"],
                   "src_tokens": m["tokens"]["src_tokens"],
                   "tgt_tokens": m["tokens"]["tgt_tokens"],
                   "padding_efficiency": m["padding_efficiency"],
                   "max_tokens": m["max_tokens"], "vocab_size": m.get("vocab_size")}
        records.append(DatasetRecord(f"{task}/{split}",
                                     f"{m['config_hash'][:8]}{m['input_fingerprint'][:8]}",
                                     str(out.batches[split]), profile, context))
    return records


def model_name(run_name: str, job: str) -> str:
    """A logged model's name: the workflow run and the job (MLflow refuses / : . % and quotes)."""
    return re.sub(r"[/:.%\"']", "-", f"{run_name}-{job}")


def log_job_models(uri: str, jobs: list, source_runs: dict[str, str | None], run_name: str,
                   search_params: dict, known: dict, on_logged=None) -> dict[str, str]:
    """One logged model per job name (the same weights serve every test set): the pyfunc
    translator of its checkpoints (averaged when the job averages). `source_runs` maps a job
    name to the run that produced the weights; `known` ({job: {"stamp", "model_id"}}, the
    workflow's resume state) holds models logged earlier, reused while their stamp matches and
    they still exist. Returns {job name: model id}; a job whose model cannot be logged is left
    out after a warning (its scores are still logged on its run). `on_logged()` is called after
    each new model is in `known` (the workflow saves its state there: a run stopped between
    two jobs' models logged the first again, as a duplicate without scores)."""
    from mlflow.tracking import MlflowClient

    from convs2s.io.staging import weights_stamp
    from convs2s.serving.pyfunc import log_translator
    from workflows.evaluation import short_path

    client = MlflowClient(uri)
    out: dict[str, str] = {}
    tried: set[str] = set()  # one attempt per job name (it recurs once per test set)
    for job in jobs:
        if job.name in tried:
            continue
        tried.add(job.name)
        stamp = [weights_stamp(job.checkpoints), job.average, search_params]
        rec = known.get(job.name)
        if rec and rec["stamp"] == stamp and _exists(client, rec["model_id"]):
            out[job.name] = rec["model_id"]
            continue
        params = flatten_params({"job": job.name, "kind": job.kind,
                                 "checkpoints": ",".join(map(short_path, job.checkpoints)),
                                 "search": search_params})
        try:
            with bounded_http():
                # The staged files, as the evaluation tasks score them.
                # (A bucket's folders: their local copies, fetched once per node.)
                served = log_translator([str(local_copy(p)) for p in
                                         job.staged or job.checkpoints], job.search,
                                        tracking_uri=uri, run_id=source_runs.get(job.name),
                                        name=model_name(run_name, job.name),
                                        average=job.average and not job.staged,
                                        as_is=bool(job.staged), params=params,
                                        tags={"convs2s.job": job.name,
                                              "convs2s.workflow_run": run_name})
        except Exception as err:  # noqa: BLE001 - the scores are still logged on the runs
            log.warning("could not log %s as an MLflow model (%s: %s); its scores stay on "
                        "its evaluation runs", job.name, type(err).__name__,
                        redact_text(str(err).splitlines()[0])[:300] if str(err) else "")
            continue
        out[job.name] = served.model_id
        if rec and rec.get("model_id") and rec["model_id"] != served.model_id:
            # The model it replaces (new weights under the job's name: a continued run's new
            # average, a restart) keeps its name: said on it, for the Models view to tell
            _mark_superseded(client, rec["model_id"], served.model_id)
        known[job.name] = {"stamp": stamp, "model_id": served.model_id}
        if on_logged is not None:
            on_logged()
    return out


SUPERSEDED_TAG = "convs2s.superseded"


def _mark_superseded(client, model_id: str, by: str) -> None:
    """Tag a logged model replaced by another of the same name; a failure only warns (the
    new model and its scores stand)."""
    try:
        with bounded_http():
            client.set_logged_model_tags(model_id, {SUPERSEDED_TAG: (
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: replaced by {by} (the job's weights "
                "changed)")})
    except Exception as err:  # noqa: BLE001 - deleted since, or the server is gone
        log.warning("could not mark the replaced model %s (%s)", model_id, type(err).__name__)


REPLACED_TAG = "convs2s.replaced"


def mark_replaced(uri: str, model_ids: list[str], why: str) -> None:
    """Tag the logged models of weights a --restart set aside (`why`: what changed, where they
    went): the new run's models of the same names are logged beside them, and nothing told
    the two apart. A failure only warns."""
    if not model_ids:
        return
    try:
        with bounded_http():
            client = mlflow_client(uri)
            for model_id in model_ids:
                client.set_logged_model_tags(model_id, {REPLACED_TAG: why})
    except Exception as err:  # noqa: BLE001 - deleted since, or the server is gone
        log.warning("could not mark the replaced models %s (%s)", model_ids,
                    type(err).__name__)


def _exists(client, model_id: str) -> bool:
    from mlflow.entities import LoggedModelStatus

    try:
        with bounded_http():
            return client.get_logged_model(model_id).status == LoggedModelStatus.READY
    except Exception:  # noqa: BLE001 - deleted, or the server is gone: log it again
        return False


def registered_name(workflow: str, test_set: str) -> str:
    """The registered model of a workflow's models scored on one test set: only scores on the
    same test set compare, so a smoke run (demo_test) never touches the paper runs' model
    (newstest2014): `wmt14_en_fr-newstest2014`, `wmt14_en_fr-demo_test`."""
    return model_name(workflow, test_set)


@dataclass
class Champion:
    name: str  # registered model: <workflow>-<test set>
    version: str  # the version the alias names after this run
    job: str  # this run's best job
    metric: str
    value: float  # the champion's score on `test_set` (this run's when moved)
    test_set: str  # the validation set it is chosen on
    moved: bool  # the alias now names this run's model
    reason: str = ""  # why it moved or stayed, for the summary
    reported_on: str | None = None  # the test set its score is reported on
    reported: float | None = None  # this run's best job's score there

    @property
    def uri(self) -> str:
        return f"models:/{self.name}@{CHAMPION}"


# Seconds between setting the champion alias and reading it back (register_champion).
DEFAULT_REGISTRY_SETTLE_S = 0.5
REGISTRY_SETTLE_S: float | None = None  # None: CONVS2S_REGISTRY_SETTLE_S, else the default


def settle_s() -> float:
    """REGISTRY_SETTLE_S, or the environment's (read when a champion is set)."""
    if REGISTRY_SETTLE_S is not None:
        return REGISTRY_SETTLE_S
    return env_seconds("CONVS2S_REGISTRY_SETTLE_S", DEFAULT_REGISTRY_SETTLE_S)

# Tags of a registered model: the validation data its champion is chosen on. A model
# registered before champions were chosen on validation data names its test set instead (under
# convs2s.test_set / convs2s.test_set_digest, not read): its champion, without a score on the
# validation set, gives way to the first model chosen on one, which tags the model with it.
DIGEST_TAG, TEST_SET_TAG, METRIC_TAG = "convs2s.chosen_on_digest", "convs2s.chosen_on", \
    "convs2s.metric"
LEGACY_TEST_SET_TAG = "convs2s.test_set"


def register_champion(uri: str, name: str, scores: list, models: dict[str, str],
                      test_set: str, metric: str, report_on: str | None = None,
                      scoring: int | None = None) -> Champion | None:
    """Register the best model of this run (by `metric` on `test_set`, a validation set: models
    are chosen on validation data, and the test set `report_on` only reports the chosen one's
    score) under `name` and point the alias `champion` at it, but only where the scores
    compare: the registered model keeps the digest of the data it was first chosen on, and a
    model scored on other data (another digest) never moves its alias, nor does a model that
    scores lower than the current champion on the same data. (One exception: a champion of a
    model registered before champions were chosen on validation data, which has no score on
    one, gives way to the first model chosen on one, whose data the model is tagged with once
    the alias names it.) With `scoring`, this run's scoring version (TaskKind.scoring_for),
    the champion's score compares only when the evaluation run that computed it was scored by
    the same version (its tag workflows.evaluation.SCORING_TAG; a run from before the tag is
    compared as before): BLEU by another tokenizer is another number. `Champion.reason` says
    why the alias moved or stayed. None when no scored model exists or tracking fails."""
    from mlflow.tracking import MlflowClient

    ranked = sorted((s for s in scores if s.test_set == test_set and s.job in models
                     and metric in s.metrics), key=lambda s: -s.metrics[metric])
    if not ranked:
        return None
    best = ranked[0]
    model_id, value = models[best.job], best.metrics[metric]
    reported = next((s.metrics.get(metric) for s in scores
                     if s.job == best.job and s.test_set == report_on), None)
    report = {"reported_on": report_on if reported is not None else None, "reported": reported}
    try:
        with bounded_http(), global_tracking_uri(uri):  # models:/ sources resolve through it
            client = MlflowClient(uri)
            ours = client.get_logged_model(model_id)
            ours_now = _newest(ours.metrics, metric, test_set)
            digest = ours_now.dataset_digest if ours_now else None
            registered = client.search_registered_models(f"name = '{name}'")
            legacy = bool(registered) and TEST_SET_TAG not in registered[0].tags \
                and LEGACY_TEST_SET_TAG in registered[0].tags
            def other_data(keyed: str) -> Champion:
                said = (f"not comparable: {name} holds models scored on {test_set} with "
                        f"digest {keyed}, this run's {test_set} has digest {digest}; the "
                        "alias stays (run on the same test data, or use another "
                        "experiment / tracking server)")
                log.warning("%s@%s %s", name, CHAMPION, said)
                cur = _current_champion(client, name)
                return Champion(name, cur[0] if cur else "none", best.job, metric, value,
                                test_set, False, said, **report)

            if registered:
                keyed = registered[0].tags.get(DIGEST_TAG)
                if keyed and keyed != digest:
                    return other_data(keyed)
            # MLflow's registry has no compare-and-set. So: compare, set, and re-read after a
            # pause (REGISTRY_SETTLE_S) until the alias names this run's model twice running;
            # a model another run set meanwhile is compared in turn (a better one is kept, a
            # worse one replaced). Two runs finishing together thus agree on the better model
            # as long as each run's read-then-set takes less than the pause.
            mv, confirmed, why = None, 0, ""  # this run's version (made once); reads that saw it
            for _ in range(12):
                read_at = time.monotonic()
                # (No registered model yet: no alias to read; a server with authentication
                # answers a read of a model that does not exist with 403, not 404.)
                current = _current_champion(client, name) if registered or mv else None
                if current is not None:
                    version, cur_model = current
                    if cur_model.model_id == model_id:
                        if mv is None:
                            if legacy:  # (set by an earlier run that stopped before the tags)
                                _tag_chosen_on(client, name, test_set, metric, digest)
                            return Champion(name, version, best.job, metric, value, test_set,
                                            True, "this run's model is the champion already",
                                            **report)
                        confirmed += 1
                        if confirmed == 2:
                            if legacy:  # (only now: a failure before leaves it to a later run)
                                _tag_chosen_on(client, name, test_set, metric, digest)
                            return Champion(name, version, best.job, metric, value, test_set,
                                            True, why, **report)
                        time.sleep(settle_s())
                        continue
                    theirs_now = _newest(cur_model.metrics, metric, test_set, digest) \
                        if digest is not None else None
                    theirs = theirs_now.value if theirs_now else None
                    their_scoring = _scoring_of(client, theirs_now.run_id) \
                        if theirs_now is not None and scoring is not None else None
                    if their_scoring is not None and their_scoring != scoring:
                        why = (f"not comparable: the champion's (version {version}) {metric} "
                               f"on {test_set} was computed by scoring version "
                               f"{their_scoring}, this run's by {scoring} (the scoring "
                               "changed); the alias stays (rerun the champion's workflow: it "
                               "scores the champion again)")
                        log.warning("%s@%s %s", name, CHAMPION, why)
                        return Champion(name, version, best.job, metric, value, test_set, False,
                                        why, **report)
                    if theirs is None and legacy and not any(
                            m.dataset_name == test_set for m in cur_model.metrics or []):
                        why = (f"the champion (version {version}) was chosen on a test set, "
                               f"before champions were chosen on validation data: this run's, "
                               f"chosen on {test_set}, replaces it")
                    elif theirs is None:
                        why = (f"not comparable: the champion (version {version}) has no "
                               f"{metric} on this run's {test_set} (digest {digest}); the alias "
                               "stays")
                        log.warning("%s@%s %s", name, CHAMPION, why)
                        return Champion(name, version, best.job, metric, value, test_set, False,
                                        why, **report)
                    elif theirs >= value:
                        why = (f"the champion (version {version}) scored {metric} {theirs:.2f} "
                               f"on the same {test_set}, this run {value:.2f}")
                        log.info("%s@%s stays version %s: %s", name, CHAMPION, version, why)
                        return Champion(name, version, best.job, metric, theirs, test_set,
                                        False, why, **report)
                    else:
                        why = (f"{metric} {value:.2f} above the former champion's "
                               f"{theirs:.2f} (version {version}) on the same {test_set}")
                else:
                    why = f"no champion on {test_set} yet"
                confirmed = 0
                if mv is None:  # (slow: made first, then compared afresh before the set)
                    try:
                        mv = _new_version(client, name, registered, model_id, ours, best,
                                          metric, value, test_set, digest, report)
                    except _OtherData as err:
                        return other_data(err.keyed)
                    continue
                try:
                    client.set_registered_model_alias(name, CHAMPION, mv.version)
                except Exception as err:  # noqa: BLE001
                    if "IntegrityError" not in str(err):
                        raise
                    continue  # another run set the alias at this moment: read and compare again
                # The pause outlasts another run's read-then-set even on a busy machine.
                time.sleep(max(settle_s(), 3 * (time.monotonic() - read_at)))
            raise RuntimeError(f"{name}@{CHAMPION} kept changing while this run compared it")
    except Exception as err:  # noqa: BLE001 - registration is a convenience, not the run
        log.warning("could not register %s in the MLflow model registry (%s: %s); the "
                    "champion alias was not moved", name, type(err).__name__,
                    redact_text(str(err).splitlines()[0])[:300] if str(err) else "")
        return None


def _chosen_on(test_set: str, metric: str, digest: str | None) -> dict[str, str]:
    """A registered model's tags: the validation data and metric its champion is chosen by."""
    return {TEST_SET_TAG: test_set, METRIC_TAG: metric, **({DIGEST_TAG: digest} if digest
                                                           else {})}


def _tag_chosen_on(client, name, test_set, metric, digest) -> None:
    """Tag a model registered before champions were chosen on validation data with the data
    its champion (this run's) now is chosen on: later runs compare on it."""
    for key, value in _chosen_on(test_set, metric, digest).items():
        client.set_registered_model_tag(name, key, value)


class _OtherData(Exception):
    """The registered model another run made a moment ago is keyed by other validation data."""

    def __init__(self, keyed: str):
        super().__init__(keyed)
        self.keyed = keyed


def _new_version(client, name, registered, model_id, ours, best, metric, value, test_set,
                 digest, report: dict | None = None):
    """This run's model as a new version of `name` (the registered model made first). Where
    another run made it since this one looked (two runs registering a task's first model at
    once), its data is checked as a registered model's is (`_OtherData`): a run on other
    validation data made the model's first version and tagged it with its data, and this run's
    version beside it would name a champion no later run can compare with."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    if not registered:
        try:
            client.create_registered_model(name, tags=_chosen_on(test_set, metric, digest))
        except Exception as err:  # noqa: BLE001 - another run made it a moment ago: use it
            if getattr(err, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise
            keyed = client.get_registered_model(name).tags.get(DIGEST_TAG)
            if keyed and keyed != digest:
                raise _OtherData(keyed) from None
    # Its scores by the set they are on: the validation set it was chosen on, and the test set
    # it is reported on and named after (a version's tags said `bleu` and `convs2s.test_set`
    # of the validation set alone: its test score appeared nowhere on it)
    tags = {"convs2s.job": best.job, "convs2s.chosen_on": test_set,
            f"{metric}.{test_set}": f"{value:.2f}"}
    if report and report.get("reported") is not None:
        tags[f"{metric}.{report['reported_on']}"] = f"{report['reported']:.2f}"
    mv = client.create_model_version(name, f"models:/{model_id}", run_id=ours.source_run_id,
                                     model_id=model_id, tags=tags)
    # The Models view's "Registered models" column reads this tag of the logged model.
    versions = json.loads(ours.tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
        versions + [{"name": name, "version": str(mv.version)}])})
    return mv


def _not_found(err: Exception) -> bool:
    """The registry's answer for a model or alias that does not exist (any other error, a
    timeout included, is not an answer: the caller must not move the alias on it)."""
    code = getattr(err, "error_code", "")
    return code == "RESOURCE_DOES_NOT_EXIST" or (
        code == "INVALID_PARAMETER_VALUE" and "not found" in str(err))


def _scoring_of(client, run_id: str | None) -> int | None:
    """The scoring version an evaluation run's scores were computed by (its SCORING_TAG), or
    None: a run from before the tag, whose version is not known (translation's was 2 already,
    and its workflow's rerun keeps its standing scores): compared as before."""
    from workflows.evaluation import SCORING_TAG

    if not run_id:
        return None
    tag = client.get_run(run_id).data.tags.get(SCORING_TAG)
    return int(tag) if tag is not None else None


def _newest(metrics, key: str, dataset: str, digest: str | None = None):
    """A logged model's latest value of `key` on `dataset` (with `digest`, on that very data),
    or None. A model scored again (an edited test file, a newer scoring version) holds every
    value it was given: the newest is what it scores now."""
    found = [m for m in metrics or [] if m.key == key and m.dataset_name == dataset
             and (digest is None or m.dataset_digest == digest)]
    return max(found, key=lambda m: m.timestamp or 0, default=None)


def _current_champion(client, name: str):
    """(version, logged model) the alias names now, or None when there is none. Any other
    registry error is raised: the alias then stays where it is."""
    try:
        mv = client.get_model_version_by_alias(name, CHAMPION)
    except Exception as err:  # noqa: BLE001
        if _not_found(err):
            return None
        raise
    # The sqlite store leaves the version's model_id empty; its source is models:/<model id>.
    model_id = mv.model_id or (mv.source[len("models:/"):] if mv.source.startswith("models:/m-")
                               else None)
    if not model_id:
        return None
    try:
        return str(mv.version), client.get_logged_model(model_id)
    except Exception as err:  # noqa: BLE001
        if _not_found(err):  # its logged model was deleted
            return None
        raise
