"""MLflow tracking that never stops training: bounded HTTP retries, a background thread, one
clear warning when the server is unreachable, and every metric also kept in a local JSONL file.

Driver side (synchronous, each call bounded to a few seconds; failures warn and return None):

    uri = resolve_tracking_uri(None)          # $MLFLOW_TRACKING_URI or sqlite:///<cwd>/mlflow.db
    run_id = find_or_create_run(uri, "convs2s", run_key="/abs/runs/demo", run_name="demo",
                                parent_run_id=None, tags={...})   # same key -> same run
    log_params(uri, run_id, flatten_params({"model": cfg.to_dict()}))
    log_artifacts(uri, run_id, "/abs/runs/demo/best", "best_checkpoint")
    end_run(uri, run_id, "FINISHED")

    log_inputs(uri, run_id, [DatasetRecord("wmt14_en_fr/train", digest, path, counts,
                                           "training")], model_ids=[])
    log_final_metrics(uri, run_id, {"bleu": 40.5}, model_id="m-...", dataset=test_record)

Experiments are created marked as model training (MLflow 3's UI otherwise treats them as GenAI).

Worker side: `convs2s.tracking.run_logger.RunLogger` (asynchronous metrics, a local metrics.jsonl).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from convs2s.tracking.redact import redact_mlflow_logs, redact_text, redact_uri
from storage import is_uri, local_copy, location

log = logging.getLogger(__name__)

RUN_KEY_TAG = "convs2s.run_key"
# sha256 of the run key: found by it where the key holds both quote characters (MLflow's filter
# strings have no escapes, so such a key cannot be written as a literal)
RUN_KEY_DIGEST_TAG = "convs2s.run_key_sha256"
PARENT_TAG = "mlflow.parentRunId"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"  # the UI's "Model training" view
# A dead server must cost seconds, not MLflow's default minutes of retries (docs/reference.md,
# MLflow).
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "3", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def resolve_tracking_uri(uri: str | None = None) -> str:
    """An absolute tracking URI: `uri`, else $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db.

    Relative sqlite paths are made absolute: Ray workers run in another working directory.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    elif "://" not in uri or uri.lower().startswith("file:"):
        # A file store would fail at every call, each failure a warning the run outlives:
        # minutes of training with nothing tracked. Refuse it before anything starts.
        kind = "a plain path" if "://" not in uri else "a file:// store"
        raise ValueError(
            f"tracking URI {redact_uri(uri)!r} is {kind}: MLflow 3 refuses file stores; give "
            "sqlite:///<path>/mlflow.db or an http(s):// server"
        )
    return uri


def tracking_uri_problem(flag_value: str | None, flag: str = "--tracking-uri") -> str | None:
    """For a command line: why the tracking URI it would use is refused (naming the flag, or
    $MLFLOW_TRACKING_URI when the flag is not given), or None when it is usable."""
    try:
        resolve_tracking_uri(flag_value)
    except ValueError as err:
        return f"{flag if flag_value else '$MLFLOW_TRACKING_URI'}: {redact_text(str(err))}"
    return None


@contextlib.contextmanager
def bounded_http(timeout_s: float | None = None):
    """Temporarily bound MLflow's HTTP timeout and retries (driver-side calls); `timeout_s`
    instead of HTTP_ENV's per request."""
    saved = {k: os.environ.get(k) for k in HTTP_ENV}
    os.environ.update(HTTP_ENV)
    if timeout_s is not None:
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(timeout_s))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def global_tracking_uri(uri: str):
    """MLflow's process-wide tracking (and registry) URI set to `uri` for the block: the
    fluent API and models:/ URI resolution read it, not a client's URI."""
    import mlflow
    from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

    previous = mlflow.get_tracking_uri() if is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


@contextlib.contextmanager
def quiet_mlflow():
    """MLflow's model-logging chatter off the console for the block (its INFO lines, and the
    artifact download progress bars it draws while checking the input example)."""
    saved_env = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    mlflow_log = logging.getLogger("mlflow")
    saved_level = mlflow_log.level
    mlflow_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        mlflow_log.setLevel(saved_level)
        if saved_env is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = saved_env


def mlflow_client(uri: str):
    from mlflow.tracking import MlflowClient

    redact_mlflow_logs()
    return MlflowClient(tracking_uri=uri)


_WARNED: set[str] = set()  # tracking URIs this process has already warned about


