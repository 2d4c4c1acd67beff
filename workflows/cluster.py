"""The cluster a workflow runs on: Ray started or joined, and the GPUs a run asks for checked
before any stage (this machine's before Ray starts, a cluster's while its autoscaler adds nodes),
and the training workers a local Ray, which never grows, can hold side by side.

Ray: with RAY_ADDRESS set (`ray job submit`, or a driver on a cluster node) `ray.init()` joins
that cluster; otherwise it starts a local Ray on this machine, its dashboard on a port from
`free_port` (also what the tests and benchmarks give the servers they start). A RAY_ADDRESS it
cannot join (the dashboard's http:// address, a head where nothing answers, a web server's
port) stops the command with one line naming it and the fix (`join_cluster`,
`storage.ray_join`).
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import time
from pathlib import Path

from storage import ray_join
from workflows.errors import SpecError
from workflows.run_spec import RunSpec

log = logging.getLogger("workflows")


def _quiet_console() -> None:
    """The console shows the project's stage lines, training progress and results; Ray
    Data's per-dataset INFO lines go only to ray-data.log in Ray's log folder, and its
    progress bars (carriage-return redraws) only appear on a terminal. Set before Ray starts:
    a local Ray's workers inherit the environment."""
    from preprocessing.console import quiet_ray_data

    quiet_ray_data()
    # MLflow's INFO lines (store set-up): its own env var for a fresh import, the level for an
    # MLflow already imported.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def start_ray(use_gpu: bool, small_data: bool) -> None:
    _quiet_console()
    import ray

    if small_data:  # the embedded corpus: a few parquet files, no need for footer actors
        os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
    if not ray.is_initialized():
        # RAY_ADDRESS set (job submission): join that cluster, no resource arguments
        # (docs/reference.md, Ray); otherwise a local Ray on this machine. Ray's own INFO
        # banner stays out of the console (its logs are in the session folder, named below).
        if os.environ.get("RAY_ADDRESS"):
            join_cluster(os.environ["RAY_ADDRESS"])
        elif ray_join.running_here():  # a `ray start` head here (a `ray up` cluster's):
            # ray.init joins it, and its own dashboard serves the state API (a port of ours,
            # `own_dashboard`, would name nothing there)
            ray.init(logging_level=logging.WARNING)
        else:
            ray_join.choose_local_ray_auth()
            ray.init(logging_level=logging.WARNING, **own_dashboard(), **ray_join.local_cpus())
    cpus, gpus = ray.cluster_resources().get("CPU", 0), ray.cluster_resources().get("GPU", 0)
    address = os.environ.get("RAY_ADDRESS")
    log.info("Ray: %s, %g CPUs, %g GPUs; Ray's own logs: %s",
             f"cluster {ray_join.shown(address)}" if address else "local instance"
             if ray_join.started_here() else "the Ray already running on this machine", cpus,
             gpus, ray_join.log_dir())


def join_cluster(address: str) -> None:
    """ray.init for RAY_ADDRESS (`ray job submit` sets it on the driver, or a user joining a
    cluster), through `storage.ray_join`: an address Ray cannot join is a SpecError
    (one line, exit 2) naming RAY_ADDRESS, its password hidden, and the fix."""
    try:
        ray_join.join(address, submit="python workflows/<task>.py ...")
    except ray_join.RayAddressError as err:
        raise SpecError(str(err)) from None


# How long a workflow on a cluster waits for the GPUs it asks for (the autoscaler adding
# nodes) before it stops with a message, instead of Ray Train waiting without end.
GPU_WAIT_S = float(os.environ.get("CONVS2S_GPU_WAIT_S", 900))


def _gpu_request(spec: RunSpec) -> int:
    """GPUs the training needs at once: one per Ray Train worker (`ScalingConfig`)."""
    return spec.num_workers if spec.use_gpu else 0


def check_local_gpus(spec: RunSpec) -> None:
    """A local run (no RAY_ADDRESS): the GPUs this machine has against the request, before Ray
    starts; too few is one `error:` line with the fix (exit 2)."""
    need = _gpu_request(spec)
    if not need or os.environ.get("RAY_ADDRESS") or ray_join.running_here():
        return  # (a cluster: `await_cluster_gpus`)
    import torch

    have = torch.cuda.device_count()
    if have < need:
        raise SpecError(
            f"--use-gpu with {spec.num_workers} worker(s) needs {need} GPU(s) (one per worker), "
            f"but this machine has {have}: " + (f"run with --num-workers {have}" if have
                                                else "run without --use-gpu (CPU)")
            + ", or submit the workflow to a GPU cluster (`ray job submit`)")


