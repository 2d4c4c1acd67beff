"""MLflow tracking that never stops training: bounded HTTP retries, a background thread, one
clear warning when the server is unreachable, and every metric also kept in a local JSONL file.

Driver side (synchronous, each call bounded to a few seconds; failures warn and return None):

    uri = resolve_tracking_uri(None)          # $MLFLOW_TRACKING_URI or sqlite:///<cwd>/mlflow.db
    run_id = find_or_create_run(uri, "convs2s", run_key="/abs/runs/demo", run_name="demo",
                                parent_run_id=None, tags={...})   # same key -> same run
    log_params(uri, run_id, flatten_params({"model": cfg.to_dict()}))
    log_artifacts(uri, run_id, "/abs/runs/demo/best", "best_checkpoint")
    end_run(uri, run_id, "FINISHED")

    log_inputs(uri, run_id, [DatasetRecord.of("wmt14_en_fr/train", digest, path, counts,
                                              "training")], model_ids=[])
    log_final_metrics(uri, run_id, {"bleu": 40.5}, model_id="m-...", dataset=test_record)

Experiments are created marked as model training (MLflow 3's UI otherwise treats them as GenAI).

Worker side (rank 0 of training, or any long-running process):

    logger = RunLogger(uri, run_id, local_path="/abs/runs/demo/metrics.jsonl")
    logger.log_metrics({"train/loss": 3.2}, step=update)   # returns at once
    logger.close()

Steps are update numbers. A resumed process skips any (key, step) at or below the highest step
already recorded for that key (in MLflow, and separately in the local file), so a restart from
an older checkpoint never logs duplicate steps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RUN_KEY_TAG = "convs2s.run_key"
PARENT_TAG = "mlflow.parentRunId"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"  # the UI's "Model training" view
# A dead server must cost seconds, not MLflow's default minutes of retries (reference-facts §9).
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "3", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def resolve_tracking_uri(uri: str | None = None) -> str:
    """An absolute tracking URI: `uri`, else $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db.

    Relative sqlite paths are made absolute: Ray workers run in another working directory.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    elif "://" not in uri:
        raise ValueError(
            f"tracking URI {uri!r} is a plain path: MLflow 3 refuses file stores; give "
            "sqlite:///<path>/mlflow.db or an http(s):// server"
        )
    return uri


@contextlib.contextmanager
def bounded_http():
    """Temporarily bound MLflow's HTTP timeout and retries (driver-side calls)."""
    saved = {k: os.environ.get(k) for k in HTTP_ENV}
    os.environ.update(HTTP_ENV)
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


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


_WARNED: set[str] = set()  # tracking URIs this process has already warned about


def _warn_unreachable(uri: str, what: str, err: Exception) -> None:
    """One warning per tracking URI and process; later failures only at debug level."""
    detail = str(err).splitlines()[0][:300] if str(err) else ""
    if uri in _WARNED:
        log.debug("MLflow tracking at %s failed again while %s (%s: %s)", uri, what,
                  type(err).__name__, detail)
        return
    _WARNED.add(uri)
    log.warning("MLflow tracking at %s is unavailable (%s while %s); the run goes on and its "
                "metrics stay in the local metrics.jsonl", uri, type(err).__name__, what)