# MLflow's error code for a request it answered by refusing it (a name it does not take, a
# value too long): the server is there, only that request was lost
REJECTED = "INVALID_PARAMETER_VALUE"
_REJECTED: set[tuple[str, str]] = set()  # (tracking URI, refusal) already warned about


def forget_unreachable(uri: str) -> None:
    """The server of `uri` answers again: its next outage is warned about (warn_unreachable)."""
    _WARNED.discard(uri)


def warn_unreachable(uri: str, what: str, err: Exception) -> None:
    """One warning per tracking URI and process; later failures only at debug level. A
    request the server refused (MLflow's INVALID_PARAMETER_VALUE) is no outage: a warning of
    its own, quoting MLflow's reason (which names the refused key), once per reason, and a
    later outage is still warned about."""
    detail = redact_text(str(err).splitlines()[0])[:300] if str(err) else ""
    if getattr(err, "error_code", None) == REJECTED:
        full = redact_text(" ".join(str(err).split()))[:1000]
        if (uri, full) not in _REJECTED:
            _REJECTED.add((uri, full))
            log.warning("MLflow tracking at %s refused a request while %s (nothing in it was "
                        "recorded): %s", redact_uri(uri), what, full)
        return
    if uri in _WARNED:
        log.debug("MLflow tracking at %s failed again while %s (%s: %s)", redact_uri(uri),
                  what, type(err).__name__, detail)
        return
    _WARNED.add(uri)
    log.warning("MLflow tracking at %s is unavailable (%s while %s); the run goes on and its "
                "metrics stay in the local metrics.jsonl", redact_uri(uri), type(err).__name__,
                what)


def _artifact_location(uri: str, experiment_name: str) -> str | None:
    """sqlite stores: artifacts beside the database, absolute (docs/reference.md, MLflow)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent / "mlartifacts" / experiment_name).as_uri()
    return None


def get_or_create_experiment(uri: str, name: str, artifact_root: str | None = None) -> str:
    """Experiment id of `name`, created if missing (tolerates a concurrent creation), its
    artifacts under `artifact_root/<name>` when given (a bucket: a workflow whose storage is
    object storage keeps its MLflow artifacts there too), else where the store puts them.

    The experiment is marked as model training: without the mark the MLflow 3 UI opens it on
    its GenAI overview (traces, prompts), empty, instead of on its runs and models. An
    experiment made earlier without the mark gets it; a kind someone set is kept."""
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            where = f"{artifact_root.rstrip('/')}/{name}" if artifact_root \
                else _artifact_location(uri, name)
            return client.create_experiment(name, artifact_location=where,
                                            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except Exception:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return exp.experiment_id


@functools.cache
def code_version() -> str:
    """CONVS2S_CODE_VERSION where set (a cluster's copy of the code has no .git: the image or
    the runtime env sets the commit it was made from), else the git commit of the checkout,
    else "<package version> (no git commit)" (asked once per process: the parent run and
    every training run are tagged with it)."""
    if given := os.environ.get("CONVS2S_CODE_VERSION", "").strip():
        return given
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{version('convs2s-ray')} (no git commit)"
    except PackageNotFoundError:
        return "unknown (no git commit)"


def run_key(path: str | os.PathLike) -> str:
    """The key (tag `convs2s.run_key`) of the run that describes the outputs at `path`: the
    absolute path itself. One scheme for every run of the project: a workflow's parent run is
    keyed by its run folder, a training run by its Ray Train folder, an evaluation run by its
    hypotheses' folder; the same storage path and names find the same runs again."""
    return str(location(path))  # absolute; a bucket's URI as it is