def await_cluster_gpus(spec: RunSpec) -> None:
    """On a cluster: wait (bounded, GPU_WAIT_S) until it has the GPUs the training asks for, as
    an autoscaler adds nodes; then stop with a message instead of a silent hang. The wait asks
    the autoscaler for them (`_GpuRequest`): an autoscaler adds nodes only for demand it sees,
    and waiting is none, so GPU node types with `min_workers: 0` (infra/cluster-aws.yaml) were
    never started. The request is withdrawn when the wait ends: the training's own request
    (Ray Train's, the same bundles) and placement group take over."""
    import ray

    need = _gpu_request(spec)
    if not need or ray_join.never_grows():
        return
    kind = spec.accelerator_type
    what = f"{kind} GPU" if kind else "GPU"
    deadline, request = time.monotonic() + GPU_WAIT_S, None
    try:
        while (have := gpus_of(ray.nodes(), kind)) < need:
            if request is None:
                request = _GpuRequest(spec, need)
                log.warning("the cluster has %g of the %d %ss training asks for: %swaiting up "
                            "to %.0f s", have, need, what, "asked its autoscaler for them, "
                            if request.send() else "", GPU_WAIT_S)
            else:
                request.send()  # (again every 20 s: the coordinator drops a request after 3 min)
            if time.monotonic() > deadline:
                raise SpecError(
                    f"the cluster has {have:g} {what}(s) after {GPU_WAIT_S:.0f} s but training "
                    f"asks for {need} ({spec.num_workers} worker(s) x 1 GPU): lower "
                    f"--num-workers to {int(have)} or raise the GPU node count the autoscaler "
                    "may start (max_workers of its GPU node type, infra/cluster-aws.yaml)"
                    if have else
                    f"the cluster has no {what} after {GPU_WAIT_S:.0f} s but --use-gpu asks for "
                    f"{need}: check that its config has "
                    + (f"a node type with the resource accelerator_type:{kind}" if kind
                       else "GPU worker nodes") + " (infra/cluster-aws.yaml)")
            time.sleep(min(10.0, max(0.1, deadline - time.monotonic())))
    finally:
        if request is not None:
            request.cancel()


class _GpuRequest:
    """The training's GPUs asked of the cluster's autoscaler while the workflow waits for them,
    through Ray's autoscaling coordinator: the actor Ray Train and Ray Data send their own
    requests through, which merges them into the one standing request the autoscaler reads
    (`request_resources`) and sends it again every 20 s, so a request made beside it lasted
    20 s at most. One bundle per worker, as Ray Train asks for and places them (its
    `ScalingConfig`, the GPU model's sliver included: nodes of that model only); sent again
    every 20 s (the coordinator drops a request 3 minutes after it was last sent), withdrawn
    by `cancel`. The coordinator is internal to Ray (Ray is pinned, pyproject.toml); where it
    cannot be reached, the wait goes on without a request, saying so once."""

    EXPIRE_S, AGAIN_S, ANSWER_S = 180.0, 20.0, 10.0

    def __init__(self, spec: RunSpec, need: int):
        import uuid

        self.requester = f"convs2s-gpus-{uuid.uuid4().hex}"
        self.coordinator, self.bundles, self.sent_at, self.failed = None, [], None, False
        try:
            from ray.data._internal.cluster_autoscaler import (
                get_or_create_autoscaling_coordinator,
            )
            from ray.train import ScalingConfig
            from ray.train._internal.autoscaling_coordinator_client import (
                build_train_resource_request,
            )

            self.bundles, self.selectors = build_train_resource_request(ScalingConfig(
                num_workers=need, use_gpu=True, accelerator_type=spec.accelerator_type,
                resources_per_worker={"CPU": spec.cpus_per_worker, "GPU": 1}), need)
            self.coordinator = get_or_create_autoscaling_coordinator()
        except Exception as err:  # noqa: BLE001 - a hint to the autoscaler, not the wait
            self._failed(err)

    def send(self) -> bool:
        """Ask (again, once AGAIN_S have passed since the last time); whether a request
        stands."""
        import ray

        if self.coordinator is None:
            return False
        if self.sent_at is not None and time.monotonic() - self.sent_at < self.AGAIN_S:
            return True
        try:
            ray.get(self.coordinator.request_resources.remote(
                requester_id=self.requester, resources=self.bundles,
                label_selectors=self.selectors, expire_after_s=self.EXPIRE_S),
                timeout=self.ANSWER_S)
            self.sent_at = time.monotonic()
            return True
        except Exception as err:  # noqa: BLE001
            self._failed(err)
            return self.sent_at is not None  # (an earlier one stands until it expires)

    def cancel(self) -> None:
        import ray

        if self.sent_at is None:
            return
        try:
            ray.get(self.coordinator.cancel_request.remote(self.requester),
                    timeout=self.ANSWER_S)
        except Exception as err:  # noqa: BLE001 - it expires EXPIRE_S after the last send
            self._failed(err)

    def _failed(self, err: Exception) -> None:
        if not self.failed:
            self.failed = True
            log.warning("could not ask the autoscaler for the GPUs (%s: %s): waiting for them "
                        "anyway", type(err).__name__, str(err).splitlines()[0][:200]
                        if str(err) else "")