def _artifact_location(uri: str, experiment_name: str) -> str | None:
    """sqlite stores: artifacts beside the database (absolute), as reference-facts §9 asks."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        return (db.parent / "mlartifacts" / experiment_name).as_uri()
    return None


def get_or_create_experiment(uri: str, name: str) -> str:
    """Experiment id of `name`, created if missing (tolerates a concurrent creation).

    The experiment is marked as model training: without the mark the MLflow 3 UI opens it on
    its GenAI overview (traces, prompts), empty, instead of on its runs and models. An
    experiment made earlier without the mark gets it; a kind someone set is kept."""
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=_artifact_location(uri, name),
                                            tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING})
        except Exception:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return exp.experiment_id


def find_or_create_run(uri: str, experiment_name: str, run_key: str, run_name: str,
                       parent_run_id: str | None = None, tags: dict | None = None) -> str | None:
    """The id of the run tagged `run_key` in the experiment (reopened as RUNNING), or of a new
    one; None (after one warning) when the tracking server cannot be reached."""
    try:
        with bounded_http():
            client = _client(uri)
            exp_id = get_or_create_experiment(uri, experiment_name)
            key = run_key.replace("\\", "\\\\").replace("'", "\\'")
            found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'",
                                       max_results=1)
            all_tags = {RUN_KEY_TAG: run_key, **(tags or {})}
            if parent_run_id:
                all_tags[PARENT_TAG] = parent_run_id
            if found:
                run_id = found[0].info.run_id
                client.update_run(run_id, status="RUNNING")
                for k, v in all_tags.items():
                    client.set_tag(run_id, k, str(v))
                return run_id
            return client.create_run(exp_id, run_name=run_name,
                                     tags={k: str(v) for k, v in all_tags.items()}).info.run_id
    except Exception as err:  # noqa: BLE001 - tracking must never stop training
        _warn_unreachable(uri, "creating the run", err)
        return None


def flatten_params(d: dict, prefix: str = "") -> dict[str, str]:
    """{"model": {"embed_dim": 32}} -> {"model.embed_dim": "32"} (MLflow params are strings)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_params(v, name + "."))
        else:
            out[name] = str(v)[:6000]
    return out


def log_params(uri: str, run_id: str | None, params: dict[str, str]) -> None:
    """Log params once: keys already logged keep their value (MLflow refuses changes); a changed
    value is reported in one warning (the new configs are in the run's artifacts)."""
    if run_id is None:
        return
    try:
        from mlflow.entities import Param

        with bounded_http():
            client = _client(uri)
            old = client.get_run(run_id).data.params
            changed = sorted(k for k, v in params.items() if k in old and old[k] != v)
            if changed:
                log.warning("run %s already has different values for params %s; keeping the "
                            "first ones", run_id, changed[:10])
            new = [Param(k, v) for k, v in params.items() if k not in old]
            for i in range(0, len(new), 100):
                client.log_batch(run_id, params=new[i:i + 100])
    except Exception as err:  # noqa: BLE001
        _warn_unreachable(uri, "logging params", err)


def log_artifacts(uri: str, run_id: str | None, local_path: str, artifact_path: str | None = None):
    """Upload a file or directory to the run; False (after a warning) when that fails."""
    if run_id is None:
        return False
    try:
        with bounded_http():
            client = _client(uri)
            if Path(local_path).is_dir():
                client.log_artifacts(run_id, local_path, artifact_path)
            else:
                client.log_artifact(run_id, local_path, artifact_path)
        return True
    except Exception as err:  # noqa: BLE001
        _warn_unreachable(uri, f"uploading {local_path}", err)
        return False


def set_tags(uri: str, run_id: str | None, tags: dict[str, str]) -> None:
    if run_id is None:
        return
    try:
        with bounded_http():
            client = _client(uri)
            for k, v in tags.items():
                client.set_tag(run_id, k, str(v))
    except Exception as err:  # noqa: BLE001
        _warn_unreachable(uri, "setting tags", err)


def end_run(uri: str, run_id: str | None, status: str = "FINISHED") -> None:
    if run_id is None:
        return
    try:
        with bounded_http():
            _client(uri).set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001
        _warn_unreachable(uri, "ending the run", err)


@dataclass(frozen=True)
class DatasetRecord:
    """A dataset as MLflow records it: a run's input (the runs table's Dataset column) and the
    dataset a metric was computed on (the Models view ranks models per dataset)."""

    name: str  # e.g. "wmt14_en_fr/train", "newstest2014"
    digest: str  # identifies the content: the same name with another digest is other data
    source: str  # where it lives (a folder or file; the origin goes into the profile)
    profile: tuple[tuple[str, object], ...] = ()  # counts shown on the dataset's page
    context: str = "training"  # training / validation / evaluation

    @staticmethod
    def of(name: str, digest: str, source: str, profile: dict, context: str) -> DatasetRecord:
        return DatasetRecord(name, digest, source, tuple(profile.items()), context)

    def entity(self):
        from mlflow.entities import Dataset

        return Dataset(self.name, self.digest, source_type="local",
                       source=json.dumps({"uri": self.source}),
                       profile=json.dumps(dict(self.profile)))