def filter_literal(value: str) -> str | None:
    """`value` as a literal of an MLflow filter string, or None where none can say it. MLflow's
    parser has no escapes: a backslash is kept as it is (escaping one made a key never match,
    and a resumed run a new MLflow run), and a value is quoted with the quote it lacks."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return None


def _digest(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def run_key_tags(key: str) -> dict[str, str]:
    """The tags that key a run (`run_key_filter` finds it by them)."""
    return {RUN_KEY_TAG: key, RUN_KEY_DIGEST_TAG: _digest(key)}


def run_key_filter(key: str) -> str:
    """The filter string of the run keyed `key` (by its digest where no literal says it)."""
    literal = filter_literal(key)
    if literal is None:
        return f"tags.`{RUN_KEY_DIGEST_TAG}` = '{_digest(key)}'"
    return f"tags.`{RUN_KEY_TAG}` = {literal}"


def find_run(uri: str, experiment_name: str, key: str) -> tuple[str, str] | None:
    """(id, status) of the run keyed `key` in the experiment, or None: none there, or the
    tracking server unreachable (said once, as every call here says it)."""
    try:
        with bounded_http():
            client = mlflow_client(uri)
            exp_id = experiment_id(uri, experiment_name)
            found = client.search_runs([exp_id], filter_string=run_key_filter(key),
                                       max_results=1) if exp_id is not None else []
            return (found[0].info.run_id, found[0].info.status) if found else None
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "finding the run", err)
        return None


REOPENED_TAG = "convs2s.reopened"  # a run taken up again: when, from which end, which code
REOPENED_KEPT = 2000  # characters of it kept: the latest times (MLflow takes 8,000 a tag)


def find_or_create_run(uri: str, experiment_name: str, run_key: str, run_name: str,
                       parent_run_id: str | None = None, tags: dict | None = None) -> str | None:
    """The id of the run tagged `run_key` in the experiment (reopened as RUNNING), or of a new
    one; None (after one warning) when the tracking server cannot be reached."""
    try:
        with bounded_http():
            client = mlflow_client(uri)
            exp_id = get_or_create_experiment(uri, experiment_name)
            found = client.search_runs([exp_id], filter_string=run_key_filter(run_key),
                                       max_results=1)
            all_tags = {**run_key_tags(run_key), **(tags or {})}
            if parent_run_id:
                all_tags[PARENT_TAG] = parent_run_id
            if found:
                run_id, status = found[0].info.run_id, found[0].info.status
                client.update_run(run_id, status="RUNNING")
                if status != "RUNNING":  # its history: each time it was taken up again, from
                    # which end, with which code (the run's tags otherwise show only the last)
                    was = found[0].data.tags.get(REOPENED_TAG, "")
                    line = (f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {status} -> RUNNING "
                            f"(code {code_version()})")
                    all_tags[REOPENED_TAG] = (f"{was}; {line}" if was else line)[-REOPENED_KEPT:]
                _log_tags(client, run_id, all_tags)
                return run_id
            return client.create_run(exp_id, run_name=run_name,
                                     tags={k: str(v) for k, v in all_tags.items()}).info.run_id
    except Exception as err:  # noqa: BLE001 - tracking must never stop training
        warn_unreachable(uri, "creating the run", err)
        return None


PARAM_CHARS = 6000  # MLflow's longest param value


def param_value(v) -> str:
    """`v` as a param: its text, or where longer than MLflow takes, its start and a digest of
    the whole (two long values that differ past the cut stay two values: a run's settings
    compared by them, `workflows.run_state`, saw no change there)."""
    text = str(v)
    if len(text) <= PARAM_CHARS:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    tail = f"{CUT_MARK}{len(text):,} characters, sha256 {digest}]"
    return text[:PARAM_CHARS - len(tail)] + tail


CUT_MARK = " ...["  # where `param_value` cut a value, its length and digest after it


def flatten_params(d: dict, prefix: str = "") -> dict[str, str]:
    """{"model": {"embed_dim": 32}} -> {"model.embed_dim": "32"} (MLflow params are strings;
    a value past their length cut with a digest, `param_value`)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_params(v, name + "."))
        else:
            out[name] = param_value(v)
    return out


def params_differ(uri: str, run_id: str | None, params: dict[str, str]) -> list[str]:
    """The keys of `params` (flattened) that run `run_id` logged with another value: it
    describes something else than what would be logged into it now. [] where it cannot be
    read (tracking unreachable: nothing is logged either)."""
    if run_id is None:
        return []
    try:
        with bounded_http():
            old = mlflow_client(uri).get_run(run_id).data.params
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "reading the run's params", err)
        return []
    return sorted(k for k, v in params.items() if k in old and old[k] != v)


def supersede_run(uri: str, run_id: str | None, key: str, name: str, why: str,
                  status: str | None = None) -> None:
    """Set run `run_id` (keyed `key`, named `name`) apart before its outputs are made again for
    other inputs (`why`): it keeps its params, scores and artifacts, is named "<name>
    (superseded)" and keyed apart, so the next run found or created by `key` is a new one,
    described afresh. `status`, the run's status as found: one still RUNNING is ended KILLED
    (what ran it is gone: the command setting it apart holds the run's folder), else no run
    would ever end it."""
    if run_id is None:
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    set_tags(uri, run_id, {**run_key_tags(f"{key} (superseded {when})"),
                           "mlflow.runName": f"{name} (superseded)",
                           "convs2s.superseded": f"{when}: {why}"})
    if status == "RUNNING":
        end_run(uri, run_id, "KILLED")


