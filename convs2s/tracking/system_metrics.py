"""CPU, memory, disk, network and GPU utilization of every node that trains, in the training
run's MLflow metrics: the first place to look when a cluster run is slow.

One sampler per node (the worker with local rank 0) runs MLflow's own `SystemMetricsMonitor`
in a background thread against the training run. Metric names carry the node:

    system/<node>/cpu_utilization_percentage      system/<node>/system_memory_usage_megabytes
    system/<node>/gpu_0_utilization_percentage    system/<node>/gpu_0_memory_usage_megabytes

where <node> is `node<node rank>` (Ray Train's node rank, or torchrun's: two Ray nodes on one host
stay apart), and the run's tag `convs2s.<node>.host` names its host (a key of the host's name
made every run's series its own: a cluster's pods and instances are named anew each time, and
runs on them never lined up in MLflow's compare view, nor a run resumed on new nodes with
itself; runs before 2026-12-07 have `system/node<rank>-<host>/...`). GPU metrics appear where
NVIDIA's management library sees a GPU (nvidia-ml-py).
A resumed run continues the steps after the last logged sample. `TrainJob.system_metrics_s`
sets the sampling interval; 0 turns sampling off (`--no-system-metrics` in the workflows).

    with node_metrics(tracking_uri, run_id, node_name(ctx), interval_s=10.0):
        ...train...
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator

from convs2s.tracking.redact import redact_mlflow_logs, redact_text


def node_name(node_rank: int) -> str:
    """The node's part of the metric names: `node<rank>`."""
    return f"node{node_rank}"


def host_tag(node: str) -> dict[str, str]:
    """The run's tag naming the host of `node` (`node_name`) this process runs on now."""
    return {f"convs2s.{node}.host": socket.gethostname() or "unknown"}


@contextlib.contextmanager
def node_metrics(tracking_uri: str | None, run_id: str | None, node: str,
                 interval_s: float) -> Iterator[None]:
    """Sample this node's system metrics into MLflow run `run_id` every `interval_s` seconds
    for the block; nothing when sampling is off (interval 0) or the run is untracked. A
    sampler that cannot start (no psutil, tracking unreachable) warns once and the block runs
    on: utilization figures never stop training.

    The sampler starts in a thread of its own: importing MLflow and reading the run's last
    logged step (to resume after it) take 1.5-2 s in a fresh worker process, and the other
    ranks would wait that long for this one at their first collective."""
    if not interval_s or interval_s <= 0 or not run_id or not tracking_uri:
        yield None
        return
    # MLflow's short HTTP timeouts, as RunLogger sets them on rank 0's node (the processes are
    # ours): on the other nodes MLflow's defaults (7 retries, 120 s each) held the end of
    # training for minutes where the server had gone
    from convs2s.tracking.runs import HTTP_ENV

    for k, v in HTTP_ENV.items():
        os.environ.setdefault(k, v)
    # MLflow's monitor says "Started monitoring ..." / "Skip logging GPU metrics ..." at INFO:
    # on a Ray worker that is a console line per node.
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    started: list = []
    lock, closed = threading.Lock(), threading.Event()

    def start() -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            redact_mlflow_logs()  # its warnings quote the tracking URI, password included

            monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s,
                                           samples_before_logging=1, resume_logging=True,
                                           node_id=node, tracking_uri=tracking_uri)
            with lock:  # a block that ended meanwhile gets no sampler left running after it
                if not closed.is_set():
                    monitor.start()
                    started.append(monitor)
            if started:  # which host this node is now (it may change when a run resumes)
                from convs2s.tracking.runs import set_tags

                set_tags(tracking_uri, run_id, host_tag(node))
        except Exception as err:  # noqa: BLE001 - utilization is an extra, never a failure
            logging.getLogger(__name__).warning(
                "system metrics of %s are off for this run (%s: %s)", node,
                type(err).__name__,
                redact_text(str(err).splitlines()[0])[:200] if str(err) else "")

    starter = threading.Thread(target=start, name="system-metrics-start", daemon=True)
    starter.start()
    try:
        yield None
    finally:
        # A block shorter than the start-up waits for it, so that the samples it took are
        # flushed; a start that hangs (an unreachable server past MLflow's HTTP timeouts) is
        # given up after STOP_WAIT_S and never starts sampling.
        starter.join(STOP_WAIT_S)
        with lock:
            closed.set()
            stopping = list(started)

        def finish() -> None:
            for monitor in stopping:
                with contextlib.suppress(Exception):  # (utilization: never a failure)
                    monitor.finish()  # stops the sampling thread, flushes what it sampled
        # (its flush to a server gone is given up after STOP_WAIT_S, not waited for)
        stopper = threading.Thread(target=finish, name="system-metrics-stop", daemon=True)
        stopper.start()
        stopper.join(STOP_WAIT_S)


# How long the end of a training block waits for a sampler still starting.
STOP_WAIT_S = 30.0
