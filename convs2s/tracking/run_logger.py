"""Metrics from a long-running process (rank 0 of training) into one MLflow run, without ever
stopping it: a background thread sends batches, the first failure gives one warning and turns
remote logging off, and every metric is also appended to a local JSONL file.

    logger = RunLogger(uri, run_id, local_path="/abs/runs/demo/metrics.jsonl")
    logger.log_metrics({"train/loss": 3.2}, step=update)   # returns at once
    logger.set_tags({"convs2s.precision": "bf16"})          # so does this
    logger.close()
    read_local_metrics("/abs/runs/demo/metrics.jsonl")     # [{"step", "time", "metrics"}, ...]

Steps are update numbers. A resumed process skips any (key, step) at or below the highest step
already recorded for that key (in MLflow, and separately in the local file), so a restart from
an older checkpoint never logs duplicate steps.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path

from storage import is_uri, location
from storage.scratch import scratch_dir

from convs2s.tracking.runs import HTTP_ENV, mlflow_client, warn_unreachable

log = logging.getLogger(__name__)


def read_local_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl: [{"step": int, "time": float, "metrics": {...}}, ...]."""
    try:
        text = location(path).read_text()  # a local file, or an object in a bucket
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
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
        # In a bucket (no appends there): lines go to a local scratch copy, and `sync` (at each
        # checkpoint, and on close) writes it whole over the object.
        self.mirror = location(local_path) if is_uri(local_path or "") else None
        self.local_path = Path(local_path) if local_path and not self.mirror else None
        if self.mirror is not None:
            scratch = scratch_dir("convs2s-metrics-") / self.mirror.name
            try:
                scratch.write_bytes(self.mirror.read_bytes())  # a resumed run continues it
            except FileNotFoundError:
                scratch.touch()
            self.local_path = scratch
        if self.local_path and self.local_path.is_file() and self.local_path.stat().st_size:
            # A line torn by a crash is ended (and skipped when read), so that the next record
            # is not glued onto it and lost with it.
            with self.local_path.open("rb+") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
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

    def set_tags(self, tags: dict[str, object]) -> None:
        """Set tags on the run from the same thread, in order with the metrics (returns at
        once: the training loop never waits for the tracking server, not even for its
        first connection)."""
        if self.remote_ok:
            try:
                self._queue.put_nowait({k: str(v) for k, v in tags.items()})
            except queue.Full:
                self._fail(RuntimeError("metric queue full (server too slow)"))

    def sync(self) -> None:
        """In a bucket: write the local lines over the object (one PUT, never half a file)."""
        if self.mirror is not None:
            self.mirror.upload(self.local_path)

    def close(self, timeout: float = 15.0) -> None:
        """Flush what the server accepts within `timeout` seconds, then stop the thread. In a
        bucket: the lines are written over the object, and the local scratch copy removed."""
        self.sync()
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("MLflow logger did not flush within %.0f s; the rest of the metrics "
                            "are only in %s", timeout, self.mirror or self.local_path)
        if self.mirror is not None:
            shutil.rmtree(self.local_path.parent, ignore_errors=True)

    def _fail(self, err: Exception) -> None:
        if self.remote_ok:
            self.remote_ok = False
            warn_unreachable(self.uri, "logging metrics", err)

    def _work(self) -> None:
        from mlflow.entities import Metric, RunTag

        client = mlflow_client(self.uri)
        logged: set | None = None  # the metric keys the run had when this logger started
        while True:
            items = [self._queue.get()]
            while not self._queue.empty() and len(items) < 200:  # batch what is waiting
                items.append(self._queue.get_nowait())
            stop = items[-1] is None or None in items
            if self.remote_ok:
                try:
                    batch = []
                    for item in filter(None, items):
                        if isinstance(item, dict):  # tags (set_tags): sent with what is before
                            self._send(client, batch)
                            batch = []
                            try:  # a refused tag warns; it does not stop the metrics
                                client.log_batch(self.run_id, tags=[RunTag(k, v)
                                                                    for k, v in item.items()])
                            except Exception as err:  # noqa: BLE001
                                warn_unreachable(self.uri, "setting tags", err)
                            continue
                        metrics, step, ts = item
                        if logged is None:  # the keys the run has: one request
                            logged = set(client.get_run(self.run_id).data.metrics)
                        for k, v in metrics.items():
                            if k not in self._remote_max:  # a key's history: only a resumed
                                # run's keys have one to read
                                hist = client.get_metric_history(self.run_id, k) \
                                    if k in logged else []
                                self._remote_max[k] = max((m.step for m in hist), default=-1)
                            if step > self._remote_max[k]:
                                batch.append(Metric(k, v, ts, step))
                                self._remote_max[k] = step
                    self._send(client, batch)
                except Exception as err:  # noqa: BLE001 - never let tracking kill training
                    self._fail(err)
            if stop:
                return

    def _send(self, client, batch: list) -> None:
        for i in range(0, len(batch), 1000):
            client.log_batch(self.run_id, metrics=batch[i:i + 1000])