def log_params(uri: str, run_id: str | None, params: dict[str, str]) -> None:
    """Log params once: keys already logged keep their value (MLflow refuses changes); a changed
    value is reported in one warning (the new configs are in the run's artifacts)."""
    if run_id is None:
        return
    try:
        from mlflow.entities import Param

        with bounded_http():
            client = mlflow_client(uri)
            old = client.get_run(run_id).data.params
            changed = sorted(k for k, v in params.items() if k in old and old[k] != v)
            if changed:
                log.warning("run %s already has different values for params %s; keeping the "
                            "first ones", run_id, changed[:10])
            new = [Param(k, v) for k, v in params.items() if k not in old]
            for i in range(0, len(new), 100):
                client.log_batch(run_id, params=new[i:i + 100])
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "logging params", err)


def log_artifacts(uri: str, run_id: str | None, local_path: str, artifact_path: str | None = None):
    """Upload a file or directory (local, or in a bucket) to the run; False (after a warning)
    when that fails."""
    if run_id is None:
        return False
    try:
        if is_uri(local_path):
            local_path = str(local_copy(local_path))
        with bounded_http():
            client = mlflow_client(uri)
            if Path(local_path).is_dir():
                client.log_artifacts(run_id, local_path, artifact_path)
            else:
                client.log_artifact(run_id, local_path, artifact_path)
        return True
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, f"uploading {local_path}", err)
        return False


def set_tags(uri: str, run_id: str | None, tags: dict[str, str]) -> None:
    if run_id is None:
        return
    try:
        with bounded_http():
            _log_tags(mlflow_client(uri), run_id, tags)
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "setting tags", err)


def _log_tags(client, run_id: str, tags: dict) -> None:
    """All of `tags` in one request (a tracking server answers each request in turn, and a
    basic-auth one checks the password's hash on every one), not one per tag."""
    from mlflow.entities import RunTag

    if tags:
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def stopped_status(err: BaseException) -> str:
    """The MLflow status of a run that `err` ended: KILLED when the command was stopped (Ctrl-C,
    KeyboardInterrupt; SIGTERM, which `ray job stop` sends: Ray's driver handler, installed by
    `ray.init`, exits with SystemExit), FAILED for any other error."""
    return "KILLED" if isinstance(err, (KeyboardInterrupt, SystemExit)) else "FAILED"


def end_run(uri: str, run_id: str | None, status: str = "FINISHED") -> None:
    if run_id is None:
        return
    try:
        with bounded_http():
            mlflow_client(uri).set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "ending the run", err)


@dataclass(frozen=True)
class DatasetRecord:
    """A dataset as MLflow records it: a run's input (the runs table's Dataset column) and the
    dataset a metric was computed on (the Models view ranks models per dataset)."""

    name: str  # e.g. "wmt14_en_fr/train", "newstest2014"
    digest: str  # identifies the content: the same name with another digest is other data
    source: str  # where it lives (a folder or file; the origin goes into the profile)
    profile: dict = field(default_factory=dict)  # counts shown on the dataset's page
    context: str = "training"  # training / validation / evaluation

    def entity(self):
        from mlflow.entities import Dataset

        return Dataset(self.name, self.digest, source_type="local",
                       source=json.dumps({"uri": self.source}),
                       profile=json.dumps(self.profile))


def describe_run(uri: str, run_id: str | None, params: dict | None = None,
                 datasets: list[DatasetRecord] = (), model_ids: list[str] = ()) -> None:
    """What a run is: its params (nested dicts, flattened; keys logged before keep their value)
    and what it read (datasets with their context, logged models it scored), each recorded
    once however often the run is resumed. Every run of the project is described here."""
    if run_id is None:
        return
    if params:
        log_params(uri, run_id, flatten_params(params))
    if not (datasets or model_ids):
        return
    try:
        with bounded_http():
            inputs = mlflow_client(uri).get_run(run_id).inputs
        seen = {(d.dataset.name, d.dataset.digest) for d in inputs.dataset_inputs or []}
        models = {m.model_id for m in inputs.model_inputs or []}
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "reading the run's inputs", err)
        return
    log_inputs(uri, run_id, [d for d in datasets if (d.name, d.digest) not in seen],
               [m for m in model_ids if m not in models])


