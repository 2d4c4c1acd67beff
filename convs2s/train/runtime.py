"""Where a `Trainer` runs: its place in the world, its device, the checkpoint it resumes from and
where its checkpoints go. The Trainer asks a runtime for these and never a launcher itself, so the
same loop runs under Ray Train (`RayRuntime`, built in each Ray Train worker by
`convs2s.train.trainer.train_loop_per_worker`) and in one plain process or under torchrun
(`LocalRuntime`, `convs2s.train.local.fit_local`), where neither Ray nor MLflow need be installed.

    runtime.rank, runtime.world_size, runtime.local_rank, runtime.node_rank, runtime.device
    model = runtime.prepare_model(net, ddp)    # on the device; DDP when the world has > 1 rank
    with runtime.latest_checkpoint() as d:     # a checkpoint folder, or None: a fresh start
        ...
    runtime.report(metrics, folder, name)      # every rank, same update; rank 0 passes a folder

Both keep the checkpoints as `<run_dir>/checkpoint_<update>/` (the last `keep_last`; `best/` is the
Trainer's own copy) and resume from the latest, so a run started by one launcher is resumed by the
other and back. Ray Train keeps a record of its own (`RAY_RECORD`), reloaded by every `fit`, that
knows nothing of the checkpoints `LocalRuntime` wrote since: `fit` sets it aside where it no longer
describes the folder (`set_aside_stale_ray_record`), and `RayRuntime` resumes from the newer of
Ray's latest and the folder's newest (`newest_checkpoint`). In both runtimes rank 0 chooses and
every rank loads its choice (`load_agreed` checks that they did).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import torch
import torch.distributed as dist

from convs2s.console import worker_line
from convs2s.io.checkpoint import (META_FILE, CheckpointError, intact, list_checkpoints,
                                   load_checkpoint, read_info)
from convs2s.train.comm import Comm
from convs2s.train.job import RunRefused
from storage import location, publish_dir, remove_tree


def latest_kept(run_dir) -> str | None:
    """The run's latest complete `checkpoint_*` folder (a path, or a bucket URI that
    `load_checkpoint` fetches); None for a run that has none yet."""
    kept = list_checkpoints(run_dir) if run_dir.is_dir() else []
    return kept[-1].path if kept else None


# Ray Train's record of a run's reported checkpoints and its latest, in the run folder: every fit
# of the run reloads it, and hands the workers its latest (ray.train.get_checkpoint)
RAY_RECORD = "checkpoint_manager_snapshot.json"


def stale_ray_record(run_dir) -> str | None:
    """Why Ray Train's record of the run (`RAY_RECORD`) no longer describes the run folder, or
    None (no record, or one in a form this does not know: Ray Train judges that one). Stale
    where the run went on without Ray since (`LocalRuntime`, `python -m convs2s train`): a
    checkpoint it names is gone or not whole (its keep_last removed Ray's folders: Ray Train
    refuses to start on such a record), or its latest is older than the folder's newest (Ray
    Train would hand the workers that older one: the updates since lost, and their checkpoint
    names written again over newer states)."""
    run_dir = location(run_dir)
    record = run_dir / RAY_RECORD
    if not record.is_file():
        return None
    try:
        state = json.loads(record.read_text())
        named = [r["checkpoint_dir_name"] for r in state["checkpoint_results"]]
        latest = (state.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    kept = list_checkpoints(run_dir)
    by_name = {location(c.path).name: c for c in kept}
    gone = [n for n in dict.fromkeys(named + [latest] if latest else named) if n not in by_name]
    if gone:
        return (f"it names {', '.join(gone)}, no longer a whole checkpoint of the run (removed "
                "since, as a run of it without Ray removes the oldest)")
    if latest and (by_name[latest].update, by_name[latest].epoch) < \
            (kept[-1].update, kept[-1].epoch):
        return (f"its latest checkpoint is {latest} (update {by_name[latest].update}), the "
                f"run folder's newest {location(kept[-1].path).name} (update "
                f"{kept[-1].update}, written after the record: by a run of it without Ray, or "
                "as a run under Ray stopped before it recorded its last upload)")
    return None


def set_aside_stale_ray_record(run_dir, keep_last: int) -> str | None:
    """Ray Train's record of the run renamed `<RAY_RECORD>.stale-<UTC time>` where it is stale
    (`stale_ray_record`), so that Ray Train starts without one and the workers resume from the
    folder's newest checkpoint, as for a run started without Ray; returns why, or None where
    the record was kept. Ray Train removes the checkpoints beyond keep_last that its record
    names; without the record it never would: the oldest beyond `keep_last` are removed here,
    as `LocalRuntime.report` removes them."""
    why = stale_ray_record(run_dir)
    if why is None:
        return None
    run_dir = location(run_dir)
    record = run_dir / RAY_RECORD
    aside = run_dir / f"{RAY_RECORD}.stale-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    aside.write_bytes(record.read_bytes())  # (a bucket has no rename; kept to be read)
    record.unlink()
    for old in list_checkpoints(run_dir)[:-max(1, keep_last)]:
        remove_tree(old.path)
    return why


def newest_checkpoint(run_dir, ray_latest: str | None) -> str | None:
    """The checkpoint to resume from: the newer of Ray Train's latest (`ray_latest`, a folder
    name in `run_dir`; None where Ray has no record) and the run folder's newest complete one
    (`latest_kept`); None for a fresh start. Where they differ a line says which and why."""
    run_dir = location(run_dir)
    kept = list_checkpoints(run_dir) if run_dir.is_dir() else []
    newest = kept[-1] if kept else None
    if ray_latest is None:
        return newest.path if newest else None
    try:
        ray = read_info(run_dir / ray_latest)
    except (OSError, ValueError, KeyError):  # gone, or its meta.json unreadable
        ray = None
    if ray is None:
        chosen = newest
        why = "which is gone or unreadable"
    elif newest is None or (ray.update, ray.epoch) > (newest.update, newest.epoch):
        return ray.path  # (a listing of the folder behind: the record is newer)
    elif location(newest.path).name == ray_latest:
        return newest.path
    else:
        chosen = newest
        why = f"update {ray.update}; the folder's newest was written since, without Ray"
    worker_line(f"[convs2s.train] Ray Train's record of the run names {ray_latest} ({why}): "
                "resuming from " + (f"{location(chosen.path).name} (update {chosen.update})"
                                    if chosen else "the start (no checkpoint in the folder)"))
    return chosen.path if chosen else None


def chosen_by_rank_0(comm: Comm, run_dir, choose) -> str | None:
    """The checkpoint rank 0's `choose()` names (None: a fresh start), the same on every rank;
    a storage error listing `run_dir` is a CheckpointError on every rank (a collective)."""
    chosen, error = None, None
    if comm.rank == 0:
        try:
            chosen = _intact_or_older(run_dir, choose())
        except Exception as err:  # noqa: BLE001 - a storage error: every rank stops with it
            error = f"{run_dir}: its checkpoints could not be listed: {err}"
    chosen, error = comm.broadcast_object((chosen, error))
    if error is not None:
        raise CheckpointError(error)
    return chosen


def _intact_or_older(run_dir, chosen: str | None) -> str | None:
    """`chosen`, or where its checkpoint.pt is not the bytes its meta.json records (a disk or
    a power loss changed them: every rank's load failed, and the run could not resume though
    older checkpoints were whole) the newest older one that is, said in one line. None of them:
    `chosen`, whose load says what is wrong."""
    if chosen is None or intact(chosen):
        return chosen
    name, at = location(chosen).name, read_info(chosen)
    for older in reversed(list_checkpoints(run_dir)):
        if location(older.path).name != name and (older.update, older.epoch) <= \
                (at.update, at.epoch) and intact(older.path):
            worker_line(f"[convs2s.train] {name} is damaged (its checkpoint.pt is not the "
                        f"bytes its {META_FILE} records): resuming from "
                        f"{location(older.path).name} (update {older.update}); its later "
                        "updates are trained again")
            return older.path
    return chosen


class RayRuntime:
    """A Ray Train worker's runtime: rank and device from Ray Train's context, checkpoints
    reported to it (it keeps the last `CheckpointConfig.num_to_keep` and resumes from its
    latest after a worker or driver death)."""

    def __init__(self, run_dir):
        import ray.train
        import ray.train.torch

        self._train = ray.train
        self.run_dir = location(run_dir)
        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        self.local_rank, self.node_rank = ctx.get_local_rank(), ctx.get_node_rank()
        self.device = ray.train.torch.get_device()
        # (the process group Ray Train started) rank 0's choice of checkpoint, for every rank
        self.comm = Comm.create()

    def cpu_threads(self, job) -> int:
        """The CPUs Ray reserved for this worker (`TrainJob.cpus_per_worker`)."""
        return max(1, int(job.cpus_per_worker))

    def prepare_model(self, net: torch.nn.Module, ddp: dict | None = None) -> torch.nn.Module:
        """`net` on the device; DDP (with the keyword arguments `ddp`) when world > 1."""
        import ray.train.torch

        return ray.train.torch.prepare_model(net, parallel_strategy_kwargs=ddp or None)

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        """The newer of Ray Train's latest checkpoint of the run and `run_dir`'s newest complete
        `checkpoint_*` folder (`newest_checkpoint`: a run started, or gone on, without Ray),
        chosen by rank 0 and the same on every rank, as `LocalRuntime.latest_checkpoint`."""
        ckpt = self._train.get_checkpoint()  # (the same on every rank)
        yield chosen_by_rank_0(self.comm, self.run_dir, lambda: newest_checkpoint(
            self.run_dir, PurePosixPath(ckpt.path).name if ckpt is not None else None))

    def report(self, metrics: dict, folder: Path | None = None, name: str | None = None,
               background: bool = False) -> bool:
        """A barrier of every rank; rank 0's `folder` becomes checkpoint `name` of the run.
        `background`: the folder is uploaded to the run's storage by Ray Train's own thread,
        which deletes it after, while training goes on (a 2 GB checkpoint of the paper's En-Fr
        model at 200 MB/s held every GPU for ~10 s, the others waiting in their next
        all-reduce); returns whether the folder was handed over so (the caller must then
        neither change nor delete it). Ray Train uploads and registers checkpoints one at a
        time, in order (a resume takes the last registered), and its worker waits for the
        uploads when its training function returns; the Trainer hands over one at a time
        (`wait_until_gone`)."""
        checkpoint, mode = None, {}
        if folder is not None:
            checkpoint = self._train.Checkpoint.from_directory(str(folder))
            if background:
                from ray.train import CheckpointUploadMode

                mode = {"checkpoint_upload_mode": CheckpointUploadMode.ASYNC,
                        "delete_local_checkpoint_after_upload": True}
        self._train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=name, **mode)
        return bool(mode)


class StorageNotShared(RunRefused):
    """A rank's node does not see the run's data (local paths under a --storage-path that is
    not every node's): the same on a retry, so it ends the run as one line (returned by a Ray
    Train worker: convs2s.train.trainer.STOPPING_ERRORS)."""


def agree_on_storage(comm: Comm, config: dict) -> None:
    """A collective, before anything is read: every rank looks for the first file of each
    data split it reads (local paths; a bucket is every node's), and where one rank's node
    does not see its file, every rank raises StorageNotShared naming the first such rank, its
    host and the path. The driver asks the nodes there as the run starts
    (`workflows.cluster.check_shared_storage`); a node an autoscaler adds later is asked here,
    by the rank placed on it, which would otherwise fail its first read there, and Ray Train
    restart the group to fail the same way."""
    import socket

    from storage import is_uri

    paths = [f.paths[0] for f in (config["train_files"], config["valid_files"]) if f and f.paths]
    missing = next((p for p in paths if not is_uri(p) and not location(p).exists()), None)
    said = comm.gather_objects(None if missing is None else (socket.gethostname(), missing))
    failed = [(rank, s) for rank, s in enumerate(said) if s is not None]
    if failed:
        rank, (host, path) = failed[0]
        raise StorageNotShared(
            f"rank {rank} of {len(said)}, on {host}, does not see {path}: the run's data and "
            "checkpoints must be in storage every node sees (--storage-path: a folder every "
            "node mounts, NFS / EFS / a shared volume, or a bucket URI s3://BUCKET/PREFIX)")


def load_agreed(path, comm: Comm) -> dict | None:
    """The checkpoint at `path` (the one every rank was handed; None: a fresh start) loaded on
    every rank, or a CheckpointError on every rank when any could not read it, or when the
    ranks did not load the same one (a path or update of its own, or a fresh start beside a
    resume: weights and counters apart, and later a wait without end). A collective: the others
    would otherwise train on, to wait for it in their first all-reduce. A single process raises
    `load_checkpoint`'s own error.

    Where some ranks read it and the others found no such checkpoint (folders each node's
    own), or the ranks were handed different ones, the error is a ResumeRefused: a restart of
    the group would fail the same way, so Ray Train's workers return it
    (convs2s.train.trainer.STOPPING_ERRORS) rather than restart `max_failures` times. Any
    other failure stays a CheckpointError, which Ray Train retries (a store or a node's fetch
    that did not answer may answer the next time)."""
    from convs2s.train.resume import ResumeRefused

    if comm.world_size == 1:
        return None if path is None else load_checkpoint(path)
    state, error = None, None
    if path is not None:
        try:
            state = load_checkpoint(path)
        except Exception as err:  # noqa: BLE001 - said on every rank, below
            error = (str(path), f"{type(err).__name__}: {err}")
    where = None if path is None else str(path)
    update = None if state is None else int(state["update"])
    seen = comm.gather_objects((error, where, update))
    failed = [(rank, e) for rank, (e, _, _) in enumerate(seen) if e is not None]
    if failed:  # (the first failing rank's words on every rank: one message)
        rank, (where, first) = failed[0]
        # others could, and these found nothing there: the folder is not shared
        some = len(failed) < comm.world_size and all(
            e.startswith("FileNotFoundError:") for _, (_, e) in failed)
        raise (ResumeRefused if some else CheckpointError)(
            f"rank(s) {', '.join(str(r) for r, _ in failed)} of {comm.world_size} could not "
            f"read the checkpoint to resume from, {where} (rank {rank}: {first})" + (
                "; every rank resumes from the one rank 0 chose: give all of them the run "
                "folder (shared storage or a bucket)" if some else ""))
    if len({(w, u) for _, w, u in seen}) > 1:
        raise ResumeRefused(
            f"the {comm.world_size} ranks did not load the same checkpoint to resume from ("
            + "; ".join(f"rank {rank}: " + (f"{w}, update {u}" if w is not None else "none, "
                                             "a fresh start")
                        for rank, (_, w, u) in enumerate(seen))
            + "): every rank must resume from the one rank 0 chose")
    return state


def rank_device(device: str | torch.device | None, local_rank: int,
                local_world: int = 1) -> torch.device:
    """The device of the rank with `local_rank` of `local_world` ranks on its machine: its GPU
    when `device` is None and one is visible (else the CPU); a bare "cuda" (`--device cuda`)
    gets the rank's index, which `torch.cuda.set_device` needs (seen failing on an H200
    without it). One GPU named for several ranks of a machine (`--device cuda:0` under
    torchrun) is refused: every rank would take it, and NCCL fails on the duplicate GPU."""
    if device is None:
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", local_rank)
    if device.type == "cuda" and local_world > 1:
        raise ValueError(f"--device {device} names one GPU for each of the {local_world} ranks "
                         "on this machine: give --device cuda, or leave it out, for each rank's "
                         "own GPU (its LOCAL_RANK)")
    return device


class LocalRuntime:
    """One process, or one rank of a torchrun world (RANK / WORLD_SIZE / LOCAL_RANK in the
    environment: the process group is initialized here, nccl on CUDA, else gloo). Checkpoints
    are published into `run_dir` (local folder or bucket) by rank 0, each whole or absent
    (meta.json last), the oldest beyond `keep_last` removed; the latest complete one is the
    resume point."""

    def __init__(self, run_dir, keep_last: int, device: str | torch.device | None = None):
        self.run_dir = location(run_dir)
        self.keep_last = max(1, keep_last)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.node_rank = int(os.environ.get("GROUP_RANK", "0"))
        try:
            self.device = rank_device(device, self.local_rank,
                                      int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except RuntimeError as err:  # torch's own message for a device string it cannot parse
            raise ValueError(f"--device {device}: {err}") from None
        if self.device.type == "cuda":
            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if self.device.index >= visible:  # (else a traceback from inside torch.cuda)
                if device is None:  # each rank's own GPU: more ranks than GPUs here
                    raise ValueError(
                        f"LOCAL_RANK {self.local_rank}, but this process sees {visible} CUDA "
                        f"GPU(s): start at most {visible} ranks on this machine")
                raise ValueError(
                    f"--device {device}: this rank's GPU is {self.device} but " + (
                        f"this process sees {visible} CUDA GPU(s); leave --device out for "
                        "each rank's own GPU" if visible else
                        f"no CUDA GPU is visible here (torch {torch.__version__}); leave "
                        "--device out to train on the CPU"))
            torch.cuda.set_device(self.device)
        self._owns_group = self.world_size > 1 and not dist.is_initialized()
        if self._owns_group:
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        # the world's host-side agreements (the checkpoint to resume from, the barrier of a
        # report) over gloo: no NCCL collective waits on rank 0's storage
        self.comm = Comm.create()

    def close(self) -> None:
        """End the process group this runtime started (torchrun's ranks), if it did."""
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self._owns_group = False

    def cpu_threads(self, job) -> int:
        """The CPUs this process may use, shared by the ranks on this machine."""
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
        return max(1, usable // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))

    def prepare_model(self, net: torch.nn.Module, ddp: dict | None = None) -> torch.nn.Module:
        """`net` on the device; DDP (with the keyword arguments `ddp`) when world > 1."""
        net.to(self.device)
        if self.world_size == 1:
            return net
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(net, device_ids=ids, **(ddp or {}))

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        """Rank 0's latest complete checkpoint, the same on every rank (as Ray Train hands
        every worker its one choice): each rank listing `run_dir` itself could resume from
        another one, or from none, where that folder is each node's own."""
        yield chosen_by_rank_0(self.comm, self.run_dir, lambda: latest_kept(self.run_dir))

    def report(self, metrics: dict, folder: Path | None = None, name: str | None = None,
               background: bool = False) -> bool:
        """As RayRuntime.report, the folder always copied before it returns (`background` is
        not taken: returns False)."""
        if folder is not None and name:
            publish_dir(folder, self.run_dir / name, marker=META_FILE)
            kept = list_checkpoints(self.run_dir)
            # an epoch's end at an update already checkpointed supersedes that checkpoint (the
            # same weights): removed, so keep_last keeps as many states
            latest = kept[-1]
            superseded = [c for c in kept[:-1] if c.update == latest.update]
            kept = [c for c in kept if c not in superseded]
            for old in superseded + kept[:-self.keep_last]:
                remove_tree(old.path)
        self.comm.barrier()  # as Ray Train's report: no rank runs ahead of a checkpoint
        return False


def wait_until_gone(folder: Path | None, limit_s: float = 1800.0) -> float:
    """Wait until `folder` (a checkpoint handed to a background upload, which deletes it when
    done) no longer exists, at most `limit_s` seconds (an upload that failed leaves it: the
    failure reaches the run through Ray Train meanwhile); returns the seconds waited."""
    t0 = time.monotonic()
    while folder is not None and folder.exists() and time.monotonic() - t0 < limit_s:
        time.sleep(0.2)
    return time.monotonic() - t0


def quiet_reports() -> None:
    """Ray Train (2.60) logs every `ray.train.report` of every rank at INFO on a logger named
    after its source file, which `LoggingConfig` does not reach: two console lines per
    checkpoint. The workers' own progress lines say the same; keep those only."""
    try:
        from ray.train.v2._internal.execution import context as train_context

        logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    except ImportError:  # another Ray version: nothing to quiet
        pass