def log_inputs(uri: str, run_id: str | None, datasets: list[DatasetRecord] = (),
               model_ids: list[str] = ()) -> None:
    """Record what a run read: datasets (with their context) and logged models it scored."""
    if run_id is None or not (datasets or model_ids):
        return
    try:
        from mlflow.entities import DatasetInput, InputTag, LoggedModelInput
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        with bounded_http():
            _client(uri).log_inputs(
                run_id, datasets=[DatasetInput(d.entity(), [InputTag(MLFLOW_DATASET_CONTEXT,
                                                                     d.context)])
                                  for d in datasets],
                models=[LoggedModelInput(m) for m in model_ids])
    except Exception as err:  # noqa: BLE001
        _warn_unreachable(uri, "logging the run's inputs", err)


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
            client = _client(uri)
            for i in range(0, len(items), 500):
                client.log_batch(run_id, metrics=items[i:i + 500])
    except Exception as err:  # noqa: BLE001
        _warn_unreachable(uri, "logging final metrics", err)


def read_local_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl: [{"step": int, "time": float, "metrics": {...}}, ...]."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash: skip it
            continue
    return out


class RunLogger:
    """Asynchronous metric logger into one MLflow run plus a local JSONL file.

    `log_metrics` appends to the local file and queues the MLflow write; a daemon thread sends
    queued metrics in batches. The first MLflow failure prints one warning and turns remote
    logging off for this logger (the local file keeps everything). Sets MLflow's HTTP timeout
    and retry env vars for the process (meant for worker processes, which are ours).
    """

    def __init__(self, tracking_uri: str | None, run_id: str | None,
                 local_path: str | os.PathLike | None = None):
        for k, v in HTTP_ENV.items():
            os.environ.setdefault(k, v)
        self.uri, self.run_id = tracking_uri, run_id
        self.local_path = Path(local_path) if local_path else None
        self.remote_ok = bool(tracking_uri and run_id)
        self._local_max: dict[str, int] = {}
        for rec in read_local_metrics(self.local_path) if self.local_path else []:
            for k in rec["metrics"]:
                self._local_max[k] = max(self._local_max.get(k, -1), int(rec["step"]))
        self._remote_max: dict[str, int] = {}  # filled lazily from MLflow's history per key
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._thread = threading.Thread(target=self._work, name="mlflow-logger", daemon=True)
        if self.remote_ok:
            self._thread.start()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        metrics = {k: float(v) for k, v in metrics.items()}
        fresh = {k: v for k, v in metrics.items() if step > self._local_max.get(k, -1)}
        if fresh and self.local_path:
            self.local_path.parent.mkdir(parents=True, exist_ok=True)
            with self.local_path.open("a") as f:
                f.write(json.dumps({"step": int(step), "time": time.time(), "metrics": fresh})
                        + "\n")
            for k in fresh:
                self._local_max[k] = int(step)
        if self.remote_ok:
            try:
                self._queue.put_nowait((metrics, int(step), int(time.time() * 1000)))
            except queue.Full:
                self._fail(RuntimeError("metric queue full (server too slow)"))

    def close(self, timeout: float = 15.0) -> None:
        """Flush what the server accepts within `timeout` seconds, then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("MLflow logger did not flush within %.0f s; the rest of the metrics "
                            "are only in %s", timeout, self.local_path)

    def _fail(self, err: Exception) -> None:
        if self.remote_ok:
            self.remote_ok = False
            _warn_unreachable(self.uri, "logging metrics", err)

    def _work(self) -> None:
        from mlflow.entities import Metric

        client = _client(self.uri)
        while True:
            items = [self._queue.get()]
            while not self._queue.empty() and len(items) < 200:  # batch what is waiting
                items.append(self._queue.get_nowait())
            stop = items[-1] is None or None in items
            if self.remote_ok:
                try:
                    batch = []
                    for item in filter(None, items):
                        metrics, step, ts = item
                        for k, v in metrics.items():
                            if k not in self._remote_max:
                                hist = client.get_metric_history(self.run_id, k)
                                self._remote_max[k] = max((m.step for m in hist), default=-1)
                            if step > self._remote_max[k]:
                                batch.append(Metric(k, v, ts, step))
                                self._remote_max[k] = step
                    for i in range(0, len(batch), 1000):
                        client.log_batch(self.run_id, metrics=batch[i:i + 1000])
                except Exception as err:  # noqa: BLE001 - never let tracking kill training
                    self._fail(err)
            if stop:
                return