def log_inputs(uri: str, run_id: str | None, datasets: list[DatasetRecord] = (),
               model_ids: list[str] = ()) -> None:
    """Record what a run read: datasets (with their context) and logged models it scored."""
    if run_id is None or not (datasets or model_ids):
        return
    try:
        from mlflow.entities import DatasetInput, InputTag, LoggedModelInput
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        with bounded_http():
            mlflow_client(uri).log_inputs(
                run_id, datasets=[DatasetInput(d.entity(), [InputTag(MLFLOW_DATASET_CONTEXT,
                                                                     d.context)])
                                  for d in datasets],
                models=[LoggedModelInput(m) for m in model_ids])
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "logging the run's inputs", err)


def log_final_metrics(uri: str, run_id: str | None, metrics: dict[str, float | None], *,
                      model_id: str | None = None, dataset: DatasetRecord | None = None) -> None:
    """Final figures of a run (step 0); with `model_id` and `dataset` each is also a metric of
    that logged model on that dataset. None values are left out; a failure only warns."""
    if run_id is None:
        return
    try:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, 0, model_id=model_id,
                        dataset_name=dataset.name if dataset else None,
                        dataset_digest=dataset.digest if dataset else None)
                 for k, v in metrics.items() if v is not None]
        with bounded_http():
            client = mlflow_client(uri)
            for i in range(0, len(items), 500):
                client.log_batch(run_id, metrics=items[i:i + 500])
    except Exception as err:  # noqa: BLE001
        warn_unreachable(uri, "logging final metrics", err)


def metric_keys(uri: str, run_id: str | None) -> set[str]:
    """The keys of the metrics a run holds; empty when there is no run or it is unreachable."""
    if run_id is None:
        return set()
    try:
        with bounded_http():
            return set(mlflow_client(uri).get_run(run_id).data.metrics)
    except Exception:  # noqa: BLE001 - deleted run or unreachable server
        return set()


def run_metrics(uri: str, run_id: str | None) -> dict[str, float]:
    """The run's latest metric values ({} where there is no run or it cannot be read)."""
    if run_id is None:
        return {}
    try:
        with bounded_http():
            return dict(mlflow_client(uri).get_run(run_id).data.metrics)
    except Exception:  # noqa: BLE001 - deleted run or unreachable server
        return {}


def model_metrics(uri: str, model_id: str | None,
                  dataset: DatasetRecord | None = None) -> dict[str, float]:
    """A logged model's metric values on `dataset` (its name and digest: a model is scored on
    several test sets), or on none; {} where there is none or it cannot be read."""
    if model_id is None:
        return {}
    name, digest = (dataset.name, dataset.digest) if dataset else (None, None)
    try:
        with bounded_http():
            return {m.key: m.value for m in mlflow_client(uri).get_logged_model(
                model_id).metrics or []
                if (m.dataset_name or None, m.dataset_digest or None) == (name, digest)}
    except Exception:  # noqa: BLE001 - deleted model or unreachable server
        return {}


def run_has_metrics(uri: str, run_id: str | None) -> bool | None:
    """Whether the run still exists (not deleted) and holds metrics; None where the store did
    not answer (a server down is no sign that the run is gone: a finished score is kept)."""
    from mlflow.exceptions import MlflowException

    if run_id is None:
        return False
    try:
        with bounded_http():
            run = mlflow_client(uri).get_run(run_id)
        return run.info.lifecycle_stage == "active" and bool(run.data.metrics)
    except MlflowException as err:
        return False if err.error_code == "RESOURCE_DOES_NOT_EXIST" else None
    except Exception:  # noqa: BLE001 - an unreachable server, a store that cannot be read
        return None


def deleted_experiment(uri: str, experiment: str) -> str | None:
    """Why experiment `experiment` takes no run (deleted: in MLflow's trash, not yet purged),
    or None: asked before a workflow's first run is made (every stage's run would be refused,
    the whole workflow untracked after one warning)."""
    try:
        with bounded_http(timeout_s=20):
            exp = mlflow_client(uri).get_experiment_by_name(experiment)
    except Exception:  # noqa: BLE001 - unreachable: the stages warn once and go on untracked
        return None
    if exp is None or exp.lifecycle_stage != "deleted":
        return None
    return (f"experiment {experiment!r} at {redact_uri(uri)} is deleted (in MLflow's trash, "
            f"where it takes no run): restore it (mlflow experiments restore --experiment-id "
            f"{exp.experiment_id}) or give another --experiment")