def check_shared_storage(storage: str, tracking_uri: str | None = None) -> None:
    """On a cluster of several nodes, a local --storage-path must be one every node sees
    (NFS / EFS / a shared volume; `storage.ray_join.node_not_seeing`), and so must a sqlite
    tracking store's folder: rank 0's metrics and each node's system metrics are logged where
    the workers run, and a node that does not see the database made one of its own (the
    run's curves were never in the driver's). A SpecError names the first node that does not
    see it. A bucket URI is shared by nature (and was checked before Ray started); so is a
    tracking server."""
    from storage.ray_join import node_not_seeing

    if (unseen := node_not_seeing(storage)) is not None:
        raise SpecError(f"--storage-path {storage} is not shared: the node at {unseen[0]} "
                        "does not see it, so its workers could not read the data nor "
                        "resume from checkpoints; give a folder every node mounts "
                        "(NFS / EFS / a shared volume) or a bucket URI (s3://BUCKET/PREFIX)")
    if tracking_uri and tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        if (unseen := node_not_seeing(db.parent)) is not None:
            raise SpecError(
                f"--tracking-uri {tracking_uri} is a database on this node: the node at "
                f"{unseen[0]} does not see {db.parent}, so the training curves and system "
                "metrics its workers log would go to a database of their own; give a "
                "tracking server (--tracking-uri http://HOST:5000, infra/README.md) or a "
                "database in a folder every node mounts")


