"""Where evaluation tasks run: the CPUs each takes on an idle cluster (`share_cpus`), and a
task no node of a local Ray can hold, refused before it would wait without end (`_check_room`).
Used by `workflows.evaluation`."""

from __future__ import annotations

import dataclasses
import time


def share_cpus(jobs: list, node_cpus: list[float]) -> list:
    """The CPU jobs (`EvalJob`s without a GPU) with the largest equal whole number of CPUs
    (torch threads) that `node_cpus`, the free CPUs of each node, holds for all of them at once
    (a task runs on one node), where that is more than each asked for; other jobs as they are.
    One checkpoint scored on an idle 2-CPU machine then searches with 2 threads, not 1: 1.55x
    the sentences/s of a Multi30k model, the same hypotheses (docs/benchmarks.md, "evaluation
    tasks take the idle CPUs")."""
    cpu_jobs = [j for j in jobs if j.num_gpus == 0]
    whole = [int(c) for c in node_cpus if c >= 1]
    share = next((s for s in range(max(whole, default=0), 0, -1)
                  if sum(c // s for c in whole) >= len(cpu_jobs)), 0)
    return [dataclasses.replace(j, num_cpus=float(share))
            if j.num_gpus == 0 and share > j.num_cpus else j for j in jobs]


def _free_cpus_per_node(settle_s: float = 1.0) -> list[float]:
    """Each live node's CPUs, when none of the cluster's CPUs is taken (a workflow's evaluation
    after its training); [] while some are (a sweep's other trials): the jobs then keep what
    they asked for. The cluster's view of free CPUs trails tasks that have just ended (the
    raylets report to the GCS periodically): it is read again for up to `settle_s`."""
    import ray

    total = ray.cluster_resources().get("CPU", 0.0)
    deadline = time.monotonic() + settle_s
    while ray.available_resources().get("CPU", 0.0) < total:
        if time.monotonic() > deadline:
            return []
        time.sleep(0.05)
    if total == 0:
        return []
    return [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]


class NoRoomError(ValueError):
    """A task no node of a local Ray can hold: the message names it and the fix."""


def _check_room(needs: list[tuple[str, float, float]], nodes: list[dict]) -> None:
    """A local Ray (started here) never grows: a task asking for more CPUs or GPUs than any
    alive node of it (`ray.nodes()`) has would wait without end. `needs`: (what, CPUs, GPUs)
    of each task; a NoRoomError names the first that no node holds and the fix (on a cluster,
    its autoscaler may add the node: there the task waits, `ray_join.no_room_for`)."""
    from storage.ray_join import no_room_for

    for what, cpus, gpus in needs:
        if (largest := no_room_for(cpus, gpus, nodes)) is not None:
            raise NoRoomError(
                f"{what} asks for {cpus:g} CPU(s) and {gpus:g} GPU(s), but this machine's Ray "
                f"has {largest[0]:g} CPU(s) and {largest[1]:g} GPU(s): its task could not start "
                "(a local Ray never grows); give --num-cpus and --num-gpus that fit, or submit "
                "the job to a cluster (`ray job submit`)")