def tracking_problem(uri: str, experiment: str) -> str | None:
    """Before a run starts: why a tracking server that answers will not take its runs, or
    None. A server with authentication (MLflow's basic-auth app) that gets no login, a wrong
    one, or one that may only read the experiment would refuse every run, param and metric
    later; the answer names the fix. The check writes the experiment's kind tag with the value
    it has (creating the experiment if it is new, as the run would): it needs the right to
    edit. A server that does not answer is not a problem here: runs then go on untracked."""
    if not uri.startswith(("http://", "https://")):
        return None  # (before MLflow's import: a local store has no login to check)
    from mlflow.exceptions import MlflowException

    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or _user_of(uri)
    try:
        # A server that refuses connections fails at once; a busy one gets 20 s an answer.
        with bounded_http(timeout_s=20):
            exp_id = get_or_create_experiment(uri, experiment)
            mlflow_client(uri).set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG,
                                                  mlflow_client(uri).get_experiment(exp_id)
                                                  .tags.get(EXPERIMENT_KIND_TAG, MODEL_TRAINING))
    except MlflowException as err:
        code = getattr(err, "error_code", "")
        where = redact_uri(uri)
        if code == "UNAUTHENTICATED":
            return (f"--tracking-uri {where}: the server asks for a login"
                    + (f" and refused user {user!r}" if user else "")
                    + ": set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (an account "
                    "the server's admin made)")
        if code == "PERMISSION_DENIED" and "Invalid Host header" in str(err):
            # (MLflow's guard against DNS rebinding: a name the server's --allowed-hosts lacks)
            # (from the redacted URI: a password holding a "/" cut the raw one's user part
            # wrong, and its start was shown as the host)
            host = re.sub(r"^[a-z]+://(?:[^@/]*@)?([^/]+).*$", r"\1", where)
            return (f"--tracking-uri {where}: the server refuses the host name {host!r} (MLflow's "
                    "allowed hosts): add it to the server's --allowed-hosts (infra/mlflow: "
                    f"MLFLOW_ALLOWED_HOSTS in .env, e.g. {host.split(':')[0]}:*) and restart it")
        if code == "PERMISSION_DENIED":
            return (f"--tracking-uri {where}: user {user!r} may not write to experiment "
                    f"{experiment!r} (read-only); ask its owner or the admin for EDIT on it, "
                    "or give another --experiment")
        return None
    except Exception:  # noqa: BLE001 - unreachable: the stages warn once and go on untracked
        return None
    return None


def _user_of(uri: str) -> str | None:
    """The user of `scheme://user:password@host`; None for a bare `token@host` (a secret)."""
    m = re.match(r"^[a-z]+://([^:@/]+):[^@/]*@", uri)
    return m.group(1) if m else None


def artifacts_beside(uri: str, name: str, storage: str) -> str | None:
    """A workflow whose storage is a bucket, tracked in a local store (sqlite, files): its
    experiment is created with artifacts under `<storage>/mlartifacts/`, so the MLflow
    artifacts are objects in the bucket too. Returns the experiment's artifact location (None:
    a tracking server, which puts artifacts where it is configured to, or unreachable)."""
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    try:
        with bounded_http():
            exp_id = get_or_create_experiment(uri, name, f"{storage.rstrip('/')}/mlartifacts")
            return mlflow_client(uri).get_experiment(exp_id).artifact_location
    except Exception as err:  # noqa: BLE001 - the stages warn about tracking themselves
        log.debug("artifact location of %s: %s", name, err)
        return None


def experiment_id(uri: str, name: str) -> str | None:
    """The id of experiment `name`, or None (missing, or the server is unreachable)."""
    try:
        with bounded_http():
            exp = mlflow_client(uri).get_experiment_by_name(name)
        return exp.experiment_id if exp else None
    except Exception:  # noqa: BLE001
        return None


def experiment_of_run(uri: str, run_id: str) -> str:
    """The name of the experiment that holds `run_id` (raises when unreachable)."""
    with bounded_http():
        client = mlflow_client(uri)
        return client.get_experiment(client.get_run(run_id).info.experiment_id).name