def own_dashboard() -> dict:
    """ray.init arguments for a local Ray whose processes find their own instance's state API.

    Ray Train's placement-group cleaner (it frees the CPUs / GPUs of a run whose controller
    died) asks Ray's state API, which looks the cluster up on this machine: with two local Ray
    instances (two workflows at once, or a workflow beside a test session) it finds several,
    prints a traceback and frees nothing. Naming the dashboard (the state API server) in
    RAY_API_SERVER_ADDRESS before Ray starts gives every process of this instance its own (a
    value inherited from another process names that process's Ray: replaced)."""
    port = free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"  # inherited by Ray
    return {"include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port}


def gpus_of(nodes: list[dict], accelerator_type: str | None = None) -> float:
    """GPUs of the alive nodes (`ray.nodes()`), only those of nodes whose GPU model is
    `accelerator_type` when given (Ray's `accelerator_type:<model>` node resource)."""
    return sum(n.get("Resources", {}).get("GPU", 0) for n in nodes if n.get("Alive")
               and (accelerator_type is None
                    or f"accelerator_type:{accelerator_type}" in n.get("Resources", {})))


def workers_fit(spec: RunSpec, nodes: list[dict]) -> int:
    """How many of `spec`'s training workers the alive nodes (`ray.nodes()`) hold side by side:
    each worker is one bundle of `cpus_per_worker` CPUs (+ 1 GPU, on a node of
    `accelerator_type` when given: convs2s/train/launch.py), and a bundle is placed on one
    node, so the count is per node."""
    total = 0
    for n in nodes:
        res = n.get("Resources", {})
        if not n.get("Alive"):
            continue
        # (+ 1e-9: 2 CPUs over 0.1 CPU a worker is 19.999...)
        fit = math.floor(res.get("CPU", 0) / spec.cpus_per_worker + 1e-9)
        if spec.use_gpu:
            fit = min(fit, math.floor(gpus_of([n], spec.accelerator_type)))
        total += fit
    return total


def no_room(spec: RunSpec, nodes: list[dict], subject: str, outcome: str, what: str) -> str:
    """The one line for training workers the alive nodes (`ray.nodes()`) of a local Ray cannot
    hold: `subject` N worker(s) of R, what this Ray has, `outcome`, and the fix for `what` (the
    workflow, the sweep)."""
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    cpus = sum(r.get("CPU", 0) for r in alive)
    kind_gpus, all_gpus = gpus_of(nodes, spec.accelerator_type), gpus_of(nodes)
    gpu = f"{spec.accelerator_type} GPU" if spec.accelerator_type else "GPU"
    has = f"{cpus:g} CPU(s)" + (f" and {kind_gpus:g} {gpu}(s)" if spec.use_gpu else "")
    worker = f"{spec.cpus_per_worker:g} CPU" + (f" + 1 {gpu}" if spec.use_gpu else "")
    if most := workers_fit(spec, nodes):
        fix = f"run with --num-workers {most}"
    elif spec.use_gpu and kind_gpus < 1:
        fix = ("leave --accelerator-type out" if spec.accelerator_type and all_gpus >= 1
               else "run without --use-gpu")
    else:  # a worker's CPUs alone outgrow every node
        largest = max((r.get("CPU", 0) for r in alive), default=0)
        fix = f"run with --set workflow.cpus_per_worker={largest:g} (or fewer)"
    return (f"{subject} {spec.num_workers} worker(s) of {worker}, but this machine's Ray has "
            f"{has}: {outcome}; {fix}, or submit {what} to a cluster (`ray job submit`)")


def check_local_room(spec: RunSpec) -> None:
    """A local Ray (started by this process: `ray_join.started_here`) never grows: training
    workers it cannot place side by side
    would be retried by Ray Train for CONVS2S_PLACEMENT_WAIT_S (15 minutes), a traceback a
    minute, before the run stops, and an evaluation task larger than its node would wait
    without end. One `error:` line now, with the fix (a cluster's autoscaler may add nodes:
    there the run waits, `await_cluster_gpus`)."""
    import ray

    if not ray_join.never_grows():
        return
    nodes = ray.nodes()
    if workers_fit(spec, nodes) < spec.num_workers:
        raise SpecError(no_room(spec, nodes, "training asks for",
                                "its workers could not start (a local Ray never grows; Ray "
                                "Train would retry for 15 minutes, then stop)", "the workflow"))
    check_local_eval_room(spec, nodes)


def check_local_eval_room(spec: RunSpec, nodes: list[dict] | None = None) -> None:
    """On a local Ray (`check_local_room`), an evaluation task larger than its node: one
    `error:` line with the fix (a sweep asks it of its base before any trial: inside a trial,
    a Ray Tune actor, a local Ray is not told from a cluster)."""
    import ray

    if not ray_join.never_grows():
        return
    nodes = ray.nodes() if nodes is None else nodes
    if (largest := ray_join.no_room_for(spec.eval_cpus, 0, nodes)) is not None:  # (Ray
        # would hold each evaluation task without end)
        raise SpecError(f"--set workflow.eval_cpus={spec.eval_cpus:g}: each evaluation task "
                        f"asks for {spec.eval_cpus:g} CPUs, but this machine's Ray has "
                        f"{largest[0]:g} (a local Ray never grows: the tasks would wait without "
                        f"end after the whole training run); run with --set "
                        f"workflow.eval_cpus={largest[0]:g} (or fewer)")


# --- ports for servers started on this machine -------------------------------------------------
#
# A port is free when it is picked, but the server binds it only seconds later. A port from
# `bind(("", 0))` comes from the kernel's ephemeral range, the range every other `bind(0)` and
# outgoing connection draws from; Ray alone binds dozens of such ports. In one CI run another
# process's gRPC server took the port picked for a test head's dashboard agent in that window
# (its health check read HTTP/2 bytes, "BadStatusLine"). Ports are therefore drawn at random
# below the ephemeral range and above Ray's worker ports, where nothing binds unless told to.
# Used for a local Ray's dashboard here, and by the tests' and benchmarks' servers.

RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default --min-worker-port .. --max-worker-port


def ephemeral_range() -> range:
    """The kernel's ephemeral ports (Linux: /proc/sys/net/ipv4/ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every address: a server may bind 0.0.0.0 or 127.0.0.1
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()  # every port free_port gave out in this process


def free_port(rng: random.Random | None = None) -> int:
    """A port no process holds now, outside the ephemeral range and Ray's worker ports, and
    never given out before by this process: a port is only held once its server binds it, so
    two picks in a row must not return one port twice. Falls back to a kernel-picked port
    where no such range exists."""
    rng = rng or random.SystemRandom()
    low, high = RAY_WORKER_PORTS.stop, ephemeral_range().start  # high: exclusive
    picks = (rng.randrange(low, high) for _ in range(200 if high - low >= 1000 else 0))
    port = next((p for p in picks if p not in _HANDED_OUT and _bindable(p)), 0)
    while not port:  # no room below the ephemeral range, or all 200 picks held
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        port = 0 if port in _HANDED_OUT else port
    _HANDED_OUT.add(port)
    return port
