"""Metrics from a long-running process (rank 0 of training) into one MLflow run, without ever
stopping it: a background thread sends batches, and every metric is also appended to a local
JSONL file. A failure gives one warning and stops the sending; the server is asked again after
a minute, then after twice as long each time (at most every 10 minutes), and once it answers,
what the run recorded meanwhile is sent from the local file and sending goes on (a run of
days outlives a server's restart: the first failure used to end its MLflow metrics for good).

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

from convs2s.tracking.runs import (HTTP_ENV, REJECTED, forget_unreachable, mlflow_client,
                                   warn_unreachable)
from convs2s.tracking.redact import redact_uri

log = logging.getLogger(__name__)

PROBE = "probe"  # a queue item: ask the server whether it answers again
RETRY_MAX_S = 600.0


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
    queued metrics in batches. An MLflow failure prints one warning and stops the sending (the
    local file keeps everything); `retry_s` later the server is asked again (then twice as
    long each time, at most RETRY_MAX_S), and when it answers, the metrics recorded since are
    sent from the local file and the sending goes on. Sets MLflow's HTTP timeout and retry env
    vars for the process (meant for worker processes, which are ours).
    """

    def __init__(self, tracking_uri: str | None, run_id: str | None,
                 local_path: str | os.PathLike | None = None, retry_s: float = 60.0):
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
        self._logged: set | None = None  # the metric keys the run had when this logger started
        # Held while a record is written and queued (or not), and while sending resumes: a
        # record written before the sending resumed is whole in the file when it is read.
        self._lock = threading.RLock()
        self.retry_s, self._retry_delay = retry_s, retry_s
        self._retry_at: float | None = None  # when to ask a server that failed again
        self._probing = False  # a PROBE is queued
        # Sending again after a probe was answered: a failure then (a server that answers reads
        # and refuses writes: the run deleted, the permission lost) backs off further instead
        # of asking again every retry_s, and is not warned about again
        self._resending = False
        self._tags: dict[str, str] = {}  # tags set while the server did not answer: sent after
        # tags queued before it stopped answering, not sent (older than `_tags`: under them)
        self._queued_tags: dict[str, str] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=100_000)
        self._thread = threading.Thread(target=self._work, name="mlflow-logger", daemon=True)
        if self.remote_ok:
            self._thread.start()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        metrics = {k: float(v) for k, v in metrics.items()}
        fresh = {k: v for k, v in metrics.items() if step > self._local_max.get(k, -1)}
        with self._lock:
            if fresh and self.local_path:
                self.local_path.parent.mkdir(parents=True, exist_ok=True)
                with self.local_path.open("a") as f:
                    f.write(json.dumps({"step": int(step), "time": time.time(),
                                        "metrics": fresh}) + "\n")
                for k in fresh:
                    self._local_max[k] = int(step)
            if self.remote_ok:
                try:
                    self._queue.put_nowait((metrics, int(step), int(time.time() * 1000)))
                except queue.Full:
                    self._fail(RuntimeError("metric queue full (server too slow)"))
            elif self._retry_at is not None and time.monotonic() >= self._retry_at:
                self._probe()

    def _probe(self) -> None:
        """Queue one PROBE (the server asked again by the thread), unless one is queued."""
        if not self._probing and self.local_path and self._thread.is_alive():
            try:
                self._queue.put_nowait(PROBE)
                self._probing = True
            except queue.Full:
                pass

    def set_tags(self, tags: dict[str, object]) -> None:
        """Set tags on the run from the same thread, in order with the metrics (returns at
        once: the training loop never waits for the tracking server, not even for its
        first connection)."""
        tags = {k: str(v) for k, v in tags.items()}
        with self._lock:
            if not self.remote_ok:  # (kept: sent once the server answers again)
                self._tags.update(tags)
                return
        try:
            self._queue.put_nowait(tags)
        except queue.Full:
            self._fail(RuntimeError("metric queue full (server too slow)"))
            with self._lock:
                self._tags.update(tags)

    def sync(self) -> None:
        """In a bucket: write the local lines over the object (one PUT, never half a file)."""
        if self.mirror is not None:
            self.mirror.upload(self.local_path)

    def close(self, timeout: float = 15.0) -> None:
        """Flush what the server accepts within `timeout` seconds, then stop the thread. In a
        bucket: the lines are written over the object, and the local scratch copy removed."""
        self.sync()
        if self._thread.is_alive():
            with self._lock:
                if not self.remote_ok:  # asked once more: what the file holds, if it answers
                    self._probe()
            self._queue.put(None)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("MLflow logger did not flush within %.0f s; the rest of the metrics "
                            "are only in %s", timeout, self.mirror or self.local_path)
        if self.mirror is not None:
            shutil.rmtree(self.local_path.parent, ignore_errors=True)

    def _fail(self, err: Exception) -> None:
        with self._lock:
            self._probing = False  # (a PROBE in the drain that failed is not taken)
            if self.remote_ok:
                self.remote_ok = False
                warn_unreachable(self.uri, "logging metrics", err)  # (once an outage)
                self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S) \
                    if self._resending else self.retry_s
                self._retry_at = time.monotonic() + self._retry_delay
            self._resending = False

    def _work(self) -> None:
        from mlflow.entities import RunTag

        client = mlflow_client(self.uri)
        try:  # what an earlier process recorded while the server did not answer, and ended
            # before it answered again: sent first (the run's history is the file's)
            if self.local_path is not None and self._local_max:
                self._send(client, self._local_unsent(client))
        except Exception as err:  # noqa: BLE001 - (sent from the file when it answers again)
            self._fail(err)
        while True:
            items = [self._queue.get()]
            while not self._queue.empty() and len(items) < 200:  # batch what is waiting
                items.append(self._queue.get_nowait())
            stop = items[-1] is None or None in items
            batch, todo = [], list(filter(None, items))
            try:
                while todo:
                    item = todo[0]
                    if item == PROBE:
                        self._send(client, batch)
                        batch = []
                        self._recover(client)
                    elif not self.remote_ok:  # (metrics: in the local file, sent from there if
                        if isinstance(item, dict):  # the server answers; tags: kept for then,
                            with self._lock:  # a later one over an earlier one of its key
                                self._queued_tags.update(item)
                        todo.pop(0)
                        continue
                    elif isinstance(item, dict):  # tags (set_tags): sent with what is before
                        self._send(client, batch)
                        batch = []
                        try:  # a refused tag warns; it does not stop the metrics
                            client.log_batch(self.run_id, tags=[RunTag(k, v)
                                                                for k, v in item.items()])
                        except Exception as err:  # noqa: BLE001
                            if getattr(err, "error_code", None) != REJECTED:
                                raise  # the server gone (its tags kept, below)
                            warn_unreachable(self.uri, "setting tags", err)
                    else:
                        batch += self._unsent(client, *item)
                    todo.pop(0)
                self._send(client, batch)
            except Exception as err:  # noqa: BLE001 - never let tracking kill training
                with self._lock:  # the tags not sent: kept, sent when the server answers again
                    for item in todo:
                        if isinstance(item, dict):
                            self._queued_tags.update(item)
                self._fail(err)
            if stop:
                return

    def _unsent(self, client, metrics: dict, step: int, ts: int) -> list:
        """The metrics of one record the run does not have yet (a resumed process may log a
        step again), as MLflow Metric entities."""
        from mlflow.entities import Metric

        if self._logged is None:  # the keys the run has: one request
            self._logged = set(client.get_run(self.run_id).data.metrics)
        out = []
        for k, v in metrics.items():
            if k not in self._remote_max:  # a key's history: only a resumed run's keys have one
                hist = client.get_metric_history(self.run_id, k) if k in self._logged else []
                self._remote_max[k] = max((m.step for m in hist), default=-1)
            if step > self._remote_max[k]:
                out.append(Metric(k, float(v), ts, step))
                self._remote_max[k] = step
        return out

    def _recover(self, client) -> None:
        """Ask a server that failed whether it answers; if so, send what the local file
        recorded meanwhile and go on sending, else ask again later (twice as long)."""
        if self.remote_ok:
            self._probing = False
            return
        try:
            client.get_run(self.run_id)
        except Exception:  # noqa: BLE001 - still down: asked again later
            with self._lock:
                self._probing = False
                self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)
                self._retry_at = time.monotonic() + self._retry_delay
            return
        with self._lock:  # from here records are queued; those before are whole in the file
            self.remote_ok, self._probing, self._retry_at = True, False, None
            self._resending = True
            tags = {**self._queued_tags, **self._tags}
            self._queued_tags, self._tags = {}, {}
        # what the run holds, read again from the server (a batch that failed may have been
        # counted as sent, or sent in part)
        self._remote_max.clear()
        self._logged = None
        batch = self._local_unsent(client)
        try:
            self._send(client, batch)
            if tags:
                from mlflow.entities import RunTag

                try:
                    client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
                except Exception as err:  # noqa: BLE001
                    if getattr(err, "error_code", None) != REJECTED:
                        raise
                    warn_unreachable(self.uri, "setting tags", err)  # (refused: not kept)
                    tags = {}
        except Exception:
            with self._lock:
                self._queued_tags = {**tags, **self._queued_tags}
            raise
        with self._lock:
            self._resending = False
        forget_unreachable(self.uri)  # a later outage is warned about again
        log.warning("MLflow tracking at %s answers again: %d metric value(s) recorded while it "
                    "did not were sent from %s", redact_uri(self.uri), len(batch),
                    self.mirror or self.local_path)

    def _local_unsent(self, client) -> list:
        """The local file's records the run does not have yet, as MLflow Metric entities."""
        batch = []
        for rec in read_local_metrics(self.local_path):
            batch += self._unsent(client, rec["metrics"], int(rec["step"]),
                                  int(rec["time"] * 1000))
        return batch

    def _send(self, client, batch: list) -> None:
        for i in range(0, len(batch), 1000):
            client.log_batch(self.run_id, metrics=batch[i:i + 1000])
